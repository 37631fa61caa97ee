"""Writing Hugging Face checkpoints from full Hugging Face-named weights."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def write_hf_checkpoint(state: dict[str, torch.Tensor], source: str, target: str) -> None:
    """Save ``state`` as a Hugging Face checkpoint shaped like ``source`` (config, tokenizer) at ``target``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(source)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    Path(target).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target, state_dict=dict(model.state_dict()))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        log.warning("no tokenizer exported: %s has none that loads (%s)", source, exc)
        return
    tokenizer.save_pretrained(target)
