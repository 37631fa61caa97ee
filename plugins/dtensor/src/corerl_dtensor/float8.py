"""FP8 training on the dtensor backend (``policy.dtensor_cfg.fp8_training``): torchao's float8
training, the library made for it. Each ``nn.Linear`` of the decoder becomes torchao's
``Float8Linear``, whose matrix multiplications run in FP8 through ``torch._scaled_mm`` (on CPU
too) with dynamic tensorwise scales; its weight stays the same parameter (same name, dtype and
optimizer state), so checkpoints, refits and FSDP2's sharding see the model as before.

Left in their precision: the LM head (the logprobs the loss reads), and any linear layer whose
sizes ``torch._scaled_mm`` does not take (a multiple of 16 each way).
"""

from __future__ import annotations

from torch import nn


def takes_float8(module: nn.Module, head: nn.Module | None) -> bool:
    """Whether ``module`` becomes a float8 linear layer: a linear layer that is not the model's
    output embeddings (``head``), both sizes multiples of 16."""
    return (isinstance(module, nn.Linear) and module is not head
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def apply_float8_training(model: nn.Module) -> None:
    """Swap ``model``'s decoder linear layers for torchao's ``Float8Linear`` in place
    (:func:`float8_layers` counts them)."""
    from torchao.float8 import convert_to_float8_training

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    convert_to_float8_training(model, module_filter_fn=lambda module, name: takes_float8(module, head))


def float8_layers(model: nn.Module) -> int:
    """The float8 linear layers ``model`` holds (0 without fp8_training)."""
    return sum(type(module).__name__ == "Float8Linear" for module in model.modules())

