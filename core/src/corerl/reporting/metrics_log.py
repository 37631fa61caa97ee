"""Per-step metrics, written to ``metrics.jsonl`` (one JSON object per line) and handed to the
run's experiment loggers (:mod:`corerl.reporting.loggers`: TensorBoard, W&B, MLflow)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corerl.complete_folders import write_file_whole
from corerl.reporting.phases import EVAL_PHASE, RECOVERY_PHASE

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends each step's metrics to the JSONL file and hands them to the experiment loggers."""

    def __init__(self, run_dir: Path, keep_lines: int | None = None, loggers: Sequence[Any] = ()) -> None:
        """Open the log; ``keep_lines`` (a resumed run) cuts the JSONL back to that many lines
        (and the ``recovery`` rows after them: :mod:`corerl.run.recovery`), replacing the file whole (a kill midway leaves the old file or the new one, never a
        truncated one); ``loggers`` are the started experiment loggers."""
        self.path = run_dir / "metrics.jsonl"
        rewritten = run_dir / ".metrics.jsonl.partial"
        rewritten.unlink(missing_ok=True)  # a rewrite killed before its rename
        kept = self.path.read_text().splitlines() if self.path.exists() else []
        if keep_lines is not None and len(kept) < keep_lines:
            log.warning("%s holds %d rows and the checkpoint %d: the rows in between are lost", self.path,
                        len(kept), keep_lines)
        if keep_lines is not None and len(kept) > keep_lines:
            # the steps after the checkpoint go; the recoveries after it stay (they happened)
            kept = kept[:keep_lines] + [line for line in kept[keep_lines:] if _is_recovery(line)]
            write_file_whole(self.path, "".join(line + "\n" for line in kept), marker="metrics:rewrite")
        self.lines = len(kept)
        self._file = self.path.open("a")
        self.loggers = list(loggers)

    def write(self, metrics: dict[str, Any], tb_step: int) -> None:
        """One step's metrics (with its ``phase`` and ``step``); ``tb_step`` counts every phase's steps."""
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()
        self.lines += 1
        if self.loggers:
            self._send(logged_metrics(metrics), tb_step)

    def scalar(self, tag: str, value: float, tb_step: int) -> None:
        """One extra scalar (the held-out reward after a phase)."""
        self._send({tag: value}, tb_step)

    def _send(self, metrics: dict[str, float | list[float]], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def close(self) -> None:
        """Close the file and end the loggers' runs; a second call does nothing."""
        if self._file.closed:
            return
        self._file.close()
        for logger in self.loggers:
            logger.close()


def _is_recovery(line: str) -> bool:
    return f'"phase": "{RECOVERY_PHASE}"' in line and json.loads(line).get("phase") == RECOVERY_PHASE


def logged_metrics(metrics: dict[str, Any]) -> dict[str, float | list[float]]:
    """A step's metrics as the loggers name them, ``<phase>/<metric>``: the numbers, and the
    non-empty lists (one value per item, such as a step's staleness per group)."""
    phase = metrics.get("phase", "run")
    named: dict[str, float | list[float]] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
            named[f"{phase}/{key}"] = value
        elif isinstance(value, list) and value:
            named[f"{phase}/{key}"] = [float(v) for v in value]
    return named


def latest_values(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The newest value of each number in ``rows`` under the names ``checkpointing.metric_name``
    takes: ``<phase>/<metric>`` as the loggers name it (``grpo/reward/mean``, ``eval/pass@4``),
    and for a training phase the bare ``<metric>`` too (``reward/mean``: the newest phase's)."""
    latest: dict[str, float] = {}
    for row in rows:
        prefix = f"{row.get('phase', 'run')}/"
        for name, value in logged_metrics(row).items():
            if not isinstance(value, list):
                latest[name] = float(value)
                if prefix != f"{EVAL_PHASE}/":
                    latest[name.removeprefix(prefix)] = float(value)
    return latest


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every line of a ``metrics.jsonl``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
