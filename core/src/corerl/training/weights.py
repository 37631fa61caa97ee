"""A training engine's weight stream that says whose weights it carries.

A generation backend that samples with the training engine's own model (``use_training_engine``)
recognises that engine's stream by its ``engine`` attribute and skips the refit: it already
runs on those weights. Everyone else iterates it as ``(Hugging Face name, tensor)`` pairs, under
the transformers model's in-memory names (``model.state_dict()``'s); an engine that loads
checkpoint names (vLLM) renames the stream with :class:`CheckpointNaming` first.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class EngineWeights:
    """``(name, tensor)`` pairs produced by ``produce()`` when iterated (not before); ``engine``
    is the training engine they belong to."""

    def __init__(self, engine: Any, produce: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self.engine = engine
        self._produce = produce

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        yield from self._produce()


def send_weights(training: Any, generation: Any) -> None:
    """A refit: the training engine's weights into the generation engine, or only its adapter
    where it trains a LoRA adapter (``training.adapter_only``; the generation backend's
    ``load_adapter``, see :mod:`corerl.lora.weights`)."""
    if getattr(training, "adapter_only", False):
        generation.load_adapter(training.adapter_weights())
    else:
        generation.update_weights(training.weight_stream())


class CheckpointNaming:
    """Renames a weight stream from a transformers model's in-memory names to its checkpoint names.

    transformers 5 loads some families under other names and shapes than their checkpoints keep:
    a mixture of experts' per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (Mixtral's
    ``block_sparse_moe.experts.{e}.w1/w2/w3``) become the fused ``mlp.experts.gate_up_proj``
    ``[E, 2I, H]`` and ``mlp.experts.down_proj`` ``[E, H, I]``. A training engine streams the
    in-memory form; vLLM's ``load_weights`` and a saved Hugging Face folder take the checkpoint
    form. The reverse is transformers' own (``revert_weight_conversion``, the step ``save_pretrained``
    takes), applied one decoder layer at a time so the stream stays a stream: no per-family table
    here. Names already in checkpoint form, and every name of a family without a conversion,
    pass through unchanged.
    """

    def __init__(self, hf_config: Any, role: str = "policy") -> None:
        import torch
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange

        from corerl.models.value_model import auto_model_class

        with torch.device("meta"):  # only its class and config matter: no memory for weights
            self.model = auto_model_class(role, hf_config).from_config(hf_config)
        # as save_pretrained does for a model not built by from_pretrained: the legacy renamings and
        # prefix changes describe old checkpoints, not the one to write
        conversions = [c for c in get_model_conversion_mapping(self.model, add_legacy=False)
                       if not isinstance(c, PrefixChange)]
        self.model._weight_conversions = conversions or None
        self.converts = bool(conversions)

    def __call__(self, weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        """``weights`` under their checkpoint names (a tensor may become several, views of it)."""
        if not self.converts:
            yield from weights
            return
        from transformers.core_model_loading import revert_weight_conversion

        for _, group in itertools.groupby(weights, key=lambda pair: _layer_of(pair[0])):
            yield from revert_weight_conversion(self.model, dict(group)).items()


def checkpoint_weights(weights: Iterable[tuple[str, Any]], hf_config: Any) -> Iterator[tuple[str, Any]]:
    """``weights`` (in-memory or checkpoint names) under the checkpoint names of ``hf_config``'s
    causal LM (:class:`CheckpointNaming`; build one and keep it where a stream is renamed often)."""
    return CheckpointNaming(hf_config)(weights)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _layer_of(name: str) -> str:
    """The decoder layer a weight belongs to (``"7"``), or the name itself outside the layers: the
    unit within which a conversion may combine several tensors."""
    found = _LAYER.search(name)
    return found.group(1) if found else name
