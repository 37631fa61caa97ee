"""What one run's steps are built from: a facade over services with one job each (resume state,
policy model and task, engines, frozen models, rollouts; modules of :mod:`corerl.run`). Opened and
started in-process at world size 1, a context drives one step of any algorithm in a fast-tier test
(``tests/test_algorithms.py``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.run.directory import resolve_model
from corerl.run.engines import Engines, value_model_start
from corerl.run.frozen_models import FrozenModels
from corerl.run.policy_model import PolicyModel, check_task_fits, image_encoder  # noqa: F401 (their old home)
from corerl.run.resume_state import ResumeState, open_run_directory
from corerl.run.rollouts import Rollouts

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection
    from corerl.generation.contract import GenerationEngine
    from corerl.offload import PhaseOffload, ReferenceOffload
    from corerl.plugin_manager import PluginHost
    from corerl.training.contract import TrainingEngine


class RunContext:
    """One run's services, the algorithm factory's :class:`~corerl.algorithms.contract.RunServices`
    (what an algorithm may use of it). Every attribute is set here, and written by no one else."""

    def __init__(self, config: Config, selection: Selection, console: Any, host: PluginHost,
                 run_dir: Path, resume: tuple[int, Path] | None) -> None:
        self.config, self.selection, self.console, self.host, self.run_dir = config, selection, console, host, run_dir
        self.resume_state = ResumeState(resume)
        self.model = PolicyModel(config, selection, run_dir)
        self.engines = Engines(config, selection, console)
        self.frozen = FrozenModels(config, selection, self.engines, self.model)
        self.rollouts = Rollouts(config, selection, host, console, self.engines, self.model, self.frozen)

    @classmethod
    def open(cls, config: Config, selection: Selection, console: Any, host: PluginHost,
             on_run_dir: Callable[[Path], None] | None = None) -> RunContext:
        """The run directory (:func:`~corerl.run.resume_state.open_run_directory`), model, tokenizer and task."""
        context = cls(config, selection, console, host, *open_run_directory(config, selection, console, host,
                                                                             on_run_dir))
        context.model.load()
        return context

    def load_model_and_task(self, model_path: str | None = None) -> None:
        """The model (or the Hugging Face folder ``model_path``, as it is), its tokenizer and the task."""
        self.model.load(model_path)

    def start_engines(self) -> None:
        """The policy's training engine, the generation engine and offload policy when the
        algorithm samples, and a resumed run's policy checkpoint and task state."""
        self.engines.start_policy(self.resumed_base(), self.model.path, self.run_dir)
        if self.resume is not None:
            self.resume_state.restore(self.engines.training, self.model.task)
            self.refit()

    def start_for_evaluation(self, folder: Path) -> None:
        """``corerl eval``'s engines for ``folder``: generation alone on a Hugging Face folder; on
        a run's checkpoint (the context's resume), training from it and generation refitted."""
        algorithm = self.selection.algorithm.registration
        if self.resume is not None and algorithm is not None and algorithm.warm_start and self.config.core.sft.enabled:
            self.model.start_from_warm_start()
        self.model.load(None if self.resume is not None else str(folder))
        self.engines.start_for_evaluation(self.model.path, self.resumed_base(), folder if self.resume else None)

    def resumed_base(self) -> str:
        """Where the policy's weights load from before a checkpoint (:meth:`PolicyModel.resumed_base`)."""
        return self.model.resumed_base(self.resume_state)

    def close(self, run_failed: bool) -> None:
        """Shut every started backend down, newest first (:meth:`Engines.close`)."""
        self.engines.close(run_failed)

    # -- read through to the services (RunServices' properties first) -------------------------
    @property
    def tokenizer(self) -> Any: return self.model.tokenizer
    @property
    def task(self) -> Any: return self.model.task
    @property
    def training(self) -> TrainingEngine: return self.engines.training
    @property
    def generation(self) -> GenerationEngine | None: return self.engines.generation
    @property
    def offload(self) -> PhaseOffload: return self.engines.offload
    @property
    def starting_weights(self) -> str: return self.model.starting_weights
    @property
    def resume(self) -> tuple[int, Path] | None: return self.resume_state.resume
    @property
    def state(self) -> dict[str, Any]: return self.resume_state.state
    @property
    def started(self) -> list[Any]: return self.engines.started
    @property
    def model_path(self) -> str: return self.model.path
    @property
    def warm_started(self) -> bool: return self.model.warm_started

    def start(self, registration: Any, path: str, training: Any = None, config: Config | None = None) -> Any:
        """Another engine, shut down with the run (:meth:`Engines.start`)."""
        return self.engines.start(registration, path, training, config)

    def refit(self) -> None:
        """Send the policy's weights to the generation engine (nothing when there is none)."""
        self.engines.refit()

    def rollout(self) -> Any:
        """The rollout stage the task's reward scores, built once (:meth:`Rollouts.rollout`)."""
        return self.rollouts.rollout()

    def training_rollout(self) -> Any:
        """The rollout training scores (:meth:`Rollouts.training_rollout`)."""
        return self.rollouts.training_rollout()

    def frozen_config(self, model_path: str, *, micro_batch_size: int | None = None, backend: str | None = None,
                      role: str | None = None, own_layout: Any = None, own_layout_key: str = "",
                      pool: str = "frozen") -> Config:
        """The config of a frozen model beside the policy (:meth:`FrozenModels.frozen_config`)."""
        return self.frozen.frozen_config(model_path, micro_batch_size=micro_batch_size, backend=backend, role=role,
                                         own_layout=own_layout, own_layout_key=own_layout_key, pool=pool)

    def start_reference(self) -> tuple[TrainingEngine, ReferenceOffload]:
        """A frozen copy of :attr:`starting_weights` and its offload (:meth:`FrozenModels.start_reference`)."""
        return self.frozen.start_reference()

    def resolve_model(self, model_name: str, *, key: str, folder: str) -> str:
        """``model_name`` as a Hugging Face folder (:func:`corerl.run.directory.resolve_model`)."""
        return resolve_model(model_name, self.run_dir, key=key, folder=folder)

    def steps_done(self, phase: str) -> int:
        """Steps of ``phase`` a resumed run had done (0 for a new run)."""
        return self.resume_state.steps_done(phase)

    def held_out_reward(self) -> float:
        """Mean held-out reward of greedy answers (:meth:`Rollouts.held_out_reward`)."""
        return self.rollouts.held_out_reward()

    # -- RunContext's methods outside RunServices before contract 2.16: kept one version -----------
    def value_model_start(self) -> str:
        """Deprecated (2.16): :func:`corerl.run.engines.value_model_start`."""
        _moved("value_model_start", "corerl.run.engines.value_model_start(model_path, run_dir)")
        return value_model_start(self.model.path, self.run_dir)

    def start_generation(self, registration: Any) -> Any:
        """Deprecated (2.16): :meth:`Engines.start_generation`."""
        _moved("start_generation", "context.engines.start_generation(registration, model_path)")
        return self.engines.start_generation(registration, self.model.path)

    def start_reward_scorer(self) -> Any:
        """Deprecated (2.16): :meth:`FrozenModels.start_reward_scorer`."""
        _moved("start_reward_scorer", "context.frozen.start_reward_scorer()")
        return self.frozen.start_reward_scorer()

    def start_environment(self, registration: Any, settings: Any) -> Any:
        """Deprecated (2.16): :meth:`Rollouts.start_environment`."""
        _moved("start_environment", "context.rollouts.start_environment(registration, settings)")
        return self.rollouts.start_environment(registration, settings)


def _moved(name: str, instead: str) -> None:
    warnings.warn(f"RunContext.{name} moved to a run service in contract 2.16: call {instead} (algorithms use "
                  "only RunServices)", DeprecationWarning, stacklevel=3)
