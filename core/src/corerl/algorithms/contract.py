"""What a registered algorithm provides to the run loop (:mod:`corerl.run.loop`), and what the run
provides to it.

An :class:`corerl.registry.Algorithm` registration's factory is called with the run's services,
:class:`RunServices` (the config, the task, the started training and generation engines, the
offload policy, the run directory, what a resumed run had done, and the engines an algorithm may
start beside the policy's) and returns an :class:`AlgorithmRun`. :class:`RunServices` lists all an
algorithm may use of the run; the run's :class:`corerl.run.context.RunContext` implements it (the
name an algorithm written to contract 2.14 or earlier types its factory's argument with). The run
loop knows algorithms only through this contract:

1. ``held_out()`` before training (and after an SFT warm start), then ``begin()`` once;
2. ``step()`` until ``algorithm.max_steps`` steps are done, each returning the step's metrics;
3. ``save(folder)`` / ``load(folder)`` with every checkpoint, for state it owns beyond the
   policy's (the policy's weights and optimizer are the run loop's);
4. ``held_out()`` at the end, then ``export(run_dir)`` for final outputs beyond ``final/``.

The run loop alone counts steps. ``done`` is set by the loop: from the checkpoint when a run
resumes (before the factory returns, through :meth:`RunServices.steps_done`), then one more after
each ``step()`` (:func:`corerl.run.steps.take_step`). An algorithm reads it (the step being taken
is ``done + 1``; its sampling seed is ``step_seed(seed, done)``) and never writes it: a ``step()``
that changes ``done`` stops the run at once, in one line naming the algorithm
(:class:`StepCountError`), as does one that returns a metric the loop writes itself
(:data:`LOOP_METRICS`). Before contract 2.10 such a step was counted twice.

Optional (contract 2.3): ``task_state()``, the task's position a checkpoint records (called
just before ``save``; without it, the task's own ``state()``). An algorithm that draws prompts
ahead of what it trained (asynchronous GRPO) gives the position before the prompts it has not
trained on yet, so that a resumed run generates them again and trains nothing twice.

The rollout (sampling, scoring) lives inside ``step()``: an algorithm that owns a multi-turn
rollout, or one that does not wait for generation, changes its own step, not the loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from corerl.errors import RegistrationError

if TYPE_CHECKING:
    from rich.console import Console
    from transformers import PreTrainedTokenizerBase

    from corerl.generation.contract import GenerationEngine, Sample, SamplingSettings
    from corerl.offload import PhaseOffload, ReferenceOffload
    from corerl.training.contract import TrainingEngine
    from corerl.training.recipe_config import RecipeConfig

#: the algorithm a recipe's ``sft`` section runs as a warm start before the algorithm it names
WARM_START = "sft"

#: the keys of a metrics.jsonl line the run loop writes itself; a step's metrics may not use them
LOOP_METRICS = ("phase", "step", "time/step")


@runtime_checkable
class AlgorithmRun(Protocol):
    """One algorithm over one run's engines (what an :class:`~corerl.registry.Algorithm`
    registration's factory returns).

    ``name`` is the phase name in metrics.jsonl, the progress bar and checkpoints (the
    registration's id); ``total`` the steps it runs; ``done`` the steps already done (a resumed
    run starts there), set by the run loop alone: read it, never write it (see the module's
    docstring); ``measure`` the first key of what :meth:`held_out` returns, the figure the run
    reports before and after training (``reward``, ``preference_accuracy``).
    """

    name: str
    total: int
    done: int
    measure: str

    def begin(self) -> None:
        """Build what the steps need beyond the policy and generation engines (a frozen
        reference, a critic); called once, after any warm start, before the first step."""

    def step(self) -> dict[str, float]:
        """One step (its rollout included): the step's metrics, ``loss`` among them. The step
        taken is ``done + 1``; the run loop counts it once this returns."""

    def held_out(self) -> dict[str, float]:
        """Held-out figures of the current weights, :attr:`measure` first."""

    def save(self, folder: Path) -> None:
        """Write the state this algorithm owns beyond the policy into a checkpoint ``folder``."""

    def load(self, folder: Path) -> None:
        """Read back what :meth:`save` wrote (a resumed run, before :meth:`begin`)."""

    def export(self, run_dir: Path) -> list[str]:
        """Write final outputs beyond the policy's ``final/`` (a critic's); each as the run's
        last line names it (its path, and what it is)."""


# -- the run's services as an algorithm sees them: the run builds each from the layers above this
# one (a recipe's config, the selection, the plugin host, tasks, rollouts), and these protocols
# name only what an algorithm reads of them ------------------------------------------------------


class EngineRegistration(Protocol):
    """A training or generation backend's registration, as an algorithm hands it to
    :meth:`RunServices.start` (:class:`corerl.registry.TrainingBackend` and
    :class:`corerl.registry.GenerationBackend` are ones)."""

    @property
    def id(self) -> str:
        """The backend's id (``policy.training_backend``, ``policy.generation.backend``)."""

    @property
    def plugin(self) -> str:
        """The plugin that registered it."""


