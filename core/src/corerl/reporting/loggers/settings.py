"""The sections of the core's loggers (``logger.tensorboard``, ``logger.wandb``,
``logger.mlflow``), apart from the loggers so that registering them imports only attrs."""

from __future__ import annotations

from typing import Literal

import attrs

from corerl.config.fields import setting
from corerl.reporting.loggers.contract import LoggerSettings


@attrs.define(kw_only=True)
class TensorBoardSettings(LoggerSettings):
    """``logger.tensorboard``: on by default; its files are always in the run directory."""

    enabled: bool = setting(True, help="write TensorBoard event files in <run dir>/tensorboard")


@attrs.define(kw_only=True)
class WandbSettings(LoggerSettings):
    """``logger.wandb``: the W&B project and run; the login is W&B's own (``wandb login`` or
    ``WANDB_API_KEY``)."""

    project: str = setting("corerl", help="the W&B project")
    name: str | None = setting(None, help="the W&B run's name; unset: the run directory's name")
    entity: str | None = setting(None, help="the W&B team or user; unset: the login's default")
    group: str | None = setting(None, help="groups runs in the W&B interface")
    tags: list[str] = setting([], help="tags of the W&B run")
    mode: Literal["online", "offline", "disabled"] | None = setting(
        None, help="online: send as it runs; offline: write under <run dir>/wandb (wandb sync sends it later); "
                   "unset: W&B's own choice (WANDB_MODE, else online)")


@attrs.define(kw_only=True)
class MlflowSettings(LoggerSettings):
    """``logger.mlflow``: the experiment and run, and where they are recorded."""

    experiment_name: str = setting("corerl", help="the MLflow experiment")
    run_name: str | None = setting(None, help="the MLflow run's name; unset: the run directory's name")
    tracking_uri: str | None = setting(None, help="the tracking server or store (http://host:5000, sqlite:///file); "
                                                  "unset: MLFLOW_TRACKING_URI, else sqlite:///<run dir>/mlflow.db")
