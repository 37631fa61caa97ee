"""A vision-language policy across data-parallel ranks: every rank runs the vision tower in every
forward pass.

Under FSDP (dtensor) and ZeRO-3 (deepspeed) each sharded module's forward is a collective (its
parameters are gathered), and ZeRO-1/2 and DDP reduce the gradient of every trained parameter: a
rank whose micro-batch holds no image (a text-only row, or the empty micro-batch that evens out
the ranks' counts) would skip the vision tower while another rank runs it, and the group would
hang. :func:`run_vision_on_every_rank` runs the tower on a blank image there, its output joined
to the graph times zero. Shared by the training backends through :mod:`corerl.sdk`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: corerl.sdk, which exports this module, stays light
    import torch
    from torch import nn


def _hf_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model, out of PEFT's wrapper where there is one."""
    if hasattr(model, "get_base_model"):  # a LoRA policy: PEFT's PeftModel around the Hugging Face model
        return model.get_base_model()
    return model


def vision_tower(model: nn.Module) -> nn.Module | None:
    """A Qwen-VL's vision tower (``model.model.visual``: its blocks, patch and position
    embeddings, mergers), inside a PEFT wrapper too; None for a text-only model."""
    from torch import nn

    visual = getattr(getattr(_hf_model(model), "model", None), "visual", None)
    return visual if isinstance(visual, nn.Module) else None


def blank_image(visual: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest image ``visual`` takes: one merged patch of zeros, as (pixel values
    ``[merge^2, features]``, grid ``[[1, merge, merge]]``)."""
    import torch

    config = visual.config
    merge = int(getattr(config, "spatial_merge_size", 2))
    features = (int(getattr(config, "in_channels", 3)) * int(getattr(config, "temporal_patch_size", 2))
                * int(config.patch_size) ** 2)
    return (torch.zeros(merge * merge, features, device=device),
            torch.tensor([[1, merge, merge]], dtype=torch.long, device=device))


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a model output (a ModelOutput or a nest of tuples, lists and dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def run_vision_on_every_rank(model: nn.Module) -> bool:
    """Make a vision-language ``model`` run its vision tower in every forward pass: where a
    micro-batch holds no image (a text-only row, or the empty micro-batch that evens out the
    ranks' counts), the tower runs on :func:`blank_image` just before the language model, where
    it runs on real images, and its output joins the graph times zero (the logprobs are
    unchanged; a trained tower gets zero gradients, which its units reduce as the other ranks'
    do). Under FSDP each unit's forward is a collective, so a rank skipping the tower while
    another runs it would hang the group. Returns whether ``model`` has a vision tower."""
    from torch import nn

    inner = getattr(_hf_model(model), "model", None)
    language = getattr(inner, "language_model", None)
    if vision_tower(model) is None or not isinstance(language, nn.Module):
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
        visual = inner.visual  # looked up now: FSDP1 replaces the attribute with its wrapper
        pixels, grid = blank_image(visual, embeds.device)
        touched = sum(t.float().sum() for t in _tensors(visual(pixels, grid_thw=grid)))
        return args, {**kwargs, "inputs_embeds": embeds + (touched * 0).to(embeds.dtype)}

    inner.register_forward_pre_hook(forward_begins, with_kwargs=True)
    vision_tower(model).register_forward_hook(tower_ran)
    language.register_forward_pre_hook(before_language_model, with_kwargs=True)
    return True
