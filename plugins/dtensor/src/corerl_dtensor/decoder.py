"""Where a Hugging Face causal LM keeps its decoder layers, for every technique that lays them
out: tensor parallelism, activation checkpointing and FSDP (:mod:`corerl_dtensor.parallelize`,
which re-exports :func:`decoder_layers`), expert parallelism (:mod:`corerl_dtensor.expert_parallel`)
and the custom plans (:mod:`corerl_dtensor.plans`)."""

from __future__ import annotations

from torch import nn


def _hf_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model, out of PEFT's wrapper where there is one."""
    if hasattr(model, "get_base_model"):  # a LoRA policy: PEFT's PeftModel around the Hugging Face model
        return model.get_base_model()
    return model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Llama/Qwen2-style model (``model.model.layers``) or of a Qwen-VL's
    language model (``model.model.language_model.layers``), inside a PEFT wrapper too."""
    model = _hf_model(model)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:  # a vision-language model: the decoder is its language model
        layers = getattr(getattr(inner, "language_model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no model.layers; give policy.dtensor_cfg.custom_parallel_plan")
    return layers
