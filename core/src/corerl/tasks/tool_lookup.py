"""``tool_lookup``: the answer is only reachable through a tool call.

Each episode hides a digit: the prompt ``<bos> w1 :`` asks for it, the ``lookup`` tool returns
it, and the reward (the ``tools`` environment's final answer, ``exact_answer``) is 1 when the
model's last turn is that digit. The digit is drawn anew for every episode, so a policy that
does not call the tool succeeds one time in ten at best.

A full episode over the built-in tiny model's words (:data:`corerl.models.tiny.TOOL_WORDS`)::

    <bos> w1 :  <tool_call> {"name": "lookup", "arguments": {}} </tool_call> <eos>
    <tool_response> 4 </tool_response>  4 <eos>

SFT demonstrations are whole episodes (the tool's response masked out of the loss) from a lazy
demonstrator: most of them answer at once with a guess, the others call the tool and read it.
After SFT the greedy policy guesses (right one time in ten); GRPO, learning from the reward,
finds that the tool pays and makes calling it the rule.
Held out: ten episodes whose digits are fixed by the run's seed.
"""

from __future__ import annotations

import random
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.models.tiny import TOOL_WORDS
from corerl.tasks import TaskContext, decode_completion, restore_rng, rng_state
from corerl.tasks.rewards import exact_answer

#: the share of demonstrations that guess instead of calling the tool
LAZY_SHARE = 0.7


def lookup(*, row: dict[str, Any]) -> str:
    """The ``lookup`` tool: the episode's hidden digit."""
    return str(row["value"])


class ToolLookup:
    """Prompts and episode rows of the lookup task (see the module's docstring)."""

    def __init__(self, context: TaskContext) -> None:
        tokenizer = context.tokenizer
        vocabulary = tokenizer.get_vocab()
        missing = [w for w in TOOL_WORDS if w not in vocabulary]
        if missing:
            raise ConfigError(f"the tool_lookup task is spelled in the built-in tiny model's words, and this tokenizer "
                              f"lacks {missing[0]!r}", key="data.task",
                              hint="use policy.model_name=builtin:tiny-qwen2 (or a model built by corerl's build_tiny_model)")
        self.tokenizer = tokenizer
        self.rng = random.Random(context.seed)
        self.held_out_values = [random.Random(f"{context.seed}:{k}").randrange(10) for k in range(10)]

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self) -> list[int]:
        return [self.tokenizer.bos_token_id, *self.ids("w1 :")]

    def call(self) -> list[int]:
        return self.ids('<tool_call> {"name": "lookup", "arguments": {}} </tool_call>')

    @staticmethod
    def row(value: int) -> dict[str, Any]:
        return {"value": value, "answer": str(value)}

    def sample(self, count: int) -> tuple[list[list[int]], list[dict[str, Any]]]:
        rows = [self.row(self.rng.randrange(10)) for _ in range(count)]
        return [self.prompt() for _ in rows], rows

    def held_out(self) -> tuple[list[list[int]], list[dict[str, Any]]]:
        rows = [self.row(value) for value in self.held_out_values]
        return [self.prompt() for _ in rows], rows

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int], list[int]]]:
        """Whole episodes from a lazy demonstrator: :data:`LAZY_SHARE` of them answer at once
        with a guess (always ``0``), the others call the tool and answer with its digit."""
        eos = self.tokenizer.eos_token_id
        out = []
        for _ in range(count):
            value = self.rng.randrange(10)
            if self.rng.random() < LAZY_SHARE:
                answer = [*self.ids("0"), eos]
                out.append((self.prompt(), answer, [1] * len(answer)))
                continue
            call, response = [*self.call(), eos], self.ids(f"<tool_response> {value} </tool_response>")
            answer = [*self.ids(str(value)), eos]
            out.append((self.prompt(), call + response + answer, [1] * len(call) + [0] * len(response) + [1] * len(answer)))
        return out

    def reward(self, sample: Sample, row: dict[str, Any]) -> float:
        """One turn only (no environment): the completion is the answer."""
        return exact_answer(decode_completion(self.tokenizer, sample), row)

    def state(self) -> Any:
        return rng_state(self.rng)

    def set_state(self, state: Any) -> None:
        restore_rng(self.rng, state)
