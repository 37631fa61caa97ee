"""The algorithm conformance suite: subclass :class:`AlgorithmConformance`.

Any registered algorithm runs the same checks, in this process, on the built-in tiny model
(``builtin:tiny-qwen2``, world size 1, the ``hf`` generation backend, no Ray)::

    import corerl_myalgo.plugin
    from corerl.testing.algorithm_conformance import AlgorithmConformance

    class TestMyAlgorithm(AlgorithmConformance):
        algorithm_id = "myalgo"
        plugin = corerl_myalgo.plugin          # None: the installed plugins are discovered
        recipe = {"algorithm": {"myalgo": {"beta": 0.1}}}

The suite drives the algorithm with the run loop's own functions (:mod:`corerl.run.steps`):
the factory called with a :class:`~corerl.run.context.RunContext` (the run's
:class:`~corerl.algorithms.contract.RunServices`), ``held_out()``, ``begin()``, steps counted by
the loop, a checkpoint, a run resumed from it. It imports the run layer on purpose: what it checks
is the algorithm inside the very run code a run executes, not a copy of it. The checks:

(a) the factory's object is an :class:`~corerl.algorithms.contract.AlgorithmRun` named after its
    registration, with ``total`` the recipe's steps and ``done`` 0 on a new run;
(b) ``held_out()`` gives finite numbers, :attr:`measure` first;
(c) one step returns a dict of numbers (or lists of numbers) with a finite ``loss``;
(d) the step counter is the run loop's: no step changes ``done``, and a resumed run's algorithm
    starts at the checkpoint's step and keeps it through ``begin()``;
(e) save after the first step, load into a fresh context, continue: the metrics of the later
    steps and the policy's weights equal those of the same steps run straight through.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest


@contextlib.contextmanager
def started_algorithm(config: Any, host: Any) -> Iterator[tuple[Any, Any]]:
    """``(context, algorithm)`` for a test's in-process run of ``config``: its run context opened
    (``host``'s selection), its engines started and the selected algorithm built by its factory
    (``begin()`` left to the test, which may read ``held_out()`` first); the context closed after
    the block, as failed where the block raised."""
    from corerl.config.selection import select
    from corerl.reporting.console import make_console
    from corerl.run.context import RunContext

    context = RunContext.open(config, select(config, host), make_console(), host)
    failed = True
    try:
        context.start_engines()
        yield context, context.selection.algorithm.registration.load()(context)
        failed = False
    finally:
        context.close(run_failed=failed)


#: the model every case runs on (built into the run directory on first use)
TINY_MODEL = "builtin:tiny-qwen2"


def base_recipe(algorithm_id: str, consumes: str, steps: int) -> dict[str, Any]:
    """The recipe a case starts from: the tiny model, world size 1, ``hf`` generation, four
    prompts of two samples a step (a preference algorithm: four pairs of ``digit_preference``)."""
    return {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": TINY_MODEL, "max_seq_length": 64,
                   "generation": {"backend": "hf", "max_new_tokens": 4}},
        "algorithm": {"name": algorithm_id, "batch_size": 4, "num_generations_per_prompt": 2, "max_steps": steps,
                      "seed": 7},
        "data": {"task": "digit_preference" if consumes == "preferences" else "digit_echo"},
        "run": {"tensorboard": False},
    }


def is_number(value: Any) -> bool:
    """A metric value the run loop logs: a real number, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def bad_metrics(metrics: Mapping[str, Any]) -> list[str]:
    """The keys of ``metrics`` whose value is neither a number nor a non-empty list of numbers."""
    return [key for key, value in metrics.items()
            if not (is_number(value) or (isinstance(value, list) and value and all(map(is_number, value))))]


def differences(straight: Mapping[str, Any], resumed: Mapping[str, Any], tolerance: float,
                ignored: tuple[str, ...]) -> list[str]:
    """Where two steps' metrics differ (keys starting with one of ``ignored`` left out), each as
    ``key: straight vs resumed``."""
    keys = sorted(k for k in set(straight) | set(resumed) if not k.startswith(ignored))
    found = []
    for key in keys:
        a, b = straight.get(key), resumed.get(key)
        pairs = list(zip(a, b, strict=True)) if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) \
            else [(a, b)]
        if not all(_close(x, y, tolerance) for x, y in pairs):
            found.append(f"{key}: {a!r} vs {b!r}")
    return found


def _close(a: Any, b: Any, tolerance: float) -> bool:
    if is_number(a) and is_number(b):
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance * max(1.0, abs(a))
    return bool(a == b)


def copied_weights(training: Any) -> dict[str, Any]:
    """The policy's weights, copied off the engine (a weight stream may share their storage)."""
    return {name: tensor.detach().float().clone() for name, tensor in training.weight_stream()}


