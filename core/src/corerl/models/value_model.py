"""A critic for PPO: the policy's transformer with a scalar value head, in Hugging Face form.

The critic is ``AutoModelForTokenClassification`` with one label: the policy checkpoint's
backbone weights and a new ``score`` head (zeros, so every value starts at 0 and the first
updates move the head before the backbone). Any training backend that loads a Hugging Face
checkpoint can load and shard it like the policy; :func:`model_values` reads it the way
:func:`corerl.training.logprobs.model_logprobs` reads the policy (padded or packed rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def init_value_model(policy_path: str | Path, out: str | Path) -> Path:
    """Write the critic of ``policy_path`` (weights, config, tokenizer) into folder ``out``."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the head is missing from a causal LM checkpoint by design
    try:
        model = AutoModelForTokenClassification.from_pretrained(str(policy_path), num_labels=1, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    with torch.no_grad():
        for param in model.score.parameters():
            param.zero_()
    out = Path(out)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(policy_path)).save_pretrained(out)
    return out


def model_values(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T]`` float32 values of a critic on a micro-batch: position ``t`` holds the value of
    the state after ``input_ids[: t + 1]``; 0 on padding. A packed micro-batch (with
    ``position_ids``) runs without a mask, as the policy's does."""
    import torch

    if "position_ids" in batch:
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    else:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    return out.logits[..., 0].float() * batch["attention_mask"].to(torch.float32)
