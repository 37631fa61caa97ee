"""The KL reference of a LoRA policy: the same engine with its adapter switched off.

No second copy of the weights is built (a frozen reference group would hold the whole model
again): the reference's logprobs are the policy engine's ``base_logprobs``, the base model's,
which is what the policy started from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AdapterOffReference:
    """A reference engine over ``policy``: ``logprobs`` with the adapter off; nothing to offload
    or shut down (the policy's engine owns the weights)."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def logprobs(self, batch: Any) -> Any:
        """Per-token logprobs of ``batch`` under the base model (the adapter switched off)."""
        return self.policy.base_logprobs(batch)

    def offload(self, parts: Sequence[str] = ()) -> None:
        """Nothing of its own to move: the weights are the policy's."""

    def reload(self, parts: Sequence[str] = ()) -> None:
        """Nothing of its own to move: the weights are the policy's."""

    def shutdown(self) -> None:
        """Nothing of its own to release."""