@attrs.define
class FirstStep:
    """A new run's algorithm after its first step, its context still open."""

    context: Any
    registration: Any
    algorithm: Any
    #: ``(name, total, done, measure)`` as the factory returned it
    shape: tuple[Any, ...]
    held_out: dict[str, Any]
    metrics: dict[str, Any] | None = None
    #: the run loop's refusal of the step (a changed counter, a loop metric), when it refused
    refused: Exception | None = None
    #: how many engines the context had started by the end of the step (the policy's, generation,
    #: and what the algorithm started: a reference, a critic, a teacher)
    engines: int = 0


@attrs.define
class Continuation:
    """The same steps straight through and after a checkpoint, in two fresh contexts."""

    straight: list[dict[str, Any]]
    resumed: list[dict[str, Any]]
    straight_weights: dict[str, Any]
    resumed_weights: dict[str, Any]
    #: the resumed algorithm's ``done`` as its factory returned it, and after ``begin()``
    resumed_done: tuple[int, int]


class AlgorithmConformance:
    """Base class of an algorithm's conformance tests; set :attr:`algorithm_id` (and
    :attr:`plugin`, :attr:`recipe` or :attr:`overrides` as the algorithm needs)."""

    algorithm_id: ClassVar[str]
    #: a plugin module (or object) to register beside the installed plugins; None: the installed
    #: plugins alone (the algorithm's plugin among them)
    plugin: ClassVar[Any] = None
    #: recipe keys laid over :func:`base_recipe` (a nested mapping)
    recipe: ClassVar[Mapping[str, Any]] = {}
    #: ``key=value`` overrides applied last, as on the command line
    overrides: ClassVar[list[str]] = []
    #: steps of the straight run; the interrupted one saves after its first and continues
    steps: ClassVar[int] = 2
    #: largest relative difference allowed between straight and resumed metrics and weights
    tolerance: ClassVar[float] = 1e-6
    #: metric name prefixes that may differ from run to run (wall-clock timings)
    varying_metrics: ClassVar[tuple[str, ...]] = ("time/",)

    # -- building a run ----------------------------------------------------------------

    @classmethod
    def _host(cls) -> Any:
        """The installed plugins (whatever ``CORERL_*`` says), and :attr:`plugin` registered
        beside them when its algorithm is not installed already."""
        from corerl.testing import host_for_component

        return host_for_component("algorithms", cls.algorithm_id, cls.plugin, "algorithm")[0]

    @classmethod
    def _open(cls, folder: Path, name: str) -> Any:
        """A run context for the case's recipe in ``folder/name`` (resumed when that directory
        holds a checkpoint), its engines started."""
        from corerl.config.tree import deep_merge
        from corerl.reporting.console import make_console
        from corerl.run.context import RunContext
        from corerl.testing import select_for, write_recipe

        host = cls._host()
        registration = host.algorithms.get(cls.algorithm_id)
        recipe = deep_merge(base_recipe(cls.algorithm_id, registration.consumes, cls.steps), cls.recipe)
        recipe = deep_merge(recipe, {"run": {"output_dir": str(folder), "name": name}})
        config, selection = select_for(host, write_recipe(folder / f"{name}.yaml", recipe), cls.overrides)
        context = RunContext.open(config, selection, make_console(quiet=True), host)
        try:
            context.start_engines()
        except BaseException:
            context.close(run_failed=True)
            raise
        return context

    @classmethod
    def _first_step(cls, folder: Path) -> FirstStep:
        """A new run: the algorithm built, its held-out figures, ``begin()`` and one step."""
        from corerl.algorithms.contract import StepCountError
        from corerl.run.steps import start_algorithm, take_step

        context = cls._open(folder, "interrupted")
        try:
            registration = context.selection.algorithm.registration
            algorithm = start_algorithm(context, registration)
            record = FirstStep(context, registration, algorithm,
                               (algorithm.name, algorithm.total, algorithm.done, algorithm.measure),
                               algorithm.held_out())
            algorithm.begin()
            try:
                record.metrics = take_step(algorithm, registration)
            except StepCountError as exc:
                record.refused = exc
            record.engines = len(context.started)
            return record
        except BaseException:
            context.close(run_failed=True)
            raise

    @classmethod
    def _continue(cls, first: FirstStep, folder: Path) -> Continuation:
        """Save ``first``'s run after its step, resume it in a fresh context and take the other
        steps; then the same steps straight through in another."""
        from corerl.run.steps import save_run_checkpoint, start_algorithm, take_step

        if first.refused is not None:
            pytest.fail(f"the first step was refused: {first.refused}", pytrace=False)
        if cls.steps < 2:
            pytest.fail(f"steps is {cls.steps}: the check saves after the first step and continues, so it needs 2 or "
                        "more", pytrace=False)
        save_run_checkpoint(first.context, [first.algorithm], first.algorithm)
        first.context.close(run_failed=False)

        def play(name: str, steps: int, evaluate: bool) -> tuple[list[dict[str, Any]], dict[str, Any], tuple[int, int]]:
            context = cls._open(folder, name)
            try:
                registration = context.selection.algorithm.registration
                algorithm = start_algorithm(context, registration)
                started = algorithm.done
                if evaluate:  # a new run's held-out figures come first, as in a run
                    algorithm.held_out()
                algorithm.begin()
                done = (started, algorithm.done)
                metrics = [take_step(algorithm, registration) for _ in range(steps)]
                return metrics, copied_weights(context.training), done
            finally:
                context.close(run_failed=False)

        resumed, resumed_weights, done = play("interrupted", cls.steps - 1, evaluate=False)
        straight, straight_weights, _ = play("straight", cls.steps, evaluate=True)
        return Continuation(straight, resumed, straight_weights, resumed_weights, done)

    # -- fixtures ----------------------------------------------------------------------

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_folder(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tmp_path_factory.mktemp("algorithm-conformance")

    @pytest.fixture(scope="class")
    @classmethod
    def first_step(cls, conformance_folder: Path) -> Iterator[FirstStep]:
        record = cls._first_step(conformance_folder)
        try:
            yield record
        finally:
            record.context.close(run_failed=False)

    @pytest.fixture(scope="class")
    @classmethod
    def continuation(cls, first_step: FirstStep, conformance_folder: Path) -> Continuation:
        return cls._continue(first_step, conformance_folder)

    # -- (a) ---------------------------------------------------------------------------

    def test_the_run_object_follows_the_contract(self, first_step: FirstStep) -> None:
        from corerl.algorithms.contract import AlgorithmRun

        name, total, done, measure = first_step.shape
        algorithm = first_step.algorithm
        assert isinstance(algorithm, AlgorithmRun), (
            f"{type(algorithm).__name__} lacks part of corerl.sdk.AlgorithmRun (name, total, done, measure, begin, "
            "step, held_out, save, load, export); subclass corerl.sdk.AlgorithmBase for the defaults")
        assert name == self.algorithm_id, (
            f"the run object is named {name!r}: name it {self.algorithm_id!r}, its registration's id (checkpoints, "
            "metrics.jsonl and summary.json know the phase by it)")
        expected = first_step.context.config.core.algorithm.max_steps
        assert total == expected, f"total is {total}, and algorithm.max_steps is {expected}"
        assert done == 0, f"a new run's algorithm starts with done {done}, not 0 (the run loop sets it)"
        assert isinstance(measure, str) and measure, f"measure is {measure!r}: name the figure held_out() leads with"

    # -- (b) ---------------------------------------------------------------------------

    def test_held_out_figures_lead_with_the_measure(self, first_step: FirstStep) -> None:
        figures, measure = first_step.held_out, first_step.shape[3]
        assert isinstance(figures, dict) and figures, f"held_out() returned {figures!r}, not a dict of figures"
        assert list(figures)[0] == measure, f"held_out() leads with {list(figures)[0]!r}, not the measure {measure!r}"
        wrong = [k for k, v in figures.items() if not (is_number(v) and math.isfinite(v))]
        assert not wrong, f"held_out() figures that are not finite numbers: {', '.join(wrong)}"

    # -- (c) ---------------------------------------------------------------------------

    def test_one_step_returns_numbers_with_a_loss(self, first_step: FirstStep) -> None:
        if first_step.refused is not None:
            pytest.fail(f"the step was refused: {first_step.refused}", pytrace=False)
        metrics = first_step.metrics
        assert metrics is not None
        wrong = bad_metrics(metrics)
        assert not wrong, f"step() metrics that are neither numbers nor lists of numbers: {', '.join(wrong)}"
        assert "loss" in metrics, f"step() returned no 'loss' (it returned {', '.join(sorted(metrics))})"
        assert math.isfinite(metrics["loss"]), f"the first step's loss is {metrics['loss']}"

    # -- (d) ---------------------------------------------------------------------------

    def test_the_step_counter_is_left_to_the_run_loop(self, first_step: FirstStep, continuation: Continuation) -> None:
        if first_step.refused is not None:
            pytest.fail(str(first_step.refused), pytrace=False)
        assert first_step.algorithm.done == 1
        started, after_begin = continuation.resumed_done
        assert started == 1, f"resumed after step 1, the factory's object says done {started} (it reads " \
                             "RunServices.steps_done(name), as AlgorithmBase does)"
        assert after_begin == 1, f"begin() changed done from 1 to {after_begin}: the run loop alone counts steps"

    # -- (e) ---------------------------------------------------------------------------

    def test_save_load_continue_equals_uninterrupted(self, continuation: Continuation) -> None:
        later = continuation.straight[1:]
        assert len(later) == len(continuation.resumed)
        for step, (straight, resumed) in enumerate(zip(later, continuation.resumed, strict=True), start=2):
            differ = differences(straight, resumed, self.tolerance, self.varying_metrics)
            assert not differ, (f"step {step} resumed from a checkpoint differs from the same step run straight: "
                                + "; ".join(differ[:5]) + " (save()/load()/task_state() keep less than the step reads)")
        ours, theirs = continuation.resumed_weights, continuation.straight_weights
        assert ours.keys() == theirs.keys()
        worst, name = max(((a - theirs[n]).abs().max().item(), n) for n, a in ours.items())
        assert worst <= self.tolerance, f"after resuming, {name} differs from the straight run's by {worst:.3g}"
