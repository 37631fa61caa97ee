"""What crosses to a generation engine at a LoRA refit: the adapter, not the model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class AdapterWeights:
    """The policy's adapter as ``(PEFT saved name, tensor)`` pairs produced by ``produce()`` when
    iterated (not before), with ``config`` (the ``adapter_config.json`` content a generation engine
    rebuilds PEFT's ``LoraConfig`` from), ``base`` (the Hugging Face folder of the frozen base the
    adapter goes on: the model, or after an SFT warm start the merged ``sft_model``; a generation
    engine on another base restarts on this one first) and ``engine``, the training engine they
    belong to (a generation backend sampling with that engine's own model uses the adapter in
    place and skips the copy)."""

    def __init__(self, engine: Any, config: dict[str, Any], base: str, produce: Callable[[], dict[str, Any]]) -> None:
        self.engine = engine
        self.config = config
        self.base = base
        self._produce = produce

    def tensors(self) -> dict[str, Any]:
        """The adapter's tensors, gathered now."""
        return dict(self._produce())

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        yield from self.tensors().items()
