"""Starting the experiment loggers a recipe switches on (``logger.<id>.enabled``), each from its
registration: one that cannot start stops the run in one line naming its key, or, marked
``logger.<id>.optional``, is reported in one line and left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corerl.errors import RunError
from corerl.reporting.loggers.contract import LoggerContext

#: the package each of the core's loggers needs, and the extra that installs it
_PACKAGES = {"wandb": "corerl[wandb]", "mlflow": "corerl[mlflow]"}


def start_loggers(config: Any, host: Any, run_dir: Path, resumed: bool, warn: Any) -> list[Any]:
    """The started loggers of the recipe (by id); ``warn(line)`` reports an optional
    logger that could not start."""
    started = []
    params = flat_params(config.raw)
    for registration in host.loggers:
        section = f"logger.{registration.id}"
        settings = config.section(section)
        if settings is None or not settings.enabled or not _legacy_switch(config, registration.id):
            continue
        context = LoggerContext(run_dir=run_dir, run_name=run_dir.name, params=params, settings=settings,
                                resumed=resumed)
        try:
            started.append(registration.load()(context))
        except Exception as exc:  # noqa: BLE001 - reported in one line; optional or not is the recipe's choice
            problem = _problem(exc)
            if not settings.optional:
                raise RunError(f"the {registration.id} logger could not start: {problem}", key=f"{section}.enabled",
                               hint=f"fix that, set {section}.optional=true to run without it, or "
                                    f"{section}.enabled=false") from exc
            warn(f"{section}.enabled: the {registration.id} logger could not start ({problem}); running without it "
                 f"({section}.optional=true)")
    return started


def flat_params(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A recipe tree as ``key.path -> value`` (lists kept whole)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, path + "."))
        else:
            flat[path] = value
    return flat


def _legacy_switch(config: Any, logger_id: str) -> bool:
    """``run.tensorboard: false`` (before loggers were plugins) still switches TensorBoard off."""
    return logger_id != "tensorboard" or config.core.run.tensorboard


def _problem(exc: Exception) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        extra = _PACKAGES.get(top)
        return f"the {top} package is not installed" + (f" (pip install '{extra}')" if extra else "")
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
