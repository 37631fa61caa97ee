"""A run's directory and what it starts from: the folder itself (created owner-only, or resumed
from its last complete checkpoint), the model checkpoint and the tokenizer."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from corerl.complete_folders import remove, write_once
from corerl.config import Config
from corerl.errors import ConfigError
from corerl.models.tiny import BUILTIN_MODELS, build_tiny_model
from corerl.run.checkpoints import latest_checkpoint

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


def check_run_dir(config: Config) -> None:
    """Refuse, without creating or writing anything, a run directory the run could not make or
    write (the nearest folder that exists on the way to ``run.output_dir/run.name`` must be a
    writable folder), or one it would refuse to resume or start over in (:func:`check_resumable`)."""
    run = config.core.run
    path = Path(run.output_dir) / (run.name or "")
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    key = "run.name" if run.name and existing == path else "run.output_dir"
    if not existing.is_dir():
        raise ConfigError(f"cannot make the run directory {path}: {existing} is a file, not a folder", key=key,
                          hint="give run.output_dir (and run.name) a folder you can write to")
    if not os.access(existing, os.W_OK | os.X_OK) or os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise ConfigError(f"cannot write the run directory {path}: {existing} is not writable", key=key,
                          hint="give run.output_dir (and run.name) a folder you can write to")
    if run.name and path.is_dir() and latest_checkpoint(path) is None:
        check_resumable(path, run.resume)


def check_resumable(path: Path, resume: str) -> None:
    """Refuse an existing run directory ``path`` without a complete checkpoint that the run would
    not start over in: ``run.resume=must``, or a finished run (not overwritten)."""
    if resume == "must":
        raise ConfigError(f"run directory {path} holds no complete checkpoint to resume from", key="run.resume",
                          hint="set run.resume=auto to start the run over in the same directory")
    if (path / "summary.json").exists():
        raise ConfigError(f"run directory {path} holds a finished run and no checkpoint to resume from", key="run.name",
                          hint="pick another run.name, or delete the directory to run it again")


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
    check_resumable(path, run.resume)
    if leftovers:
        for name in leftovers:
            target = path / name
            remove(target) if target.is_dir() else target.unlink()
        if console is not None:
            console.print(f"run directory {path} holds no complete checkpoint: starting over "
                          f"(removed {', '.join(leftovers)})")
    path.mkdir(parents=True, exist_ok=True)
    return path, None


def resolve_policy_model(policy: Any, run_dir: Path) -> str:
    """``policy.model_name`` as a checkpoint directory: :func:`resolve_model` with the policy's
    ``gguf_file`` and ``dequantize_base_checkpoint``."""
    return resolve_model(policy.model_name, run_dir, policy.gguf_file, dequantize=policy.dequantize_base_checkpoint)


def resolve_model(model_name: str, run_dir: Path, gguf_file: str | None = None, *, key: str = "policy.model_name",
                  folder: str = "base_model", dequantize: bool = False) -> str:
    """A Hugging Face checkpoint directory, building a ``builtin:`` model into the run directory and
    converting a GGUF file (or a packaged model), or with ``dequantize`` a quantised checkpoint
    (``policy.dequantize_base_checkpoint``), into corerl's model cache once. ``key`` is the config
    key errors name; ``folder`` where in the run directory a ``builtin:`` model is built."""
    from corerl.models.gguf import ensure_converted, gguf_source

    check_model(model_name, gguf_file, key=key)
    source = gguf_source(model_name, gguf_file)
    if source is not None:
        return str(ensure_converted(source))
    if dequantize:
        from corerl.models.dequantize import ensure_dequantized, quantization_of

        if quantization_of(model_name) is not None:
            return str(ensure_dequantized(model_name))
    if model_name in BUILTIN_MODELS:
        # a resumed run keeps its base model; a half-built one is rebuilt
        return str(write_once(run_dir / folder, lambda work: build_tiny_model(work, **BUILTIN_MODELS[model_name])))
    return model_name


def check_model(model_name: str, gguf_file: str | None = None, *, key: str = "policy.model_name") -> None:
    """Refuse, building and converting nothing, a model :func:`resolve_model` could not resolve: a
    missing GGUF file or packaged model, an unknown ``builtin:`` name, or a path that is not a
    Hugging Face checkpoint folder with its weights. ``key`` is the config key errors name."""
    from corerl.models.gguf import gguf_source

    if gguf_source(model_name, gguf_file) is not None or model_name in BUILTIN_MODELS:
        return
    if model_name.startswith("builtin:"):
        raise ConfigError(f"unknown built-in model {model_name!r}", key=key,
                          hint=f"built-in models: {', '.join(BUILTIN_MODELS)}")
    if not Path(model_name).exists():
        raise ConfigError(f"model path {model_name} does not exist", key=key,
                          hint="give a local Hugging Face checkpoint folder or a builtin: model; nothing is downloaded")
    if not (Path(model_name) / "config.json").exists():
        raise ConfigError(f"{model_name} is not a Hugging Face checkpoint directory (no config.json)",
                          key=key, hint="give a local checkpoint folder: nothing is downloaded")
    if not any((Path(model_name) / weights).is_file() for weights in WEIGHT_FILES):
        raise ConfigError(f"{model_name} holds no weights (none of {', '.join(WEIGHT_FILES)})", key=key,
                          hint="give a checkpoint folder with its weights, e.g. one written by save_pretrained")


#: the weight files (or their index, for sharded weights) a Hugging Face checkpoint folder holds
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def load_tokenizer(path: str, model_path: str) -> Any:
    """The tokenizer at ``path``; one that cannot be loaded is a one-line error naming the key."""
    from corerl.models.tokenizer import tokenizer_at

    key = "policy.tokenizer_name" if path != model_path else "policy.model_name"
    check_tokenizer(path, key)
    return tokenizer_at(path, key)


def check_tokenizer(path: str, key: str = "policy.tokenizer_name") -> None:
    """Refuse a tokenizer that is not a local folder (a Hub name, such as a NeMo RL recipe's
    ``tokenizer.name``: refused at once, not retried)."""
    if not Path(path).exists():
        raise ConfigError(f"tokenizer {path} is not a local folder, and nothing is downloaded", key=key,
                          hint="give a folder holding the tokenizer files, or unset it to use the model's own "
                               "(in a NeMo RL recipe: policy.tokenizer.name=<the model_name you gave>)")
