"""The engines a run starts: the policy's training engine, the generation engine and the offload
policy between them, and every backend started beside them (a reference, a critic, a teacher, a
reward model, an environment's workers), all shut down with the run, newest first.

Each engine starts in-process at world size 1 for a fast-tier test (``tests/test_algorithms.py``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from corerl.errors import RegistrationError

if TYPE_CHECKING:
    from corerl.config import Config
    from corerl.config.selection import Selection


class Engines:
    """The policy's engines (``training``, ``generation``: None for an algorithm that samples
    nothing, ``offload``: the phase offload policy), set by :meth:`start_policy`, and ``started``:
    everything the run has started, to shut down with it (:meth:`close`)."""

    def __init__(self, config: Config, selection: Selection, console: Any) -> None:
        self.config, self.selection, self.console = config, selection, console
        self.started: list[Any] = []
        self.training: Any = None
        self.generation: Any = None
        self.offload: Any = None

    def start(self, registration: Any, path: str, training: Any = None, config: Config | None = None) -> Any:
        """Build a backend (from ``config``, default the run's), check it against its contract,
        and load ``path`` into it; it is shut down with the run."""
        from corerl.generation.contract import check_reads_images
        from corerl.registry import GenerationBackend, TrainingBackend
        from corerl.training.contract import describe_missing

        config = config or self.config
        if isinstance(registration, TrainingBackend):  # the vision tower frozen where the algorithm samples
            from corerl.models.vision import with_vision_default

            algorithm = self.selection.algorithm.registration
            config = with_vision_default(config, algorithm is None or algorithm.generation)
        backend = registration.create(config=config)
        self.started.append(backend)
        if isinstance(registration, TrainingBackend) and (missing := describe_missing(backend, config.role)):
            contract = "ValueEngine" if config.role == "critic" else "TrainingEngine"
            raise RegistrationError(f"training backend {registration.id!r} (plugin {registration.plugin!r}) built a "
                                    f"{type(backend).__name__} without {', '.join(missing)} of the training contract",
                                    hint=f"corerl.training.contract.{contract} lists what a training backend provides")
        nodes = backend.worker_nodes() if hasattr(backend, "worker_nodes") else []
        if nodes:
            pool = "" if config.pool == "colocated" else f", in a placement pool of their own ({config.pool!r})"
            self.console.print(f"{registration.id}: {len(nodes)} rank(s) on {len(set(nodes))} Ray node(s){pool}")
        if isinstance(registration, GenerationBackend):
            check_reads_images(backend, registration, path)
        shared = training is not None and hasattr(backend, "use_training_engine") and backend.use_training_engine(training)
        backend.load_hf(path)
        if shared:
            copy = (f", decoding through a {config.core.policy.precision} copy of its weights for the static KV cache"
                    if getattr(backend, "decode_copy", None) is not None else "")
            self.console.print(f"generation samples with the {self.selection.training_backend.id} training model "
                               f"itself{copy}")
        return backend

    def keep(self, started: Any) -> Any:
        """Shut ``started`` (an environment's pool, an agent harness) down with the run; returns it."""
        self.started.append(started)
        return started

    def start_policy(self, base: str, model_path: str, run_dir: Path) -> None:
        """The policy's training engine, loaded with ``base`` (an algorithm registered with
        ``value_model`` trains a value model there instead), and when the algorithm samples the
        generation engine, loaded with ``model_path``, and the offload policy between the two."""
        from corerl.offload.schedule import NoOffload

        selection = self.selection
        assert selection.training_backend.registration is not None
        if getattr(selection.algorithm.registration, "value_model", False):  # a reward model in the policy's place
            from corerl.config.critic import CRITIC_ROLE

            self.training = self.start(selection.training_backend.registration, value_model_start(model_path, run_dir),
                                       config=attrs.evolve(self.config, role=CRITIC_ROLE))
        else:
            self.training = self.start(selection.training_backend.registration, base)
        if not selection.samples:
            self.offload = NoOffload(self.training, None)  # nothing is sampled: no engine to offload for
        else:
            assert selection.generation_backend.registration is not None
            self.generation = self.start_generation(selection.generation_backend.registration, model_path)
            assert selection.offload_policy.registration is not None
            self.offload = selection.offload_policy.registration.create(training=self.training,
                                                                        generation=self.generation, config=self.config)

    def start_for_evaluation(self, model_path: str, base: str, checkpoint: Path | None) -> None:
        """``corerl eval``'s engines: generation alone, loaded with ``model_path``; or with a run's
        ``checkpoint``, the policy's training engine (loaded with ``base``, then the checkpoint)
        and generation refitted from it; no offload between them."""
        from corerl.offload.schedule import NoOffload

        generation = self.selection.generation_backend.registration
        if checkpoint is None:
            self.generation = self.start(generation, model_path)
        else:
            self.training = self.start(self.selection.training_backend.registration, base)
            self.training.load_checkpoint(str(checkpoint / "training"))
            self.generation = self.start(generation, model_path, self.training)
            self.refit()
        self.offload = NoOffload(self.training, self.generation)

    def start_generation(self, registration: Any, model_path: str) -> Any:
        """The generation engine: the backend itself, or with ``algorithm.async.enabled`` the
        backend in a dedicated worker that takes weights while it generates
        (:mod:`corerl.asynchronous.engine`)."""
        from corerl.asynchronous.settings import async_settings

        settings = async_settings(self.config)
        if not settings.enabled:
            return self.start(registration, model_path, self.training)
        import os

        import torch

        from corerl.asynchronous.engine import DedicatedGeneration

        engine = DedicatedGeneration(registration, self.config, settings)
        self.started.append(engine)
        if engine.pool is not None and not engine.pool.gpus:  # one machine's cores, split between the two
            torch.set_num_threads(max(1, (os.cpu_count() or 1) - engine.threads))
        self.console.print(f"generation: {registration.id} on a dedicated worker (pid {engine.pid}, "
                           f"{'a GPU' if engine.pool is not None and engine.pool.gpus else f'{engine.threads} CPU thread(s)'}"
                           f"), at most {settings.max_staleness} version(s) behind training, sampler {settings.sampler}")
        engine.load_hf(model_path)
        return engine

    def refit(self) -> None:
        """Send the policy's weights to the generation engine (nothing when there is none): with
        ``policy.lora``, the adapter only (:class:`corerl.lora.weights.AdapterWeights`)."""
        from corerl.training.weights import send_weights

        if self.generation is not None:
            send_weights(self.training, self.generation)

    def close(self, run_failed: bool) -> None:
        """Shut every started backend down, newest first; one that fails to shut down does not
        keep the others up, and does not hide the error that ended the run (it is logged, and
        raised only when the run itself succeeded)."""
        failed: BaseException | None = None
        for backend in reversed(self.started):
            try:
                backend.shutdown()
            except Exception as exc:
                logging.getLogger(__name__).warning("shutting down %s failed: %s: %s", type(backend).__name__,
                                                    type(exc).__name__, exc)
                failed = failed or exc
        self.started = []
        if failed is not None and not run_failed:
            raise failed


def value_model_start(model_path: str, run_dir: Path) -> str:
    """The model with a zero one-label value head, written once to ``<run dir>/value_init``
    (a model that is a value model already starts as it is)."""
    from corerl.complete_folders import write_once
    from corerl.models.value_model import init_value_model, is_value_model

    if is_value_model(model_path):
        return model_path
    return str(write_once(run_dir / "value_init", lambda work: init_value_model(model_path, work)))
