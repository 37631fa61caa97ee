"""A training engine's weight stream that says whose weights it carries.

A generation backend that samples with the training engine's own model (``use_training_engine``)
recognises that engine's stream by its ``engine`` attribute and skips the refit: it already
runs on those weights. Everyone else iterates it as ``(Hugging Face name, tensor)`` pairs.
"""

from __future__ import annotations

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
