"""Weights & Biases (the ``wandb`` client): NeMo RL's ``logger.wandb`` keys, plus ``mode``
(``offline`` writes the run under ``<run dir>/wandb`` for a later ``wandb sync``)."""

from __future__ import annotations

from corerl.reporting.loggers.contract import LoggerContext
from corerl.reporting.loggers.settings import WandbSettings

#: where a resumed run finds the W&B run it continues
RUN_ID_FILE = ".wandb_run_id"


class WandbLogger:
    """One W&B run per corerl run; a resumed corerl run continues the same W&B run."""

    def __init__(self, context: LoggerContext) -> None:
        import wandb

        settings: WandbSettings = context.settings
        id_file = context.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if context.resumed and id_file.exists() else None
        self._run = wandb.init(
            project=settings.project, name=settings.name or context.run_name, entity=settings.entity,
            group=settings.group, tags=settings.tags or None, mode=settings.mode, dir=str(context.run_dir),
            config=context.params, id=run_id, resume="allow" if run_id else None,
            settings=wandb.Settings(console="off", silent=True),
        )
        id_file.write_text(self._run.id + "\n")
        self._last_step = -1

    def log(self, metrics: dict[str, float | list[float]], step: int) -> None:
        import wandb

        if step <= self._last_step:  # W&B keeps steps increasing: a resumed run's repeated steps are dropped
            return
        self._last_step = step
        self._run.log({name: wandb.Histogram(value) if isinstance(value, list) else value
                       for name, value in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()
