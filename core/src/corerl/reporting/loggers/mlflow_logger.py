"""MLflow (the ``mlflow`` client): NeMo RL's ``logger.mlflow`` keys. Without a tracking URI the
run records into ``<run dir>/mlflow.db`` (a SQLite store; MLflow's file store is retired)."""

from __future__ import annotations

from corerl.reporting.loggers.contract import LoggerContext
from corerl.reporting.loggers.settings import MlflowSettings

#: where a resumed run finds the MLflow run it continues
RUN_ID_FILE = ".mlflow_run_id"
#: MLflow's limit on a parameter's value (longer values are cut, with a marker)
_PARAM_CHARS = 6000


class MlflowLogger:
    """One MLflow run per corerl run: the recipe as parameters, each step's scalars as metrics."""

    def __init__(self, context: LoggerContext) -> None:
        import os

        from mlflow.tracking import MlflowClient

        settings: MlflowSettings = context.settings
        uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{context.run_dir / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(settings.experiment_name)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self._client.create_experiment(settings.experiment_name))
        id_file = context.run_dir / RUN_ID_FILE
        if context.resumed and id_file.exists():  # a resumed corerl run continues its MLflow run
            self.run_id = id_file.read_text().strip()
            self._client.update_run(self.run_id, status="RUNNING")
            return
        run = self._client.create_run(experiment_id, run_name=settings.run_name or context.run_name)
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id + "\n")
        from mlflow.entities import Param

        params = [Param(key, _param_text(value)) for key, value in context.params.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self._client.log_batch(self.run_id, params=params[start:start + 100])

    def log(self, metrics: dict[str, float | list[float]], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        scalars = [Metric(name, float(value), now, step) for name, value in metrics.items() if not isinstance(value, list)]
        if scalars:
            self._client.log_batch(self.run_id, metrics=scalars)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _param_text(value: object) -> str:
    text = str(value)
    return text if len(text) <= _PARAM_CHARS else text[: _PARAM_CHARS - 3] + "..."
