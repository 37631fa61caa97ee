"""``digit_echo``: the prompt shows a digit; the reward is the share of answer tokens equal to it.

Learnable by a tiny model in a few dozen GRPO steps on a CPU, which is what the offline demo
needs. SFT demonstrations say the digit once and stop (``d <eos>``, reward 0.5): the reward
prefers the digit repeated up to the token limit, which only GRPO, learning from the reward,
finds.
Held out: the greedy answer for each of the ten digits.
"""

from __future__ import annotations

import random
from typing import Any

from corerl.generation.contract import Sample
from corerl.tasks import TaskContext, decode_completion, restore_rng, rng_state, score


class DigitEcho:
    """Prompts ``<bos> w0 d :`` for a digit ``d`` over the built-in word-level vocabulary."""

    def __init__(self, context: TaskContext) -> None:
        tokenizer = context.tokenizer
        self.tokenizer = tokenizer
        self.digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self.prefix = [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("w0")]
        self.colon = tokenizer.convert_tokens_to_ids(":")
        self.eos = tokenizer.eos_token_id
        self.custom_reward = context.reward
        self.rng = random.Random(context.seed)

    def state(self) -> Any:
        return rng_state(self.rng)

    def set_state(self, state: Any) -> None:
        restore_rng(self.rng, state)

    def prompt(self, digit: int) -> list[int]:
        return [*self.prefix, self.digits[digit], self.colon]

    def sample(self, count: int) -> tuple[list[list[int]], list[int]]:
        """``count`` training prompts and their digits."""
        digits = [self.rng.randrange(10) for _ in range(count)]
        return [self.prompt(d) for d in digits], digits

    def held_out(self) -> tuple[list[list[int]], list[int]]:
        return [self.prompt(d) for d in range(10)], list(range(10))

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        digits = [self.rng.randrange(10) for _ in range(count)]
        return [(self.prompt(d), [self.digits[d], self.eos]) for d in digits]

    def reward(self, sample: Sample, digit: int) -> float:
        if self.custom_reward is not None:
            example = {"prompt": f"w0 {digit} :", "answer": str(digit)}
            return score(self.custom_reward, decode_completion(self.tokenizer, sample), example, "data.reward",
                         f"the digit_echo prompt {example['prompt']!r}")
        if not sample.completion_ids:
            return 0.0
        target = self.digits[digit]
        return sum(token == target for token in sample.completion_ids) / len(sample.completion_ids)