class SelectedComponent(Protocol):
    """One component the config selected: its id (None when the feature is off) and registration."""

    @property
    def id(self) -> str | None:
        """The selected id."""

    @property
    def registration(self) -> EngineRegistration | None:
        """Its registration (None when nothing is selected)."""


class RunSelection(Protocol):
    """What an algorithm reads of the components the config selected
    (:class:`corerl.config.selection.Selection` is one)."""

    @property
    def training_backend(self) -> SelectedComponent:
        """The policy's training backend."""

    @property
    def generation_backend(self) -> SelectedComponent:
        """The generation backend."""

    @property
    def critic_backend(self) -> SelectedComponent | None:
        """The critic's training backend (None unless the algorithm trains a critic)."""

    @property
    def critic_config(self) -> RecipeConfig | None:
        """The config the critic's engine is built from (None without a critic)."""


class BackendRegistrations(Protocol):
    """The installed registrations of one kind, by id."""

    def get(self, id: str) -> EngineRegistration | None:
        """The registration ``id`` names, or None."""

    def ids(self) -> list[str]:
        """Every installed id."""


class InstalledPlugins(Protocol):
    """What an algorithm reads of the installed plugins (:class:`corerl.plugin_manager.PluginHost` is one)."""

    @property
    def training_backends(self) -> BackendRegistrations:
        """The installed training backends (a teacher's backend is looked up here)."""


class PromptTask(Protocol):
    """A task of prompts and rewards (:class:`corerl.tasks.TaskSource` is one)."""

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        """``count`` training prompts (token ids) and the example each came from."""

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        """The held-out prompts and their examples."""

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        """``count`` (prompt, answer) pairs to imitate (the SFT warm start's)."""

    def reward(self, sample: Sample, example: Any) -> float:
        """The reward of one sample of ``example``'s prompt."""

    def state(self) -> Any:
        """Where the task is (a checkpoint records it)."""

    def set_state(self, state: Any) -> None:
        """Go back to what :meth:`state` returned."""


class PairTask(Protocol):
    """A task of preference pairs (:class:`corerl.tasks.preferences.PreferenceSource` is one),
    each a :class:`corerl.tasks.preferences.PreferencePair`."""

    def train_pairs(self) -> Sequence[Any]:
        """Every training pair."""

    def draw(self, count: int) -> list[int]:
        """The indices of the next ``count`` training pairs."""

    def held_out_pairs(self) -> list[Any]:
        """The held-out pairs."""

    def state(self) -> Any:
        """Where the task is (a checkpoint records it)."""

    def set_state(self, state: Any) -> None:
        """Go back to what :meth:`state` returned."""


