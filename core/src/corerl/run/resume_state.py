"""What a resumed run had done: the checkpoint it resumes from and the state that checkpoint
recorded (each phase's steps, the task's position, the run loop's own: metrics lines, held-out
figures, evaluations); nothing for a new run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corerl.run.checkpoints import read_state


class ResumeState:
    """The checkpoint a run resumes from (``resume``: its global step and folder; None for a new
    run) and its ``state.json`` (``state``: empty for a new run), read once."""

    def __init__(self, resume: tuple[int, Path] | None) -> None:
        self.resume: tuple[int, Path] | None = resume
        self.state: dict[str, Any] = read_state(resume[1]) if resume else {}

    def steps_done(self, phase: str) -> int:
        """Steps of ``phase`` a resumed run had done (0 for a new run)."""
        return int(self.state.get("steps_done", {}).get(phase, 0))

    def after_warm_start(self) -> bool:
        """Whether the checkpoint was made after the SFT warm start ended (its held-out figure recorded)."""
        return "after_sft" in self.state.get("evals", {})

    def restore(self, training: Any, task: Any) -> None:
        """Load the checkpoint's policy training state into ``training`` and its task position into ``task``."""
        assert self.resume is not None
        training.load_checkpoint(str(self.resume[1] / "training"))
        task.set_state(self.state["task"])
