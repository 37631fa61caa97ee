"""What a memory estimate needs to know of a model: :class:`ModelShape`, a model fact read from
its Hugging Face ``config.json``, lives in :mod:`corerl.models.shape` (below the engines and the
planner); this path keeps importing it."""

from __future__ import annotations

from corerl.models.shape import EXPERT_COUNT_KEYS, ModelShape

__all__ = ["EXPERT_COUNT_KEYS", "ModelShape"]
