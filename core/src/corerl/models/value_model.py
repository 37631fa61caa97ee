"""A critic for PPO: the policy's transformer with a scalar value head, in Hugging Face form.

The critic is ``AutoModelForTokenClassification`` with one label: the policy checkpoint's
backbone weights and a new ``score`` head (zeros, so every value starts at 0 and the first
updates move the head before the backbone). Any training backend that loads a Hugging Face
checkpoint can load and shard it like the policy; :func:`model_values` reads it the way
:func:`corerl.training.logprobs.model_logprobs` reads the policy (padded or packed rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from corerl.models.hf_config import auto_model_class

if TYPE_CHECKING:
    import torch


def load_pretrained(path: str | Path, role: str = "policy", **options: Any) -> Any:
    """The Hugging Face model at ``path`` for ``role`` in float32: a causal LM, or a value model
    whose head runs without dropout (transformers' token classifiers default to 0.1, which would
    make every value noisy). ``options`` go to ``from_pretrained``."""
    import torch
    from transformers import AutoConfig

    if role == "critic":
        config = options.pop("config", None) or AutoConfig.from_pretrained(str(path))
        config.classifier_dropout = 0.0
        options = {"config": config, **options}
    from corerl.models.hf_config import read_hf_config

    return auto_model_class(role, read_hf_config(path)).from_pretrained(str(path), dtype=torch.float32, **options)


def is_value_model(path: str | Path) -> bool:
    """Whether the Hugging Face checkpoint folder ``path`` holds a value model (a token
    classifier with one label) rather than a causal LM."""
    import json

    config = json.loads((Path(path) / "config.json").read_text())
    architectures = config.get("architectures") or []
    return any(a.endswith("ForTokenClassification") for a in architectures) and len(config.get("id2label", {"0": 0})) == 1


def init_value_model(policy_path: str | Path, out: str | Path) -> Path:
    """Write the critic of ``policy_path`` (weights, config, tokenizer) into folder ``out``."""
    import torch
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from corerl.models.hf_save import save_pretrained
    from corerl.models.tokenizer import load_tokenizer_folder

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the head is missing from a causal LM checkpoint by design
    try:
        config = AutoConfig.from_pretrained(str(policy_path), num_labels=1)
        model = load_pretrained(policy_path, "critic", config=config)
    finally:
        hf_logging.set_verbosity(verbosity)
    with torch.no_grad():
        for param in model.score.parameters():
            param.zero_()
    out = Path(out)
    save_pretrained(model, out)
    load_tokenizer_folder(str(policy_path)).save_pretrained(out)
    return out


def model_values(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T]`` float32 values of a critic on a micro-batch, lined up with the logprobs: position
    ``t`` holds the value of the state ``input_ids[:t]``, in which token ``t`` is chosen (the
    head's output at ``t - 1``); 0 at position 0, at each packed sequence's start and on padding.
    A packed micro-batch (with ``position_ids``) runs without a mask, as the policy's does."""
    if "position_ids" in batch:
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
        inside = batch["attention_mask"] * (batch["position_ids"] != 0).to(batch["attention_mask"].dtype)
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        inside = batch["attention_mask"]
    return shift_values(out.logits[..., 0], inside)


def shift_values(head: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
    """The value head's per-position outputs ``[B, T]`` (state after token ``t``) moved one
    place right (state before token ``t``), float32, times ``inside`` (where a value belongs)."""
    import torch

    head = head.float()
    shifted = torch.cat([torch.zeros_like(head[:, :1]), head[:, :-1]], dim=1)
    return shifted * inside.to(torch.float32)
