"""``digit_echo``: the prompt shows a digit; the reward is the share of answer tokens equal to it.

Learnable from scratch by a tiny model in a few dozen GRPO steps on a CPU, which is what the
offline demo needs. Held out: the greedy answer for each of the ten digits.
"""

from __future__ import annotations

import random
from typing import Any

from corerl.generation.contract import Sample


class DigitEcho:
    """Prompts ``<bos> say d :`` for a digit ``d``."""

    def __init__(self, tokenizer: Any, seed: int) -> None:
        self.digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self.prefix = [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("w0")]
        self.colon = tokenizer.convert_tokens_to_ids(":")
        self.rng = random.Random(seed)

    def state(self) -> Any:
        """The sampler's state, JSON-serialisable (for checkpoints)."""
        version, internal, gauss = self.rng.getstate()
        return [version, list(internal), gauss]

    def set_state(self, state: Any) -> None:
        version, internal, gauss = state
        self.rng.setstate((version, tuple(internal), gauss))

    def prompt(self, digit: int) -> list[int]:
        return [*self.prefix, self.digits[digit], self.colon]

    def sample(self, count: int) -> tuple[list[list[int]], list[int]]:
        """``count`` training prompts and their digits."""
        digits = [self.rng.randrange(10) for _ in range(count)]
        return [self.prompt(d) for d in digits], digits

    def held_out(self) -> tuple[list[list[int]], list[int]]:
        return [self.prompt(d) for d in range(10)], list(range(10))

    def reward(self, sample: Sample, digit: int) -> float:
        if not sample.completion_ids:
            return 0.0
        target = self.digits[digit]
        return sum(token == target for token in sample.completion_ids) / len(sample.completion_ids)
