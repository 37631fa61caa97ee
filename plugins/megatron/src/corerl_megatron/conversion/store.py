"""The one-time Hugging Face -> Megatron conversion and where it is kept.

Converted checkpoints live under the first of ``CORERL_MEGATRON_CHECKPOINT_DIR``,
``NRL_MEGATRON_CHECKPOINT_DIR``, ``$HF_HOME/corerl`` and ``~/.cache/huggingface/corerl``,
in a folder named after the source and a fingerprint of it (its ``config.json`` and the
names, sizes and modification times of its weight files): a changed source gets a new
conversion. A conversion, and the Hugging Face checkpoint exported from one, is a complete
folder (``corerl.complete_folders``): written aside, sealed with a manifest, renamed into
place, so one interrupted halfway is never mistaken for a complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from corerl.sdk import is_complete, write_complete

COMPLETE = "corerl_conversion.json"
WEIGHTS = "megatron.safetensors"
HF_FILES = "hf"  # the source's config and tokenizer, for the way back to Hugging Face


def checkpoint_root(env: dict[str, str] | None = None) -> Path:
    """Where converted checkpoints are kept (see the module docstring for the order)."""
    env = dict(os.environ) if env is None else env
    for name in ("CORERL_MEGATRON_CHECKPOINT_DIR", "NRL_MEGATRON_CHECKPOINT_DIR"):
        if env.get(name):
            return Path(env[name]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "corerl"
    return Path("~/.cache/huggingface/corerl").expanduser()


def fingerprint(source: Path) -> str:
    """A digest of the source checkpoint: config.json's bytes and each weight file's name, size and mtime."""
    digest = hashlib.sha256((source / "config.json").read_bytes())
    for path in sorted(source.glob("*.safetensors")) + sorted(source.glob("*.bin")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def converted_dir(source: Path, root: Path) -> Path:
    return root / f"{source.resolve().name}-{fingerprint(source)}"


def ensure_converted(source: str | Path, *, force: bool = False, root: Path | None = None,
                     converter_type: str | None = None) -> Path:
    """The folder of the Megatron conversion of ``source``, converting now when there is no
    complete one (or ``force``). Returns the folder holding :data:`WEIGHTS`."""
    source = Path(source)
    target = converted_dir(source, root or checkpoint_root())
    if is_complete(target) and not force:
        return target
    return convert_into(source, target, converter_type)


def convert_into(source: Path, target: Path, converter_type: str | None = None) -> Path:
    """Convert ``source`` into the folder ``target`` (replaced), published only when complete."""

    def fill(work: Path) -> None:
        meta = convert_folder(source, work, converter_type)
        (work / COMPLETE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    write_complete(target, fill)
    return target


def load_hf_model_config(source: Path, converter_type: str | None = None) -> tuple[Any, Any, Any]:
    """(Hugging Face config, family, shape) of ``source``; a one-line error for an unknown architecture."""
    from transformers import AutoConfig

    from corerl.sdk import ConfigError
    from corerl_megatron.conversion.convert import Shape
    from corerl_megatron.conversion.families import family_for_checkpoint, no_table_hint

    hf = _base_config(source) or AutoConfig.from_pretrained(source)
    architecture = converter_type or (hf.architectures or ["?"])[0]
    # a critic's value model (a token classifier) has its causal LM's table, with a one-output head
    value_head = architecture.endswith("ForTokenClassification")
    family = family_for_checkpoint(architecture)
    if family is None:
        raise ConfigError(f"no Hugging Face -> Megatron table for {architecture} ({source})",
                          key="policy.megatron_cfg.converter_type", hint=no_table_hint())
    return hf, family, Shape.from_hf_config(hf, family, value_head=value_head)


#: checkpoints whose config ``model_type`` transformers does not ship, read with the config class of
#: the decoder they extend (MiMo: a Qwen2 decoder with multi-token-prediction heads); corerl never
#: runs the Python code such a checkpoint ships
_BASE_MODEL_TYPES = {"mimo": "qwen2"}


def _base_config(source: Path) -> Any:
    path = Path(source) / "config.json"
    if not path.is_file():
        return None
    base = _BASE_MODEL_TYPES.get(json.loads(path.read_text(encoding="utf-8")).get("model_type"))
    if base is None:
        return None
    from transformers import CONFIG_MAPPING
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "a model of type mimo to instantiate a model of type qwen2": as meant
    try:
        return CONFIG_MAPPING[base].from_pretrained(str(source))
    finally:
        hf_logging.set_verbosity(verbosity)


def checkpoint_tensors(source: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint's safetensors files under its stored name, in float32 (what
    transformers' model would hold; its state dict leaves out the multi-token-prediction heads)."""
    import torch
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for path in sorted(Path(source).glob("*.safetensors")):
        state.update(load_file(str(path)))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items() if isinstance(v, torch.Tensor)}


def convert_folder(source: Path, target: Path, converter_type: str | None = None) -> dict[str, Any]:
    """Write the Megatron state dict of the Hugging Face checkpoint ``source`` into ``target``."""
    from safetensors.torch import save_file

    from corerl.sdk import copy_tokenizer, load_pretrained
    from corerl_megatron.conversion.convert import hf_to_megatron

    hf, family, shape = load_hf_model_config(source, converter_type)
    if any(rule.when == "mtp" for rule in family.rules):  # the heads are in the files, not in transformers' model
        hf_state = checkpoint_tensors(source)
    else:
        model = load_pretrained(source, "critic" if shape.value_head else "policy")
        hf_state = {k: v.detach() for k, v in model.state_dict().items()}
    state = hf_to_megatron(hf_state, family, shape)
    save_file(state, str(target / WEIGHTS))
    hf.save_pretrained(target / HF_FILES)
    copy_tokenizer(str(source), str(target / HF_FILES))
    return {"source": str(source.resolve()), "fingerprint": fingerprint(source), "family": family.name,
            "tensors": len(state)}


def export_conversion(folder: Path, target: Path) -> None:
    """Write the Hugging Face checkpoint of a conversion made by :func:`convert_into`."""
    from safetensors.torch import load_file

    from corerl.sdk import ConfigError, write_hf_checkpoint
    from corerl_megatron.conversion.convert import megatron_to_hf

    if not is_complete(folder) or not (folder / COMPLETE).exists():
        raise ConfigError(f"{folder} is not a complete corerl Megatron conversion (unsealed, damaged, or not one at all)",
                          hint="convert a Hugging Face checkpoint first: corerl convert hf-to-megatron SOURCE TARGET")
    hf, family, shape = load_hf_model_config(folder / HF_FILES)
    state = megatron_to_hf(load_file(str(folder / WEIGHTS)), family, shape)
    role = "critic" if shape.value_head else "policy"
    write_complete(target, lambda work: write_hf_checkpoint(state, hf, str(folder / HF_FILES), str(work), role))
