"""Per-step metrics, written to ``metrics.jsonl`` (one JSON object per line) and to
TensorBoard event files under ``<run dir>/tensorboard``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from corerl.complete_folders import write_file_whole

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends each step's metrics to the JSONL file and the TensorBoard writer."""

    def __init__(self, run_dir: Path, keep_lines: int | None = None, tensorboard: bool = True) -> None:
        """Open the log; ``keep_lines`` (a resumed run) cuts the JSONL back to that many lines,
        replacing the file whole (a kill midway leaves the old file or the new one, never a
        truncated one); ``tensorboard`` False writes no event files (``run.tensorboard``)."""
        self.path = run_dir / "metrics.jsonl"
        rewritten = run_dir / ".metrics.jsonl.partial"
        rewritten.unlink(missing_ok=True)  # a rewrite killed before its rename
        kept = self.path.read_text().splitlines() if self.path.exists() else []
        if keep_lines is not None and len(kept) < keep_lines:
            log.warning("%s holds %d rows and the checkpoint %d: the rows in between are lost", self.path,
                        len(kept), keep_lines)
        if keep_lines is not None and len(kept) > keep_lines:
            kept = kept[:keep_lines]
            write_file_whole(self.path, "".join(line + "\n" for line in kept), marker="metrics:rewrite")
        self.lines = len(kept)
        self._file = self.path.open("a")
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # a resumed run writes a new event file; TensorBoard shows the later value of a step
            self._writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def write(self, metrics: dict[str, Any], tb_step: int) -> None:
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()
        self.lines += 1
        if self._writer is None:
            return
        phase = metrics.get("phase", "run")
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step",):
                self._writer.add_scalar(f"{phase}/{key}", value, tb_step)
            elif isinstance(value, list) and value:  # one value per item (a step's staleness per group)
                import numpy as np

                self._writer.add_histogram(f"{phase}/{key}", np.asarray(value, dtype=np.float64), tb_step)
        self._writer.flush()

    def scalar(self, tag: str, value: float, tb_step: int) -> None:
        """One extra scalar (the held-out reward after a phase)."""
        if self._writer is None:
            return
        self._writer.add_scalar(tag, value, tb_step)
        self._writer.flush()

    def close(self) -> None:
        self._file.close()
        if self._writer is not None:
            self._writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every line of a ``metrics.jsonl``."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
