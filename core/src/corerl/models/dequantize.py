"""A quantised Hugging Face checkpoint (gpt-oss's MXFP4 experts) as a plain one, to train.

transformers loads an MXFP4 checkpoint for inference only (its quantiser refuses training), and a
generation engine loading the checkpoint itself would hold MXFP4 layers that the trainer's refit,
plain weights, does not fit. With ``policy.dequantize_base_checkpoint`` the checkpoint is
dequantised once, by transformers' own loader (``Mxfp4Config(dequantize=True)``), into a plain
folder in corerl's model cache (:mod:`corerl.models.model_cache`), and every backend and engine
loads that folder. The folder is keyed by the checkpoint's path and its weight files' sizes and
modification times (hashing the weights of a 20B model at every validation would take minutes).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.models.model_cache import cache_root, convert_once

#: ``quantization_config.quant_method`` -> the transformers config class that dequantises it on load
DEQUANTIZERS = {"mxfp4": "Mxfp4Config"}


def quantization_of(model_path: str | Path) -> str | None:
    """The quantisation method of a local checkpoint folder (``config.json``'s
    ``quantization_config.quant_method``), or None for a plain one (or none read here)."""
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    return str(quantization.get("quant_method")) if isinstance(quantization, dict) else None


def check_quantized_checkpoint(model_path: str, dequantize: bool, key: str = "policy.model_name") -> None:
    """Refuse a quantised policy checkpoint that is not to be dequantised (it cannot train), one
    whose method corerl cannot dequantise, and ``policy.dequantize_base_checkpoint`` on a plain one."""
    method = quantization_of(model_path)
    if method is None:
        if dequantize and (Path(model_path) / "config.json").is_file():
            raise ConfigError(f"{model_path} is not quantised (its config.json has no quantization_config)",
                              key="policy.dequantize_base_checkpoint", hint="remove the key")
        return
    if method not in DEQUANTIZERS:
        raise ConfigError(f"{model_path} is quantised with {method!r}, which corerl cannot dequantise to train",
                          key=key, hint=f"give a plain checkpoint, or one quantised with {', '.join(DEQUANTIZERS)}")
    if not dequantize:
        raise ConfigError(f"{model_path} is quantised ({method}), and transformers loads such a checkpoint for "
                          "inference only", key="policy.dequantize_base_checkpoint",
                          hint="set policy.dequantize_base_checkpoint=true (it is dequantised once into corerl's "
                               "model cache)")


def dequantized_folder(model_path: str | Path) -> Path:
    """The cache folder of ``model_path``'s dequantised copy (whether or not it exists yet)."""
    source = Path(model_path).resolve()
    stamp = hashlib.sha256(str(source).encode())
    for weights in sorted(source.glob("*.safetensors*")) + sorted(source.glob("*.bin*")):
        stat = weights.stat()
        stamp.update(f"{weights.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_root() / f"{source.name}-dequantized-{stamp.hexdigest()[:16]}"


def ensure_dequantized(model_path: str | Path) -> Path:
    """``model_path`` dequantised: the cached copy, made now when missing."""
    return convert_once(dequantized_folder(model_path), Path(model_path).name,
                        lambda work: _dequantize(Path(model_path), work))


def _dequantize(source: Path, out: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from corerl.models.hf_save import save_pretrained
    from corerl.models.tokenizer import load_tokenizer_folder

    settings: Any = getattr(transformers, DEQUANTIZERS[str(quantization_of(source))])(dequantize=True)
    loaded = AutoModelForCausalLM.from_pretrained(source, quantization_config=settings)
    state, config = loaded.state_dict(), loaded.config
    del loaded
    if hasattr(config, "quantization_config"):  # a plain checkpoint: the quantisation record goes
        del config.quantization_config
    # a model built afresh: the loaded one would save its experts back through its load-time conversion
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    save_pretrained(model, out)
    try:
        load_tokenizer_folder(source).save_pretrained(out)
    except (OSError, ValueError):  # no tokenizer beside the weights: policy.tokenizer_name names one
        pass
