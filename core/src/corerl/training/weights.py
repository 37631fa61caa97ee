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


class RefitTally:
    """The weight updates this process sent to a generation engine: how many, and the tensors and
    bytes of the last one (what flowed through the stream the engine read; an engine that shares
    the training engine's model and skips the copy reads none)."""

    def __init__(self) -> None:
        self.updates = 0
        self.tensors = 0
        self.bytes = 0

    def begin(self) -> None:
        """A new update starts: count it, and its tensors and bytes from zero."""
        self.updates += 1
        self.tensors = self.bytes = 0

    def add(self, tensor: Any) -> None:
        self.tensors += 1
        self.bytes += int(tensor.numel()) * int(tensor.element_size()) if hasattr(tensor, "numel") else 0

    def metrics(self) -> dict[str, float]:
        """``refit/updates`` (so far), ``refit/tensors`` and ``refit/bytes`` (the last update's)."""
        return {"refit/updates": float(self.updates), "refit/tensors": float(self.tensors),
                "refit/bytes": float(self.bytes)}


#: this process's weight updates (the driver's: every refit and asynchronous hand-over passes here)
REFITS = RefitTally()


def counted(weights: Any, tally: RefitTally = REFITS) -> Any:
    """``weights`` (a stream of ``(name, tensor)`` pairs, or :class:`EngineWeights`, kept as one)
    counted into ``tally`` as it is read: one update, its tensors and bytes."""
    tally.begin()

    def count(pairs: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in pairs:
            tally.add(tensor)
            yield name, tensor

    if isinstance(weights, EngineWeights):
        return EngineWeights(weights.engine, lambda: count(weights._produce()))
    return count(weights)


def counted_adapter(adapter: Any, tally: RefitTally = REFITS) -> Any:
    """``adapter`` (:class:`corerl.lora.weights.AdapterWeights`) counted into ``tally`` when its
    tensors are gathered: one update."""
    tally.begin()

    def produce() -> Any:
        tensors = adapter._produce()
        for tensor in dict(tensors).values():
            tally.add(tensor)
        return tensors

    return type(adapter)(adapter.engine, adapter.config, adapter.base, produce)


def refit_weights(training: Any) -> Any:
    """What a refit of ``training`` carries, counted in :data:`REFITS`: only its adapter where it
    trains a LoRA adapter (``training.adapter_only``, see :mod:`corerl.lora.weights`), else its
    weight stream."""
    if getattr(training, "adapter_only", False):
        return counted_adapter(training.adapter_weights())
    return counted(training.weight_stream())


def send_weights(training: Any, generation: Any) -> None:
    """A refit: the training engine's weights into the generation engine, or only its adapter
    where it trains a LoRA adapter (the generation backend's ``load_adapter``); counted in
    :data:`REFITS`."""
    weights = refit_weights(training)
    if getattr(training, "adapter_only", False):
        generation.load_adapter(weights)
    else:
        generation.update_weights(weights)


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
