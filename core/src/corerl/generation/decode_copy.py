"""A 16-bit copy of a float32 training model to decode with, for the hf backend's static KV cache.

The training model beside the hf backend (dtensor at world size 1) keeps float32 weights and runs
under bf16/fp16 autocast. transformers' static cache is allocated in the weights' dtype, while
autocast hands it keys in float32 (rotary embeddings) and values in 16 bits, so ``generate()``
cannot use it; the dynamic cache works but launches every kernel from Python at each step. A copy
of the weights in 16 bits decodes without autocast, with the static cache and the CUDA graphs
transformers compiles for it: the cost is two bytes a parameter and one in-place cast-copy of the
weights before each call (the copy's tensors keep their addresses, which the graphs captured).

Written here rather than taken from a library: transformers has no "lower-precision view" of a
model, and ``copy.deepcopy`` alone would duplicate the float32 weights and the gradients first and
carry the training side's forward hooks (bound to its workers) along.
"""

from __future__ import annotations

import copy
from typing import Any


class DecodeCopy:
    """A copy of a training model in ``dtype``, built on first use and refreshed in place after."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype
        self.model: Any = None
        self.source: Any = None  # the training model the copy was built from

    def refreshed_from(self, source: Any) -> Any:
        """The copy with ``source``'s current weights; rebuilt when ``source`` is another model
        object than last time (the runner reloads the training engine after SFT)."""
        import torch

        with torch.no_grad():
            if self.model is None or self.source is not source:
                self.model, self.source = None, None  # the old copy goes before the new one is made
                self.model, self.source = low_precision_copy(source, self.dtype), source
            else:
                for mine, theirs in zip(self.model.parameters(), source.parameters(), strict=True):
                    mine.copy_(theirs)
        return self.model


def low_precision_copy(model: Any, dtype: Any) -> Any:
    """``model`` copied with every floating-point parameter in ``dtype`` (buffers, such as rotary
    frequencies, keep theirs), no gradients and no hooks."""
    import torch

    memo: dict[int, Any] = {}
    for parameter in model.parameters():  # tied parameters are one object: one copy, still tied
        target = dtype if parameter.is_floating_point() else parameter.dtype
        memo[id(parameter)] = torch.nn.Parameter(parameter.detach().to(dtype=target, copy=True), requires_grad=False)
    for module in model.modules():  # the training side's hooks stay with it
        for name, value in vars(module).items():
            if name.startswith("_") and "hooks" in name and isinstance(value, dict):
                memo[id(value)] = type(value)()
    return copy.deepcopy(model, memo)
