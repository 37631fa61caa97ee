"""Where a run starts from: its directory, opened new or resumed (:func:`open_run_directory`), and
what a resumed run had done: the checkpoint it resumes from and the state that checkpoint recorded
(each phase's steps, the task's position, the run loop's own: metrics lines, held-out figures,
evaluations); nothing for a new run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.run.checkpoints import read_state
from corerl.run.directory import make_run_dir

if TYPE_CHECKING:
    from corerl.config import Config


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


def open_run_directory(config: Config, selection: Any, console: Any, host: Any,
                       on_run_dir: Callable[[Path], None] | None = None) -> tuple[Path, tuple[int, Path] | None]:
    """The run directory (new, or resumed and checked) and the checkpoint to resume from;
    ``on_run_dir(run_dir)`` is called once the directory exists (the CLI's quiet terminal). What
    ``corerl validate`` checks of the machine is checked first, by the same function
    (:func:`corerl.run.inputs.check_run_inputs`: a resume's recipe included)."""
    from corerl.run.inputs import check_run_inputs
    from corerl.run.record import record_recipe

    check_run_inputs(config, selection, host)
    run_dir, resume = make_run_dir(config, console)
    console.print(f"run directory: [bold]{run_dir}[/]" + (f" (resuming from step {resume[0]})" if resume else ""))
    if on_run_dir is not None:
        on_run_dir(run_dir)
    if resume is None:
        record_recipe(run_dir, config)
    else:  # a checkpoint goes on under the settings it was made with (checked above), and is
        # refused, before anything reads it, if it would run code
        from corerl.checkpoint_safety import engines_checkpoint_globals, verify_folder

        verify_folder(resume[1], engines_checkpoint_globals(selection))
    return run_dir, resume
