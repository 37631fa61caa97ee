"""``data.full_context``: a memory check. The run's task is wrapped so that every training batch
is made-up token sequences of the full context length, the longest the run allows, and a run
shows whether its settings hold that much in memory before real data is trained on.

- SFT's demonstrations are ``policy.max_seq_length`` tokens each, all of them trained on (a
  one-token prompt, then a response ending with the end-of-sequence token).
- GRPO's and PPO's prompts are ``policy.max_seq_length - policy.generation.max_new_tokens``
  tokens, so that a completion of ``max_new_tokens`` tokens fills the context (with
  ``policy.generation.ignore_eos`` every completion runs that long); each completion's reward is
  0 or 1 at random, so that the advantages are not all zero and the whole update runs.

The tokens are one ordinary token of the vocabulary, drawn at random per sequence and repeated.
Held-out evaluation keeps the task's own prompts and rewards. What the run learns means nothing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.tasks import restore_rng, rng_state

#: the column marking the example of a made-up prompt (its reward is drawn at random)
MADE_UP = "_corerl_full_context"


class FullContextTask:
    """``task`` with its training batches replaced by full-length made-up sequences
    (:mod:`corerl.tasks.full_context`)."""

    def __init__(self, task: Any, tokenizer: Any, seed: int, max_seq_length: int, max_new_tokens: int) -> None:
        if not hasattr(task, "sample"):
            raise ConfigError("data.full_context makes up prompts and demonstrations, and the task provides "
                              "preference pairs", key="data.full_context",
                              hint="set data.full_context=false, or check memory with an SFT or GRPO run")
        self.task, self.rng = task, random.Random(seed)
        self.sequence_tokens = max_seq_length
        self.prompt_tokens = max(1, max_seq_length - max_new_tokens)
        special = set(getattr(tokenizer, "all_special_ids", ()) or ())
        self.tokens = [i for i in range(len(tokenizer)) if i not in special]
        self.eos = tokenizer.eos_token_id

    def _sequence(self, length: int) -> list[int]:
        return [self.rng.choice(self.tokens)] * length

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        """``count`` prompts of :attr:`prompt_tokens` tokens."""
        return [self._sequence(self.prompt_tokens) for _ in range(count)], [{MADE_UP: i} for i in range(count)]

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        """``count`` demonstrations of :attr:`sequence_tokens` tokens, all but the first trained on."""
        pairs = []
        for _ in range(count):
            prompt, response = self._sequence(1), self._sequence(self.sequence_tokens - 2)
            pairs.append((prompt, [*response, self.eos]))
        return pairs

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        return self.task.held_out()  # type: ignore[no-any-return]

    def reward(self, sample: Sample, example: Any) -> float:
        if isinstance(example, Mapping) and MADE_UP in example:
            return float(self.rng.randint(0, 1))
        return float(self.task.reward(sample, example))

    def state(self) -> Any:
        return {"task": self.task.state(), "rng": rng_state(self.rng)}

    def set_state(self, state: Any) -> None:
        self.task.set_state(state["task"])
        restore_rng(self.rng, state["rng"])

    def __getattr__(self, name: str) -> Any:  # the task's other methods (a plugin's)
        if name == "task":  # not set yet (or being unpickled): not the task's
            raise AttributeError(name)
        return getattr(self.task, name)
