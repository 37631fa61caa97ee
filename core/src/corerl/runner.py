"""Running a validated recipe: an optional SFT warm start, then GRPO, PPO (with a critic, a second
training backend) or DPO (or SFT alone), over the selected backends (DPO starts no generation
backend: it samples nothing), with a progress
bar per phase and a run directory holding metrics.jsonl, TensorBoard event files, curves.png,
summary.json and the final Hugging Face checkpoint.

``corerl run`` on a run directory that holds a complete checkpoint resumes from it; one that
holds none starts over there (``run.resume=must`` refuses instead). Folders the run trusts later
are written as complete folders (:mod:`corerl.complete_folders`). Ctrl-C finishes the current
step, saves a checkpoint and exits with status 130. A NaN loss or gradient stops the run.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from corerl.checkpoints import latest_checkpoint, read_state, save_checkpoint
from corerl.complete_folders import is_complete, recover, remove, write_complete, write_file_whole
from corerl.config import Config
from corerl.errors import ConfigError, RegistrationError, RunError
from corerl.failures import checkpoint_failure, disk_error, first_line
from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.progress_markers import mark
from corerl.selection import Selection

EXIT_INTERRUPTED = 130


@attrs.define
class RunResult:
    """What a run produced: its directory, its summary, and whether Ctrl-C stopped it early."""

    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool = False


# what a run writes into its directory; a run that holds no complete checkpoint loses these
# when it starts over (a complete built-in base model is kept: it is rebuilt identically anyway)
RUN_OUTPUTS = ("metrics.jsonl", "tensorboard", "checkpoints", "sft_model", "final", "curves.png", "summary.json",
               "reference_logprobs", "critic_init", "final_critic")


#: a new run directory's mode: its owner's alone (checkpoints, weights and the recipe inside are
#: reachable by nobody else, whatever mode each engine gives its files; docs/security.md)
RUN_DIR_MODE = 0o700


def check_writable(path: Path) -> None:
    """Create the run directory (:data:`RUN_DIR_MODE`; an existing one keeps its mode), or refuse,
    in one line naming ``run.output_dir``, one that cannot be created or written (before
    anything is built or written)."""
    probe = path / f".corerl-write-probe-{os.getpid()}"
    try:
        if not path.is_dir():
            path.mkdir(mode=RUN_DIR_MODE, parents=True)  # the mode applies to the run directory only
            path.chmod(RUN_DIR_MODE)  # whatever the umask
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write the run directory {path}: {exc.strerror or exc}", key="run.output_dir",
                          hint="give run.output_dir (and run.name) a folder you can write to") from None


def make_run_dir(config: Config, console: Any = None) -> tuple[Path, tuple[int, Path] | None]:
    """``run.output_dir/run.name`` (a timestamp when unnamed) and the checkpoint to resume from.

    An existing run resumes from its last complete checkpoint. One without any starts over in
    the same directory, saying so in one line (``run.resume=must`` refuses instead); a finished
    run without checkpoints is refused rather than overwritten.
    """
    run = config.core.run
    name = run.name or time.strftime("%Y%m%d-%H%M%S")
    path = Path(run.output_dir) / name
    check_writable(path)
    resume = latest_checkpoint(path)
    if resume is not None:
        return path, resume
    leftovers = [n for n in RUN_OUTPUTS if (path / n).exists()]
    if run.resume == "must":
        raise ConfigError(f"run directory {path} holds no complete checkpoint to resume from", key="run.resume",
                          hint="set run.resume=auto to start the run over in the same directory")
    if (path / "summary.json").exists():
        raise ConfigError(f"run directory {path} holds a finished run and no checkpoint to resume from", key="run.name",
                          hint="pick another run.name, or delete the directory to run it again")
    if leftovers:
        for name in leftovers:
            target = path / name
            remove(target) if target.is_dir() else target.unlink()
        if console is not None:
            console.print(f"run directory {path} holds no complete checkpoint: starting over "
                          f"(removed {', '.join(leftovers)})")
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def resolve_model(model_name: str, run_dir: Path) -> str:
    """A Hugging Face checkpoint directory, building a ``builtin:`` model into the run directory."""
    if model_name in BUILTIN_MODELS:
        target = run_dir / "base_model"
        recover(target)
        if not is_complete(target):  # a resumed run keeps its base model; a half-built one is rebuilt
            write_complete(target, lambda work: build_tiny_model(work, **BUILTIN_MODELS[model_name]))
        return str(target)
    if model_name.startswith("builtin:"):
        raise ConfigError(f"unknown built-in model {model_name!r}", key="policy.model_name",
                          hint=f"built-in models: {', '.join(BUILTIN_MODELS)}")
    if not Path(model_name).exists():
        raise ConfigError(f"model path {model_name} does not exist", key="policy.model_name",
                          hint="give a local Hugging Face checkpoint folder or a builtin: model; nothing is downloaded")
    if not (Path(model_name) / "config.json").exists():
        raise ConfigError(f"{model_name} is not a Hugging Face checkpoint directory (no config.json)",
                          key="policy.model_name", hint="give a local checkpoint folder: nothing is downloaded")
    if not any((Path(model_name) / weights).is_file() for weights in WEIGHT_FILES):
        raise ConfigError(f"{model_name} holds no weights (none of {', '.join(WEIGHT_FILES)})", key="policy.model_name",
                          hint="give a checkpoint folder with its weights, e.g. one written by save_pretrained")
    return model_name


#: the weight files (or their index, for sharded weights) a Hugging Face checkpoint folder holds
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def load_tokenizer(path: str, model_path: str) -> Any:
    """The tokenizer at ``path``; one that cannot be loaded is a one-line error naming the key."""
    from transformers import AutoTokenizer

    key = "policy.tokenizer_name" if path != model_path else "policy.model_name"
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # no or unreadable tokenizer files there
        raise ConfigError(f"cannot load a tokenizer from {path}: {first_line(exc)}", key=key, hint="give a folder holding tokenizer.json or the tokenizer files save_pretrained "
                                        "writes") from exc


def check_finite(phase: str, step: int, metrics: dict[str, Any]) -> None:
    """Stop the run at a step whose loss or gradient norm (the policy's or the critic's) is NaN or infinite."""
    watched = ("loss", "grad_norm", "critic/value_loss", "critic/grad_norm")
    bad = {k: metrics[k] for k in watched if k in metrics and not math.isfinite(metrics[k])}
    if bad:
        shown = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise RunError(f"{phase} step {step}: {shown}; the run stopped there, before logging or saving that step",
                       key="policy.optimizer.lr", hint="lower the learning rate; the last checkpoint, if any, is intact")


def evaluate(generation: Any, task: Any, max_new_tokens: int, max_seq_length: int) -> float:
    """Mean held-out reward of greedy answers (completions end at ``max_seq_length``)."""
    from corerl.generation.contract import SamplingSettings
    from corerl.tasks import mean_reward

    prompts, examples = task.held_out()
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=max_new_tokens).within(max_seq_length, prompts)
    groups = generation.generate(prompts, sampling, n=1)
    return mean_reward(task, groups, examples)


@attrs.define
class Phase:
    """One phase of a run (``sft`` or ``grpo``): its length and how to run one step."""

    name: str
    total: int
    step: Callable[[], dict[str, float]]
    done: int = 0


def _progress(console: Any) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description:<4}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[shown]}"), TimeRemainingColumn(), console=console,
    )


def _shown(metrics: dict[str, float]) -> str:
    tokens = metrics.get("generated_tokens", metrics.get("tokens", 0.0))
    text = f"reward {metrics['reward/mean']:.3f}  " if "reward/mean" in metrics else ""
    if "preference_accuracy" in metrics:
        text = f"accuracy {metrics['preference_accuracy']:.2f}  margin {metrics.get('rewards/margin', 0.0):+.3f}  "
    if "critic/value_loss" in metrics:
        text += f"value loss {metrics['critic/value_loss']:.4f}  "
    return text + f"loss {metrics['loss']:+.4f}  {tokens / metrics['time/step']:,.0f} tok/s"


def execute(config: Config, selection: Selection, host: PluginHost, console: Any = None) -> RunResult:
    """Run ``config`` with the selected components (see the module docstring)."""
    from transformers.utils import logging as hf_logging

    from corerl.reporting.console import make_console

    hf_logging.disable_progress_bar()  # the run's own bars say what is happening
    mark("run:start")
    # the engines' modules first: a backend that cannot be imported fails the run before its
    # directory is made
    used = [selection.training_backend, selection.critic_backend]
    if config.core.algorithm.name != "dpo":
        used.append(selection.generation_backend)
    for choice in used:
        if choice is not None and choice.registration is not None:
            choice.registration.load()
    session, finished = None, False
    try:
        session = RunSession(config, selection, console or make_console(), host)
        result = session.run()
        finished = True
        return result
    except BaseException as exc:  # BaseException: torch's CheckpointException is one
        run_dir = session.run_dir if session is not None else Path(config.core.run.output_dir) / (config.core.run.name or "")
        refused = disk_error(exc, run_dir) or checkpoint_failure(exc, "saving or loading", run_dir / "checkpoints")
        if refused is None:
            raise
        raise refused from None
    finally:
        if session is not None:
            session.close(run_failed=not finished)


class RunSession:
    """One run from its directory to its summary: the backends it started, the task, the metrics
    log, the phases (SFT, GRPO) and their progress, and what each moment of the run does."""

    def __init__(self, config: Config, selection: Selection, console: Any, host: PluginHost) -> None:
        from corerl.run_record import check_same_recipe, record_recipe
        from corerl.tasks import TaskContext

        self.config, self.selection, self.console = config, selection, console
        core = config.core
        self.algorithm = core.algorithm
        self.run_dir, self.resume = make_run_dir(config, console)
        console.print(f"run directory: [bold]{self.run_dir}[/]"
                      + (f" (resuming from step {self.resume[0]})" if self.resume else ""))
        if self.resume is None:
            record_recipe(self.run_dir, config)
        else:  # a checkpoint goes on under the settings it was made with, and is refused, before
            # anything reads it, if it would run code
            from corerl.checkpoint_safety import verify_folder

            check_same_recipe(self.run_dir, config, host)
            verify_folder(self.resume[1])
        self.state = read_state(self.resume[1]) if self.resume else {}
        self.model_path = resolve_model(core.policy.model_name, self.run_dir)
        tokenizer = load_tokenizer(core.policy.tokenizer_path(self.model_path), self.model_path)
        if core.policy.chat_template is not None:
            tokenizer.chat_template = core.policy.chat_template
        assert selection.task.registration is not None
        self.task = selection.task.registration.create(TaskContext(
            tokenizer, self.algorithm.seed, core.data, selection.reward_fn,
            max_prompt_tokens=core.policy.max_seq_length - 1))
        self.sft_only, self.uses_dpo = self.algorithm.name == "sft", self.algorithm.name == "dpo"
        check_task_fits(self.task, selection.task.id, self.algorithm.name)
        self.sft_steps = self.algorithm.max_steps if self.sft_only else (core.sft.max_steps if core.sft.enabled else 0)
        self.sft_batch = self.algorithm.batch_size if self.sft_only else core.sft.batch_size
        self.grpo_steps = self.algorithm.max_steps if self.algorithm.name == "grpo" else 0
        self.ppo_steps = self.algorithm.max_steps if self.algorithm.name == "ppo" else 0
        self.dpo_steps = self.algorithm.max_steps if self.uses_dpo else 0
        self.evals: dict[str, float] = dict(self.state.get("evals", {}))
        self.done: dict[str, int] = dict(self.state.get("steps_done", {}))
        self.started: list[Any] = []
        self.phases: list[Phase] = []
        self.grpo: Any = None
        self.dpo: Any = None
        self.ppo: Any = None
        self.critic: Any = None

    # -- backends ------------------------------------------------------------------------

    def start(self, registration: Any, path: str, training: Any = None, config: Config | None = None) -> Any:
        """Build a backend (from ``config``, default the run's), check it against its contract,
        and load ``path`` into it."""
        from corerl.registry import TrainingBackend
        from corerl.training.contract import describe_missing

        config = config or self.config
        backend = registration.create(config=config)
        self.started.append(backend)
        if isinstance(registration, TrainingBackend) and (missing := describe_missing(backend, config.role)):
            contract = "ValueEngine" if config.role == "critic" else "TrainingEngine"
            raise RegistrationError(f"training backend {registration.id!r} (plugin {registration.plugin!r}) built a "
                                    f"{type(backend).__name__} without {', '.join(missing)} of the training contract",
                                    hint=f"corerl.training.contract.{contract} lists what a training backend provides")
        nodes = backend.worker_nodes() if hasattr(backend, "worker_nodes") else []
        if nodes:
            self.console.print(f"{registration.id}: {len(nodes)} rank(s) on {len(set(nodes))} Ray node(s)")
        if training is not None and hasattr(backend, "use_training_engine"):
            if backend.use_training_engine(training):
                self.console.print(f"generation samples with the {self.selection.training_backend.id} "
                                   "training model itself")
        backend.load_hf(path)
        return backend

    def close(self, run_failed: bool) -> None:
        """Shut every started backend down, newest first; one that fails to shut down does not
        keep the others up, and does not hide the error that ended the run (it is logged, and
        raised only when the run itself succeeded)."""
        import logging

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

    # -- what the run does ---------------------------------------------------------------

    def held_out_reward(self) -> float:
        if self.uses_dpo:
            return self.held_out_preferences()["preference_accuracy"]
        self.offload.before_generation()
        core = self.config.core
        return evaluate(self.generation, self.task, core.policy.generation.max_new_tokens, core.policy.max_seq_length)

    def export(self, folder: Path) -> None:
        self.offload.restore()
        write_complete(folder, lambda work: self.training.export_hf(str(work)))

    def held_out_preferences(self) -> dict[str, float]:
        """DPO's held-out figures (:func:`corerl.algorithms.dpo.preference_metrics`); before DPO
        starts the policy is its own reference."""
        from corerl.algorithms.dpo import preference_metrics, score_pairs

        pairs = self.task.held_out_pairs()
        policy = score_pairs(self.training, pairs)
        reference = self.dpo.reference.for_held_out(pairs) if self.dpo is not None else policy
        return preference_metrics(policy, reference, self.algorithm.dpo.beta)

    def sft_step(self) -> dict[str, float]:
        self.offload.before_training()
        if not hasattr(self.task, "demonstrations"):  # a preference task: its chosen responses
            train = self.task.train_pairs()
            return self.sft.step([train[i][:2] for i in self.task.draw(self.sft_batch)])
        return self.sft.step(self.task.demonstrations(self.sft_batch))

    def begin_dpo(self) -> None:
        from corerl.algorithms.dpo import DPO, ReferenceScores
        from corerl.offload import ReferenceOffload

        settings, core = self.algorithm.dpo, self.config.core
        if settings.precompute_reference_logprobs:
            reference = self.precomputed_reference()
        else:
            ref_path = self.run_dir / "sft_model" if self.sft_steps else Path(self.model_path)
            engine = self.start(self.selection.training_backend.registration, str(ref_path))
            reference = ReferenceScores(engine=engine, offload=ReferenceOffload(engine, core.policy.reference.cpu_offload))
        self.dpo = DPO(self.training, DPO.loss_from_config(settings), reference, steps_done=self.done.get("dpo", 0))
        self.preference_pairs = self.task.train_pairs()

    def precomputed_reference(self) -> Any:
        """Every training and held-out pair scored with the weights DPO starts from, written once
        to ``<run dir>/reference_logprobs`` (a resumed run reads it back: its weights have moved)."""
        from safetensors.torch import load_file, save_file

        from corerl.algorithms.dpo import ReferenceScores, score_pairs

        folder = self.run_dir / "reference_logprobs"
        recover(folder)
        train, held = self.task.train_pairs(), self.task.held_out_pairs()
        if not is_complete(folder):
            if self.done.get("dpo", 0):
                raise RunError(f"{folder} is missing, and this run has trained past the weights that scored it",
                               key="algorithm.dpo.precompute_reference_logprobs",
                               hint="start the run over under a new run.name")
            begin = time.perf_counter()
            with self.console.status(f"scoring {len(train)} training and {len(held)} held-out pairs with the "
                                     "reference (the starting weights)"):
                scores = {"train": score_pairs(self.training, train), "held_out": score_pairs(self.training, held)}
            write_complete(folder, lambda work: save_file(scores, str(work / "scores.safetensors")))
            self.console.print(f"reference: scored {len(train)} training and {len(held)} held-out pairs in "
                               f"{time.perf_counter() - begin:.1f} s")
        scores = load_file(str(folder / "scores.safetensors"))
        if scores["train"].shape[0] != len(train) or scores["held_out"].shape[0] != len(held):
            raise RunError(f"{folder} scored {scores['train'].shape[0]} training and {scores['held_out'].shape[0]} "
                           f"held-out pairs, and the task now has {len(train)} and {len(held)}", key="data.train_files",
                           hint="resume with the data the run started with, or start over under a new run.name")
        return ReferenceScores(train=scores["train"], held_out=scores["held_out"])

    def dpo_step(self) -> dict[str, float]:
        assert self.dpo is not None
        indices = self.task.draw(self.algorithm.batch_size)
        return self.dpo.step(indices, [self.preference_pairs[i] for i in indices])

    def begin_grpo(self) -> None:
        from corerl.algorithms.grpo import GRPO
        from corerl.algorithms.grpo_math import GRPOLoss
        from corerl.offload import ReferenceOffload

        algorithm, core = self.algorithm, self.config.core
        reference = reference_offload = None
        if algorithm.kl_penalty:
            ref_path = self.run_dir / "sft_model" if self.sft_steps else Path(self.model_path)
            reference = self.start(self.selection.training_backend.registration, str(ref_path))
            reference_offload = ReferenceOffload(reference, core.policy.reference.cpu_offload)
        self.grpo = GRPO(self.config, self.training, self.generation, self.task.reward,
                         loss=GRPOLoss.from_config(algorithm),
                         scale_rewards_by_std=algorithm.scale_rewards_by_std,
                         leave_one_out_baseline=algorithm.leave_one_out_baseline,
                         optimization_passes=algorithm.optimization_passes,
                         optimizer_batch_size=algorithm.optimizer_batch_size, reference=reference,
                         steps_done=self.done.get("grpo", 0), offload=self.offload,
                         reference_offload=reference_offload)

    def grpo_step(self) -> dict[str, float]:
        assert self.grpo is not None
        prompts, examples = self.task.sample(self.algorithm.batch_size)
        return self.grpo.step(prompts, examples)

    def critic_path(self) -> str:
        """The critic's starting checkpoint: ``critic.model_name`` (a value model), else the policy
        PPO starts from with a zero value head, written once to ``<run dir>/critic_init``."""
        from corerl.models.value_model import init_value_model, is_value_model

        given = self.config.core.critic.model_name
        if given is not None:
            if not (Path(given) / "config.json").exists():
                raise ConfigError(f"critic checkpoint {given} is not a Hugging Face checkpoint directory",
                                  key="critic.model_name", hint="give a local folder, or unset it to start the critic "
                                                                "from the policy")
            if not is_value_model(given):
                raise ConfigError(f"critic checkpoint {given} is not a value model (a one-label token classifier)",
                                  key="critic.model_name", hint="unset critic.model_name to start the critic from the "
                                                                "policy's weights with a zero value head")
            return given
        target = self.run_dir / "critic_init"
        recover(target)
        if not is_complete(target):
            source = self.run_dir / "sft_model" if self.sft_steps else Path(self.model_path)
            write_complete(target, lambda work: init_value_model(source, work))
        return str(target)

    def begin_ppo(self) -> None:
        from corerl.algorithms.ppo import PPO
        from corerl.offload import ReferenceOffload

        core, selection = self.config.core, self.selection
        assert selection.critic_backend is not None and selection.critic_backend.registration is not None
        reference = reference_offload = None
        if self.algorithm.kl_penalty:
            ref_path = self.run_dir / "sft_model" if self.sft_steps else Path(self.model_path)
            reference = self.start(selection.training_backend.registration, str(ref_path))
            reference_offload = ReferenceOffload(reference, core.policy.reference.cpu_offload)
        self.critic = self.start(selection.critic_backend.registration, self.critic_path(),
                                 config=selection.critic_config)
        if self.resume is not None and (self.resume[1] / "critic").exists():
            self.critic.load_checkpoint(str(self.resume[1] / "critic"))
        self.ppo = PPO.from_config(self.config, training=self.training, critic=self.critic,
                                   generation=self.generation, reward_fn=self.task.reward, reference=reference,
                                   steps_done=self.done.get("ppo", 0), offload=self.offload,
                                   reference_offload=reference_offload)

    def ppo_step(self) -> dict[str, float]:
        assert self.ppo is not None
        prompts, examples = self.task.sample(self.algorithm.batch_size)
        return self.ppo.step(prompts, examples)

    @property
    def measure(self) -> str:
        """What the held-out evaluation reports."""
        return "preference accuracy" if self.uses_dpo else "reward"

    def global_step(self) -> int:
        return sum(p.done for p in self.phases)

    def checkpoint(self) -> None:
        self.offload.restore()
        snapshot = {"steps_done": {p.name: p.done for p in self.phases}, "metrics_lines": self.log.lines,
                    "task": self.task.state(), "evals": self.evals}
        if self.ppo is not None and self.ppo.critic_offload is not None:
            self.ppo.critic_offload.active()

        def save(folder: Path) -> None:
            self.training.save_checkpoint(str(folder / "training"))
            if self.critic is not None:
                self.critic.save_checkpoint(str(folder / "critic"))

        save_checkpoint(self.run_dir, self.global_step(), save, snapshot, self.config.core.checkpointing.keep_last)

    # -- the run -------------------------------------------------------------------------

    def run(self) -> RunResult:
        from corerl.algorithms.sft import SFT
        from corerl.interrupt import stop_on_sigint
        from corerl.reporting.metrics_log import MetricsLog

        selection, core = self.selection, self.config.core
        assert selection.training_backend.registration and selection.generation_backend.registration
        self.training = self.start(selection.training_backend.registration, self.model_path)
        if self.uses_dpo:  # nothing is sampled: no generation engine, nothing to offload for one
            from corerl.offload.schedule import NoOffload

            self.generation, self.offload = None, NoOffload(self.training, None)
        else:
            self.generation = self.start(selection.generation_backend.registration, self.model_path, self.training)
            assert selection.offload_policy.registration is not None
            self.offload = selection.offload_policy.registration.create(training=self.training,
                                                                        generation=self.generation, config=self.config)
        if self.resume is not None:
            self.training.load_checkpoint(str(self.resume[1] / "training"))
            if self.generation is not None:
                self.generation.update_weights(self.training.weight_stream())
            self.task.set_state(self.state["task"])
        if "before" not in self.evals:
            self.evals["before"] = self.held_out_reward()
            self.console.print(f"held-out {self.measure} before training: {self.evals['before']:.3f}")
        self.log = MetricsLog(self.run_dir, keep_lines=self.state.get("metrics_lines") if self.resume else None,
                              tensorboard=core.run.tensorboard)
        self.sft = SFT(self.training, steps_done=self.done.get("sft", 0))
        self.phases = [Phase("sft", self.sft_steps, self.sft_step, self.sft.steps_done),
                       Phase("grpo", self.grpo_steps, self.grpo_step, self.done.get("grpo", 0)),
                       Phase("ppo", self.ppo_steps, self.ppo_step, self.done.get("ppo", 0)),
                       Phase("dpo", self.dpo_steps, self.dpo_step, self.done.get("dpo", 0))]
        interrupted = False
        with stop_on_sigint(lambda text: self.console.print(f"[yellow]{text}[/]")) as stop:
            for phase in self.phases:
                if phase.total == 0:
                    continue
                self.run_phase(phase, stop)
                if stop.requested:
                    interrupted = True
                    break
                if phase.name == "sft" and not self.sft_only and "after_sft" not in self.evals:
                    # GRPO starts from the SFT weights with a fresh optimizer and schedule: Adam's
                    # moments from SFT's large gradients would shrink GRPO's first hundreds of steps
                    self.export(self.run_dir / "sft_model")
                    self.training.load_hf(str(self.run_dir / "sft_model"))
                    if self.generation is not None:
                        self.generation.update_weights(self.training.weight_stream())
        return self.stop_interrupted() if interrupted else self.finish()

    def run_phase(self, phase: Phase, stop: Any) -> None:
        """Steps of ``phase`` until it is done or Ctrl-C asks to stop, logging and checkpointing."""
        core = self.config.core
        if phase.name in ("grpo", "ppo", "dpo"):
            {"grpo": self.begin_grpo, "ppo": self.begin_ppo, "dpo": self.begin_dpo}[phase.name]()
            if self.phases[0].total and "after_sft" not in self.evals:
                self.evals["after_sft"] = self.held_out_reward()
                self.console.print(f"held-out {self.measure} after SFT: {self.evals['after_sft']:.3f}")
        with _progress(self.console) as progress:
            bar = progress.add_task(phase.name.upper(), total=phase.total, completed=phase.done, shown="")
            while phase.done < phase.total and not stop.requested:
                begin = time.perf_counter()
                try:
                    metrics = phase.step()
                except RunError as exc:  # a reward, a divergence: say which step met it
                    exc.message += f" (at {phase.name} step {phase.done + 1})"
                    raise
                check_finite(phase.name, phase.done + 1, metrics)
                phase.done += 1
                metrics = {"phase": phase.name, "step": phase.done, **metrics, "time/step": time.perf_counter() - begin}
                self.log.write(metrics, tb_step=self.global_step())
                progress.update(bar, advance=1, shown=_shown(metrics))
                mark(f"{phase.name}:step:{phase.done}")
                every = core.checkpointing.save_period
                if core.checkpointing.enabled and (phase.done % every == 0 or phase.done == phase.total):
                    self.checkpoint()

    def stop_interrupted(self) -> RunResult:
        from corerl.reporting.metrics_log import read_metrics
        from corerl.reporting.plot import plot_curves

        self.checkpoint()
        self.log.close()
        plot_curves(read_metrics(self.log.path), self.run_dir / "curves.png", f"{self.run_dir.name} (interrupted)")
        self.console.print(f"saved a checkpoint at step {self.global_step()}; "
                           f"run the same command with run.name={self.run_dir.name} to resume")
        return RunResult(self.run_dir, {"interrupted_at": {p.name: p.done for p in self.phases}}, interrupted=True)

    def finish(self) -> RunResult:
        from corerl.reporting.metrics_log import read_metrics
        from corerl.reporting.plot import plot_curves

        core, selection, run_dir = self.config.core, self.selection, self.run_dir
        if self.sft_only:
            self.generation.update_weights(self.training.weight_stream())
        if self.uses_dpo:
            figures = self.held_out_preferences()
            self.evals["after"] = figures["preference_accuracy"]
            for name, value in figures.items():
                self.log.scalar(f"eval/held_out_{name}", value, self.global_step())
        else:
            self.evals["after"] = self.held_out_reward()
            self.log.scalar("eval/held_out_reward", self.evals["after"], self.global_step())
        self.log.close()
        self.export(run_dir / "final")
        if self.critic is not None:
            self.ppo.critic_offload.active()
            write_complete(run_dir / "final_critic", lambda work: self.critic.export_hf(str(work)))
        plot_curves(read_metrics(self.log.path), run_dir / "curves.png", run_dir.name)
        measure = "preference_accuracy" if self.uses_dpo else "reward"
        summary = {
            f"held_out_{measure}_before": self.evals["before"],
            f"held_out_{measure}_after_sft": self.evals.get("after_sft"),
            f"held_out_{measure}_after": self.evals["after"], "sft_steps": self.sft_steps,
            "grpo_steps": self.grpo_steps, "ppo_steps": self.ppo_steps, "dpo_steps": self.dpo_steps,
            "steps": self.sft_steps + self.grpo_steps + self.ppo_steps + self.dpo_steps,
            "algorithm": self.algorithm.name,
            "task": selection.task.id, "reward": None if self.uses_dpo else selection.reward.id,
            "training_backend": selection.training_backend.id,
            "generation_backend": None if self.uses_dpo else selection.generation_backend.id,
            "critic_backend": selection.critic_backend.id if selection.critic_backend is not None else None,
        }
        if self.uses_dpo:
            summary.update({f"held_out_{k}_after": v for k, v in figures.items() if k != "preference_accuracy"})
        # its presence says the run finished: all or nothing
        write_file_whole(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        mark("run:end")
        _report(self.console, self.evals, self.measure)
        tensorboard = f"{run_dir / 'tensorboard'}, " if core.run.tensorboard else ""
        critic = f", {run_dir / 'final_critic'} (the critic)" if self.critic is not None else ""
        self.console.print(f"wrote {run_dir / 'metrics.jsonl'}, {tensorboard}{run_dir / 'curves.png'}, "
                           f"{run_dir / 'final'} (Hugging Face checkpoint){critic}")
        return RunResult(run_dir, summary)


def _report(console: Any, evals: dict[str, float], measure: str = "reward") -> None:
    start_label, start = ("SFT start", evals["after_sft"]) if "after_sft" in evals else ("start", evals["before"])
    line = f"held-out {measure}: {evals['before']:.3f} before"
    if "after_sft" in evals:
        line += f", {evals['after_sft']:.3f} after SFT"
    line += f", {evals['after']:.3f} at the end ({(evals['after'] - start) * 100:+.1f} points over the {start_label})"
    console.print(line)


def check_task_fits(task: Any, task_id: str, algorithm: str) -> None:
    """Refuse a task that cannot feed ``algorithm`` (DPO needs preference pairs; GRPO and SFT
    need prompts and demonstrations), in one line naming ``data.task``."""
    from corerl.tasks.preferences import PreferenceSource

    if algorithm == "dpo" and not isinstance(task, PreferenceSource):
        raise ConfigError(f"task {task_id!r} provides no preference pairs, which DPO trains on", key="data.task",
                          hint="use data.task=digit_preference (built in) or data.task=preferences with "
                               "data.train_files (prompt/chosen/rejected rows)")
    if algorithm != "dpo" and not hasattr(task, "sample"):
        raise ConfigError(f"task {task_id!r} provides preference pairs only, which {algorithm.upper()} does not "
                          "train on", key="algorithm.name", hint="set algorithm.name=dpo")


def run_recipe(config: Config, selection: Selection, host: PluginHost) -> int:
    """``corerl run``: run ``config``; returns the exit status (130 when Ctrl-C stopped it)."""
    return EXIT_INTERRUPTED if execute(config, selection, host).interrupted else 0
