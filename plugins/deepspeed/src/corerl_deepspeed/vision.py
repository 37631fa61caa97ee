"""A vision-language policy (a Qwen-VL: ``model.model.visual`` beside ``model.model.language_model``)
across DeepSpeed ranks: every rank runs the vision tower in every forward pass.

ZeRO-3 gathers each module's partitioned parameters as the module runs (a collective over the
ranks), and ZeRO-1/2 reduce the gradients of every trained parameter; a rank whose micro-batch
holds no image (a text-only row, or the empty micro-batch that evens out the ranks' counts)
would skip the tower while another rank runs it, and the group would hang. The same as the
dtensor backend's ``run_vision_on_every_rank`` (``corerl_dtensor.parallelize``); plugins share
no code but the SDK's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _hf_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model, out of PEFT's wrapper where there is one."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def vision_tower(model: nn.Module) -> nn.Module | None:
    """A Qwen-VL's vision tower (``model.model.visual``), inside a PEFT wrapper too; None for a text-only model."""
    visual = getattr(getattr(_hf_model(model), "model", None), "visual", None)
    return visual if isinstance(visual, nn.Module) else None


def blank_image(visual: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest image ``visual`` takes: one merged patch of zeros, as (pixel values
    ``[merge^2, features]``, grid ``[[1, merge, merge]]``)."""
    config = visual.config
    merge = int(getattr(config, "spatial_merge_size", 2))
    features = (int(getattr(config, "in_channels", 3)) * int(getattr(config, "temporal_patch_size", 2))
                * int(config.patch_size) ** 2)
    return (torch.zeros(merge * merge, features, device=device),
            torch.tensor([[1, merge, merge]], dtype=torch.long, device=device))


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (a ModelOutput or a nest of tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def run_vision_on_every_rank(model: nn.Module) -> bool:
    """Make a vision-language ``model`` run its vision tower in every forward pass: where a
    micro-batch holds no image, the tower runs on :func:`blank_image` just before the language
    model (where it runs on real images, so the modules run in the same order on every rank),
    and its output joins the graph times zero (the logprobs are unchanged; a trained tower gets
    zero gradients). Register before ``deepspeed.initialize``, so that this runs before ZeRO-3's
    own hook on the language model. Returns whether ``model`` has a vision tower."""
    inner = getattr(_hf_model(model), "model", None)
    language = getattr(inner, "language_model", None)
    visual = vision_tower(model)
    if visual is None or not isinstance(language, nn.Module):
        return False
    ran = [False]

    def forward_begins(module: nn.Module, args: Any, kwargs: Any) -> None:
        ran[0] = False

    def tower_ran(module: nn.Module, args: Any, output: Any) -> None:
        ran[0] = True

    def before_language_model(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        embeds = kwargs.get("inputs_embeds")
        if ran[0] or embeds is None:
            return None
        pixels, grid = blank_image(visual, embeds.device)
        touched = sum(t.float().sum() for t in _tensors(visual(pixels, grid_thw=grid)))
        return args, {**kwargs, "inputs_embeds": embeds + (touched * 0).to(embeds.dtype)}

    inner.register_forward_pre_hook(forward_begins, with_kwargs=True)
    visual.register_forward_hook(tower_ran)
    language.register_forward_pre_hook(before_language_model, with_kwargs=True)
    return True
