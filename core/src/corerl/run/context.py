"""What one run's steps are built from: its directory, tokenizer and task, the engines it started
(policy training, generation, and whatever an algorithm adds), the offload policy, and what a
resumed run had done.

:meth:`RunContext.open` prepares the directory, model and task; :meth:`RunContext.start_engines`
starts the policy's training backend and (for an algorithm that samples) the generation
backend. Both run in-process at world size 1, so a fast-tier test can drive one step of any
algorithm with nothing but a context (``tests/test_algorithms.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from corerl.config import Config
from corerl.errors import ConfigError, RegistrationError
from corerl.plugin_manager import PluginHost
from corerl.run.checkpoints import read_state
from corerl.run.directory import load_tokenizer, make_run_dir, resolve_model
from corerl.config.selection import Selection


class RunContext:
    """One run's shared state, handed to the algorithm's factory as its
    :class:`~corerl.algorithms.contract.RunServices` (which lists what an algorithm may use of it).

    ``training`` is the policy's engine, ``generation`` the sampling engine (None for an
    algorithm that samples nothing), ``offload`` the phase offload policy; ``starting_weights``
    is the checkpoint the algorithm starts from (the SFT warm start's, when one ran).
    """

    def __init__(self, config: Config, selection: Selection, console: Any, host: PluginHost,
                 run_dir: Path, resume: tuple[int, Path] | None) -> None:
        self.config, self.selection, self.console, self.host = config, selection, console, host
        self.run_dir, self.resume = run_dir, resume
        self.state: dict[str, Any] = read_state(resume[1]) if resume else {}
        self.started: list[Any] = []
        self.training: Any = None
        self.generation: Any = None
        self.offload: Any = None
        self.model_path = ""
        self.task: Any = None
        self.tokenizer: Any = None
        self.warm_started = False
        self._rollout: Any = None
        self._training_rollout: Any = None

    @classmethod
    def open(cls, config: Config, selection: Selection, console: Any, host: PluginHost,
             on_run_dir: Callable[[Path], None] | None = None) -> RunContext:
        """The run directory (new, or resumed and checked), the model, the tokenizer and the task;
        ``on_run_dir(run_dir)`` is called once the directory exists (the CLI's quiet terminal).
        What ``corerl validate`` checks of the machine is checked first, by the same function
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
            from corerl.checkpoint_safety import verify_folder

            verify_folder(resume[1])
        context = cls(config, selection, console, host, run_dir, resume)
        context.load_model_and_task()
        return context

    def load_model_and_task(self, model_path: str | None = None) -> None:
        """The model (``policy.model_name``, resolved in the run directory; or the Hugging Face
        folder ``model_path``, as it is), its tokenizer and the task."""
        from corerl.tasks import TaskContext

        core, selection = self.config.core, self.selection
        if model_path is not None:
            self.model_path = model_path
        else:
            self.model_path = resolve_model(core.policy.model_name, self.run_dir, core.policy.gguf_file)
            if core.policy.hf_config_overrides:
                from corerl.models.overrides import with_config_overrides

                self.model_path = with_config_overrides(self.model_path, core.policy.hf_config_overrides,
                                                        self.run_dir / "model_overridden")
        tokenizer = load_tokenizer(core.policy.tokenizer_path(self.model_path), self.model_path)
        if core.policy.chat_template is not None:
            tokenizer.chat_template = core.policy.chat_template
        self.tokenizer = tokenizer
        self.task_images = image_encoder(self.model_path, tokenizer)  # a vision-language policy's ImageEncoder
        assert selection.task.registration is not None
        self.task = selection.task.registration.create(TaskContext(
            tokenizer, core.algorithm.seed, core.data, selection.reward_fn,
            max_prompt_tokens=core.policy.max_seq_length - 1, images=self.task_images))
        check_task_fits(self.task, selection)

    # -- engines ---------------------------------------------------------------------------

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

    def resumed_base(self) -> str:
        """Where the policy's weights load from before a checkpoint: the model, except for a LoRA
        run resumed after its SFT warm start, whose adapter trains on the warm start's merged
        model (its checkpoint holds the adapter alone)."""
        if (self.resume is not None and self.config.core.policy.lora.enabled and self.warm_started
                and "after_sft" in self.state.get("evals", {})):
            return self.starting_weights
        return self.model_path

    def start_engines(self) -> None:
        """The policy's training engine, the generation engine and offload policy when the
        algorithm samples, and a resumed run's policy checkpoint and task state."""
        from corerl.offload.schedule import NoOffload

        selection = self.selection
        assert selection.training_backend.registration is not None
        if getattr(selection.algorithm.registration, "value_model", False):  # a reward model in the policy's place
            from corerl.config.critic import CRITIC_ROLE

            self.training = self.start(selection.training_backend.registration, self.value_model_start(),
                                       config=attrs.evolve(self.config, role=CRITIC_ROLE))
        else:
            self.training = self.start(selection.training_backend.registration, self.resumed_base())
        if not selection.samples:
            self.offload = NoOffload(self.training, None)  # nothing is sampled: no engine to offload for
        else:
            assert selection.generation_backend.registration is not None
            self.generation = self.start_generation(selection.generation_backend.registration)
            assert selection.offload_policy.registration is not None
            self.offload = selection.offload_policy.registration.create(training=self.training,
                                                                        generation=self.generation, config=self.config)
        if self.resume is not None:
            self.training.load_checkpoint(str(self.resume[1] / "training"))
            self.refit()
            self.task.set_state(self.state["task"])

    def value_model_start(self) -> str:
        """The model with a zero one-label value head, written once to ``<run dir>/value_init``
        (a model that is a value model already starts as it is)."""
        from corerl.complete_folders import write_once
        from corerl.models.value_model import init_value_model, is_value_model

        if is_value_model(self.model_path):
            return self.model_path
        return str(write_once(self.run_dir / "value_init", lambda work: init_value_model(self.model_path, work)))

    def start_generation(self, registration: Any) -> Any:
        """The generation engine: the backend itself, or with ``algorithm.async.enabled`` the
        backend in a dedicated worker that takes weights while it generates
        (:mod:`corerl.asynchronous.engine`)."""
        from corerl.asynchronous.settings import async_settings

        settings = async_settings(self.config)
        if not settings.enabled:
            return self.start(registration, self.model_path, self.training)
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
        engine.load_hf(self.model_path)
        return engine

    def refit(self) -> None:
        """Send the policy's weights to the generation engine (nothing when there is none): with
        ``policy.lora``, the adapter only (:class:`corerl.lora.weights.AdapterWeights`)."""
        from corerl.training.weights import send_weights

        if self.generation is not None:
            send_weights(self.training, self.generation)

    def rollout(self) -> Any:
        """The rollout stage of a sampling algorithm, built once per run: one turn scored by the
        task's reward, or, with ``data.env_name``, episodes against that environment (its workers
        started here, in this process or as ``env.<id>.num_workers`` Ray actors, or an agent
        harness over the OpenAI-compatible endpoint; shut down with the run)."""
        if self._rollout is None:
            self._rollout = self._build_rollout()
        return self._rollout

    def frozen_config(self, model_path: str, *, micro_batch_size: int | None = None, backend: str | None = None,
                      role: str | None = None, own_layout: Any = None, own_layout_key: str = "",
                      pool: str = "frozen") -> Config:
        """The config of a frozen model beside the policy (a distillation teacher, a reward model):
        the policy's, with ``model_path``, no adapter, ``micro_batch_size`` rows per scoring forward
        and training ``backend`` (unset: the policy's), in ``role`` (unset: the run's); with
        ``own_layout`` (``policy`` and ``cluster`` keys, given at ``own_layout_key``) laid over the
        recipe first (:func:`corerl.config.own_layout.with_own_layout`; cluster keys: its ranks in
        a Ray placement ``pool`` of their own)."""
        from corerl.config.own_layout import with_own_layout

        config = with_own_layout(self.config, own_layout, own_layout_key, pool)
        core = config.core
        policy = attrs.evolve(
            core.policy, model_name=model_path, training_backend=backend or core.policy.training_backend,
            logprob_micro_batch_size=micro_batch_size or core.policy.logprob_micro_batch_size,
            lora=attrs.evolve(core.policy.lora, enabled=False))
        return attrs.evolve(config, core=attrs.evolve(core, policy=policy), role=role or self.config.role)

    def training_rollout(self) -> Any:
        """The rollout training scores: :meth:`rollout`, or with ``reward_model.kind`` the same
        samples rescored by the reward model or judge (held-out and eval keep :meth:`rollout`)."""
        if self.config.core.reward_model.kind is None:
            return self.rollout()
        if self._training_rollout is None:
            from corerl.environments.model_rewards import ModelScoredRollout

            self._training_rollout = ModelScoredRollout(self.rollout(), self.start_reward_scorer())
        return self._training_rollout

    def start_reward_scorer(self) -> Any:
        """The scorer ``reward_model`` describes, its engine started here (shut down with the run)."""
        from corerl.config.critic import CRITIC_ROLE
        from corerl.environments.model_rewards import JudgeScorer, ValueModelScorer, as_value_model, slot_token
        from corerl.models.tokenizer import check_same_vocabulary
        from corerl.offload import ReferenceOffload
        from corerl.run.directory import resolve_model

        settings = self.config.core.reward_model
        if settings.kind == "llm_judge":
            generation = self.generation
            if settings.model_name is not None:
                path = resolve_model(settings.model_name, self.run_dir, key="reward_model.model_name", folder="judge")
                check_same_vocabulary(self.model_path, path, "reward_model.model_name", "judge")
                judge = attrs.evolve(self.config.core.policy, model_name=path)
                config = attrs.evolve(self.config, core=attrs.evolve(self.config.core, policy=judge))
                assert self.selection.generation_backend.registration is not None
                generation = self.start(self.selection.generation_backend.registration, path, config=config)
            return JudgeScorer(generation, self.tokenizer, settings.judge_template, settings.judge_pattern,
                               settings.judge_max_score, settings.judge_max_new_tokens,
                               max_length=self.config.core.policy.max_seq_length)
        path = as_value_model(resolve_model(settings.model_name, self.run_dir, key="reward_model.model_name",
                                            folder="reward_model_base"), self.run_dir / "reward_value_model")
        check_same_vocabulary(self.model_path, path, "reward_model.model_name", "reward model")
        config = self.frozen_config(path, micro_batch_size=settings.micro_batch_size, role=CRITIC_ROLE)
        assert self.selection.training_backend.registration is not None
        engine = self.start(self.selection.training_backend.registration, path, config=config)
        return ValueModelScorer(ReferenceOffload(engine, settings.cpu_offload), slot_token(self.tokenizer),
                                settings.micro_batch_size)

    def _build_rollout(self) -> Any:
        from corerl.environments.rollout import MultiTurnRollout, SingleTurnRollout

        choice = self.selection.environment
        if choice.registration is None:
            return SingleTurnRollout(self.generation, self.task.reward, tokenizer=self.tokenizer)
        settings = self.config.section(f"env.{choice.id}")
        if choice.registration.plays == "agent":
            from corerl.environments.agent import AgentRollout

            agent = choice.registration.create(self._environment_context(settings))
            rollout = AgentRollout(self.generation, agent, self.tokenizer, choice.id, settings)
            self.started.append(rollout)
            return rollout
        from corerl.environments.encoding import ObservationEncoder

        pool = self.start_environment(choice.registration, settings)
        return MultiTurnRollout(self.generation, pool, ObservationEncoder(self.tokenizer, self.task_images), self.tokenizer, choice.id,
                                max_turns=self.config.core.algorithm.max_rollout_turns,
                                max_failure_share=settings.max_failure_share)

    def _environment_context(self, settings: Any) -> Any:
        from corerl.environments.contract import EnvironmentContext

        return EnvironmentContext(settings, self.config.core.algorithm.seed, self.tokenizer,
                                  tools={t.id: t for t in self.host.tools},
                                  tool_parsers={p.id: p for p in self.host.tool_parsers},
                                  reward=self.selection.reward_fn, data=self.config.core.data)

    def start_environment(self, registration: Any, settings: Any) -> Any:
        """The environment's pool of workers (:mod:`corerl.environments.pool`), shut down with the run."""
        from corerl.environments.pool import InProcessPool, RayPool

        context = self._environment_context(settings)
        if settings.num_workers:
            pool: Any = RayPool(registration, context, settings.num_workers, self.config.core.cluster.ray_address)
            self.console.print(f"environment {registration.id}: {settings.num_workers} Ray actor(s)")
        else:
            pool = InProcessPool(registration.create(context), settings.timeout_s)
        self.started.append(pool)
        return pool

    def start_reference(self) -> tuple[Any, Any]:
        """A frozen copy of :attr:`starting_weights` on the policy's backend, and its offload
        (``policy.reference.cpu_offload``). With ``policy.lora`` the reference is the policy's own
        engine with the adapter switched off: no second copy of the weights is started."""
        from corerl.offload import ReferenceOffload

        if self.config.core.policy.lora.enabled:
            from corerl.lora.reference import AdapterOffReference

            reference: Any = AdapterOffReference(self.training)
            return reference, ReferenceOffload(reference, enabled=False)
        assert self.selection.training_backend.registration is not None
        reference = self.start(self.selection.training_backend.registration, self.starting_weights)
        return reference, ReferenceOffload(reference, self.config.core.policy.reference.cpu_offload)

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

    # -- what algorithms read ----------------------------------------------------------------

    @property
    def starting_weights(self) -> str:
        """The checkpoint the algorithm starts from: the warm start's when one ran, else the model."""
        return str(self.run_dir / "sft_model") if self.warm_started else self.model_path

    def resolve_model(self, model_name: str, *, key: str, folder: str) -> str:
        """``model_name`` (a recipe's model other than the policy's) as a Hugging Face checkpoint folder
        (:func:`corerl.run.directory.resolve_model`): a ``builtin:`` model built once into the run
        directory's ``folder``; ``key`` is the config key errors name."""
        return resolve_model(model_name, self.run_dir, key=key, folder=folder)

    def steps_done(self, phase: str) -> int:
        """Steps of ``phase`` a resumed run had done (0 for a new run)."""
        return int(self.state.get("steps_done", {}).get(phase, 0))

    def held_out_reward(self) -> float:
        """Mean held-out reward of greedy answers from the generation engine."""
        from corerl.evaluation.figures import greedy_reward, greedy_settings

        self.offload.before_generation()
        return greedy_reward(self.rollout(), self.task, greedy_settings(self.config),
                             self.config.core.policy.max_seq_length)


def check_task_fits(task: Any, selection: Selection) -> None:
    """Refuse a task object that cannot feed the selected algorithm (one that trains on
    preference pairs needs a preference source; one that samples needs prompts), in one line
    naming ``data.task``."""
    from corerl.tasks.preferences import PreferenceSource

    registration, task_id = selection.algorithm.registration, selection.task.id
    if registration is None:
        return
    if registration.consumes == "preferences" and not isinstance(task, PreferenceSource):
        raise ConfigError(f"task {task_id!r} provides no preference pairs, which {registration.id} trains on",
                          key="data.task", hint="use data.task=digit_preference (built in) or data.task=preferences "
                                                "with data.train_files (prompt/chosen/rejected rows)")
    if registration.consumes == "prompts" and not hasattr(task, "sample"):
        raise ConfigError(f"task {task_id!r} provides preference pairs only, which {registration.id} does not "
                          "train on", key="algorithm.name", hint="pick an algorithm that trains on preference pairs "
                                                                  "(algorithm.name=dpo)")


def image_encoder(model_path: str, tokenizer: Any) -> Any:
    """The policy's :class:`~corerl.models.vision.ImageEncoder` when it is a vision-language
    model, else None."""
    from corerl.models.vision import ImageEncoder, is_vision_language, read_hf_config

    return ImageEncoder(model_path, tokenizer) if is_vision_language(read_hf_config(model_path)) else None