class ScoredSamples(Protocol):
    """What a rollout stage returns (:class:`corerl.environments.rollout.Rollout` is one)."""

    @property
    def groups(self) -> list[list[Sample]]:
        """The samples of each prompt."""

    @property
    def rewards(self) -> list[list[float]]:
        """Each sample's reward, as ``groups``."""

    @property
    def metrics(self) -> dict[str, float]:
        """The rollout's own metrics (an environment's turns, tool calls)."""


class RolloutStage(Protocol):
    """What :meth:`RunServices.rollout` and :meth:`RunServices.training_rollout` return: prompts
    in, scored samples out (one turn scored by the task's reward, episodes against an environment,
    an agent harness, or the same samples rescored by a reward model)."""

    def run(self, prompts: Sequence[Sequence[int]], items: Sequence[Any], sampling: SamplingSettings, n: int,
            max_seq_length: int) -> ScoredSamples:
        """``n`` samples per prompt (``items``: the example each prompt came from), each cut to
        ``max_seq_length`` tokens in all, and their rewards."""


@runtime_checkable
class RunServices(Protocol):
    """What a run provides to its algorithm: everything an algorithm may use of the run, handed to
    the registration's factory (the run's :class:`corerl.run.context.RunContext` implements it).

    The attributes are the run's, set before the factory is called: an algorithm reads them and
    never assigns them. The methods start what an algorithm adds beside the policy's engines (a
    frozen reference, a critic, a teacher), each shut down with the run.
    """

    @property
    def config(self) -> RecipeConfig:
        """The run's validated config; an algorithm's own section is ``config.section("algorithm.<id>")``."""

    @property
    def selection(self) -> RunSelection:
        """The components the config selected: each backend's registration (``training_backend``,
        ``generation_backend``, ``critic_backend``), and the critic's config (``critic_config``)."""

    @property
    def host(self) -> InstalledPlugins:
        """The installed plugins' registrations (a teacher's training backend is looked up here)."""

    @property
    def console(self) -> Console:
        """The run's terminal (``print``, ``status``): a quiet one in tests and under ``--quiet``."""

    @property
    def run_dir(self) -> Path:
        """The run directory: where an algorithm writes what it builds once (a critic's starting
        weights, precomputed reference scores); a resumed run finds them there."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer (its chat template, if the recipe sets one, applied)."""

    @property
    def task(self) -> PromptTask | PairTask:
        """The task (``data.task``): prompts and rewards (:class:`PromptTask`) or preference
        pairs (:class:`PairTask`), as the
        registration's ``consumes`` says; positioned where a resumed run left it."""

    @property
    def training(self) -> TrainingEngine:
        """The policy's training engine, started, with a resumed run's checkpoint loaded (a value
        engine in the policy's place for an algorithm registered with ``value_model``)."""

    @property
    def generation(self) -> GenerationEngine | None:
        """The generation engine, holding the policy's weights (None for an algorithm that samples nothing)."""

    @property
    def offload(self) -> PhaseOffload:
        """The offload policy: call ``before_generation``, ``before_training``, ``before_refit``
        and ``after_refit`` at the step's phase boundaries."""

    @property
    def starting_weights(self) -> str:
        """The checkpoint the algorithm starts from: the SFT warm start's when one ran, else the model."""

    def resolve_model(self, model_name: str, *, key: str, folder: str) -> str:
        """``model_name`` (a recipe's model other than the policy's: a teacher) as a Hugging Face
        checkpoint folder: a ``builtin:`` model built once into the run directory's ``folder``, a
        GGUF file converted once; refused in one line naming ``key`` when it cannot be resolved."""

    def steps_done(self, phase: str) -> int:
        """Steps of ``phase`` a resumed run had done (0 for a new run)."""

    def held_out_reward(self) -> float:
        """Mean held-out reward of greedy answers from the generation engine."""

    def refit(self) -> None:
        """Send the policy's weights to the generation engine (nothing when there is none)."""

    def rollout(self) -> RolloutStage:
        """The rollout stage the task's reward scores (with ``data.env_name``, episodes against
        that environment), built once per run: held-out figures use it."""

    def training_rollout(self) -> RolloutStage:
        """The rollout training scores: :meth:`rollout`, or with ``reward_model.kind`` the same
        samples rescored by the reward model or judge."""

    def start(self, registration: EngineRegistration, path: str, training: Any = None,
              config: RecipeConfig | None = None) -> Any:
        """Another engine: ``registration``'s backend built from ``config`` (default the run's),
        checked against its contract and loaded with ``path``; shut down with the run."""

    def start_reference(self) -> tuple[TrainingEngine, ReferenceOffload]:
        """A frozen copy of :attr:`starting_weights` on the policy's backend, and its offload."""

    def frozen_config(self, model_path: str, *, micro_batch_size: int | None = None, backend: str | None = None,
                      role: str | None = None, own_layout: Any = None, own_layout_key: str = "",
                      pool: str = "frozen") -> RecipeConfig:
        """The config of a frozen model beside the policy (a teacher, a reward model) for :meth:`start`:
        the policy's, with ``model_path``, no adapter, ``micro_batch_size`` rows per scoring forward
        and training ``backend`` (unset: the policy's), in ``role`` (unset: the run's); with
        ``own_layout`` (``policy`` and ``cluster`` keys, named ``own_layout_key`` in errors) laid
        over the recipe first, its ranks in a Ray placement ``pool`` of their own."""


