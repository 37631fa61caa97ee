"""TensorBoard event files under ``<run dir>/tensorboard`` (torch's SummaryWriter)."""

from __future__ import annotations

from corerl.reporting.loggers.contract import LoggerContext


class TensorBoardLogger:
    """Scalars and histograms through torch's ``SummaryWriter``."""

    def __init__(self, context: LoggerContext) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run writes a new event file; TensorBoard shows the later value of a step
        self._writer = SummaryWriter(log_dir=str(context.run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float | list[float]], step: int) -> None:
        for name, value in metrics.items():
            if isinstance(value, list):
                import numpy as np

                self._writer.add_histogram(name, np.asarray(value, dtype=np.float64), step)
            else:
                self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