class AlgorithmBase:
    """Defaults for an :class:`AlgorithmRun`: held-out reward of greedy answers, no state of its
    own, nothing to export. Subclasses set :attr:`name` and implement :meth:`step`; ``done``
    starts at the steps a resumed run had done and is the run loop's to advance."""

    name = "algorithm"
    measure = "reward"

    def __init__(self, context: RunServices) -> None:
        self.context = context
        self.total = context.config.core.algorithm.max_steps
        self.done = context.steps_done(self.name)

    def begin(self) -> None:
        return None

    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def held_out(self) -> dict[str, float]:
        return {"reward": self.context.held_out_reward()}

    def save(self, folder: Path) -> None:
        return None

    def load(self, folder: Path) -> None:
        return None

    def task_state(self) -> Any:
        return self.context.task.state()

    def export(self, run_dir: Path) -> list[str]:
        return []


class StepCountError(RegistrationError):
    """An algorithm's ``step()`` changed its step counter, or wrote a metric the run loop writes."""


def _who(phase: Any, registration: Any) -> str:
    kind = type(phase)
    plugin = getattr(registration, "plugin", None)
    where = f"plugin {plugin!r}, " if plugin else ""
    return f"algorithm {phase.name!r} ({where}{kind.__module__}.{kind.__qualname__})"


def check_step_counter(phase: Any, before: int, registration: Any = None) -> None:
    """Raise :class:`StepCountError` when ``phase.done`` is no longer ``before`` after its
    ``step()``: the run loop alone counts steps (``registration`` names the plugin)."""
    if phase.done != before:
        raise StepCountError(
            f"{_who(phase, registration)} changed its step counter inside step(): done went from {before} to "
            f"{phase.done}, and the run loop alone counts steps (it adds 1 after each step)",
            hint="remove the assignment to done from step(); read done for the steps already taken "
                 "(the step being taken is done + 1)")


def check_step_metrics(phase: Any, metrics: Any, registration: Any = None) -> None:
    """Raise :class:`StepCountError` when a step returned no metrics dict, or one with a key the
    run loop writes itself (:data:`LOOP_METRICS`)."""
    if not isinstance(metrics, dict):
        raise StepCountError(f"{_who(phase, registration)} returned {type(metrics).__name__} from step(), "
                             "not a dict of metrics", hint="return the step's metrics, loss among them")
    taken = [key for key in LOOP_METRICS if key in metrics]
    if taken:
        raise StepCountError(f"{_who(phase, registration)} returned the metric {taken[0]!r} from step(), a key the "
                             f"run loop writes itself ({', '.join(LOOP_METRICS)})",
                             hint=f"rename it (e.g. {phase.name}/{taken[0]})")
