"""Preference pairs for DPO: what a preference task provides, the built-in ``digit_preference``
task (made in code) and the ``preferences`` task (JSONL/Parquet rows with a prompt and a chosen
and a rejected response).

A pair is ``(prompt ids, chosen response ids, rejected response ids)``; responses end with the
end-of-sequence token.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from corerl.errors import ConfigError
from corerl.reporting.lost_text import check_prompts
from corerl.tasks import Epochs, TaskContext
from corerl.tasks.dataset import (
    ORIGIN,
    as_list,
    check_columns,
    read_sliced,
    read_template,
    row_slices,
    split_rows,
)
from corerl.tasks.prompts import chat_text, encode_text

PreferencePair = tuple[list[int], list[int], list[int]]


@runtime_checkable
class PreferenceSource(Protocol):
    """The methods a task provides for DPO (token ids; responses end with end-of-sequence)."""

    def train_pairs(self) -> Sequence[PreferencePair]:
        """Every training pair (the reference scores them all once when precomputed)."""

    def draw(self, count: int) -> list[int]:
        """Indices into :meth:`train_pairs` of the next ``count`` pairs, in shuffled epochs."""

    def held_out_pairs(self) -> list[PreferencePair]:
        """The held-out pairs (scored before and after training)."""

    def state(self) -> Any:
        """The sampler's position, JSON-serialisable (saved with checkpoints)."""

    def set_state(self, state: Any) -> None:
        """Restore what :meth:`state` returned."""


class DigitPreference:
    """``<bos> w0 d :`` for a digit ``d``: the chosen response repeats it (``d d d <eos>``), the
    rejected one repeats another digit ``e``. Of the 90 (d, e) combinations, 18 (picked by the
    seed) are held out: each held-out pair puts a wrong answer against the right one in a
    combination training never showed. The random starting model ranks about half of them
    right; the built-in tiny model learns the preference in well under a minute of DPO on a CPU.
    (A rule that needs copying a position, such as preferring the first of two digits, is not
    learnt from scratch by DPO in that time.)"""

    REPEATS = 3
    HELD_OUT = 18

    def __init__(self, context: TaskContext) -> None:
        tokenizer = context.tokenizer
        self.digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
        self.prefix = [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("w0")]
        self.colon = tokenizer.convert_tokens_to_ids(":")
        self.eos = tokenizer.eos_token_id
        combos = list(itertools.permutations(range(10), 2))
        random.Random(context.seed).shuffle(combos)
        self.held, self.train = combos[:self.HELD_OUT], combos[self.HELD_OUT:]
        self.epochs = Epochs(len(self.train), random.Random(context.seed + 1))

    def pair(self, digit: int, wrong: int) -> PreferencePair:
        prompt = [*self.prefix, self.digits[digit], self.colon]
        chosen = [self.digits[digit]] * self.REPEATS + [self.eos]
        rejected = [self.digits[wrong]] * self.REPEATS + [self.eos]
        return prompt, chosen, rejected

    def train_pairs(self) -> list[PreferencePair]:
        return [self.pair(*combo) for combo in self.train]

    def draw(self, count: int) -> list[int]:
        return self.epochs.draw(count)

    def held_out_pairs(self) -> list[PreferencePair]:
        return [self.pair(*combo) for combo in self.held]

    @property
    def train_rows(self) -> int:
        """The training pairs one epoch draws (``algorithm.max_epochs`` counts by them)."""
        return self.epochs.size

    def state(self) -> Any:
        return self.epochs.state()

    def set_state(self, state: Any) -> None:
        self.epochs.set_state(state)


class PreferenceDataset:
    """Rows with a prompt and a chosen and a rejected response (``data.prompt_key``,
    ``data.chosen_key``, ``data.rejected_key``) from ``data.train_files``; the held-out split as
    for the ``dataset`` task. A prompt is text (wrapped in the chat template with
    ``data.apply_chat_template``) or a list of chat messages; a response is text or a list of
    messages (then the chat template renders prompt and response, and the response is what it
    adds after the prompt). Every row is checked before training starts."""

    def __init__(self, context: TaskContext) -> None:
        data = context.data
        self.tokenizer, self.max_tokens = context.tokenizer, context.max_prompt_tokens
        self.keys = {"prompt_key": data.prompt_key, "chosen_key": data.chosen_key, "rejected_key": data.rejected_key}
        self.chat, self.template = data.apply_chat_template, read_template(data.prompt_file)
        files = as_list(data.train_files)
        if data.hub_dataset and not files:
            raise ConfigError(f"{data.hub_dataset!r} is a Hugging Face Hub dataset, and nothing is downloaded",
                              key="data.hub_dataset", hint="give a local JSONL/Parquet file of pairs: "
                              "data.train_files=pairs.jsonl (in a NeMo RL recipe: data.train.data_path=pairs.jsonl)")
        if not files:
            raise ConfigError("the preferences task needs data.train_files", key="data.train_files",
                              hint="set data.train_files=path/to/pairs.jsonl (rows with prompt, chosen and rejected)")
        rows = read_sliced(files, "data.train_files", row_slices(data.train_rows, files, "data.train_rows"),
                           data.max_train_rows)
        check_columns(rows, self.keys, "data.train_files", files)
        rng = random.Random(context.seed)
        train_rows, held_rows = split_rows(rows, data, self.keys, rng)
        self.encoded: list[tuple[str, list[int], str]] = []  # every text encoded, for the lost-text check
        self.train = [self._encode(row) for row in train_rows]
        self.held = [self._encode(row) for row in held_rows]
        check_prompts(self.tokenizer, f"task {getattr(data, 'task', 'preferences')!r}", self.encoded,
                      what="prompts and responses")
        self.encoded.clear()
        self.epochs = Epochs(len(self.train), rng)

    def _chat(self, messages: Sequence[Any], row: dict[str, Any], prompt: bool) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"{row[ORIGIN]} holds chat messages and the tokenizer has no chat template",
                              key="policy.chat_template", hint="set policy.chat_template, or give the rows as text")
        try:
            text = chat_text(self.tokenizer, messages, prompt=prompt)
        except Exception as exc:  # the template is the user's (or the model's): say which row it failed on
            raise ConfigError(f"{row[ORIGIN]}: the chat template failed on its messages ({exc})",
                              key="data.train_files", hint="each message needs a role and a content") from None
        return self._encoded(text, encode_text(self.tokenizer, text), row)

    def _encoded(self, text: str, ids: list[int], row: dict[str, Any]) -> list[int]:
        self.encoded.append((text, ids, str(row[ORIGIN])))
        return ids

    def _prompt(self, row: dict[str, Any]) -> list[int]:
        value = row[self.keys["prompt_key"]]
        if isinstance(value, list):
            return self._chat(value, row, prompt=True)
        text = self.template.format(value) if self.template is not None else str(value)
        if self.chat:
            return self._chat([{"role": "user", "content": text}], row, prompt=True)
        ids = self._encoded(text, encode_text(self.tokenizer, text), row)
        bos = self.tokenizer.bos_token_id
        return [bos, *ids] if bos is not None else ids

    def _response(self, row: dict[str, Any], key: str, prompt: list[int]) -> list[int]:
        value = row[self.keys[key]]
        if isinstance(value, list):
            messages = row[self.keys["prompt_key"]]
            if not isinstance(messages, list):
                messages = [{"role": "user", "content": str(messages)}]
            full = self._chat([*messages, *value], row, prompt=False)
            if full[:len(prompt)] != prompt:
                raise ConfigError(f"{row[ORIGIN]}: the chat template renders the conversation with a different "
                                  f"start than the prompt alone, so the {key[:-4]} response cannot be cut out",
                                  key="policy.chat_template", hint="use a template whose prompt is a prefix of the "
                                  "whole conversation, or give the responses as text")
            return full[len(prompt):]
        text = " " + str(value)
        ids = self._encoded(text, encode_text(self.tokenizer, text), row)
        return [*ids, self.tokenizer.eos_token_id]

    def _encode(self, row: dict[str, Any]) -> PreferencePair:
        prompt = self._prompt(row)
        chosen, rejected = self._response(row, "chosen_key", prompt), self._response(row, "rejected_key", prompt)
        longest = len(prompt) + max(len(chosen), len(rejected))
        if self.max_tokens is not None and longest > self.max_tokens + 1:  # max_prompt_tokens = max_seq_length - 1
            raise ConfigError(
                f"{row[ORIGIN]}: prompt and response take {longest} tokens, more than policy.max_seq_length "
                f"({self.max_tokens + 1})", key="policy.max_seq_length",
                hint=f"pairs are not truncated: raise policy.max_seq_length to at least {longest}, or remove that row")
        if not chosen or not rejected:
            raise ConfigError(f"{row[ORIGIN]}: an empty response", key="data.train_files",
                              hint="every pair needs a non-empty chosen and rejected response")
        return prompt, chosen, rejected

    def train_pairs(self) -> list[PreferencePair]:
        return self.train

    def draw(self, count: int) -> list[int]:
        return self.epochs.draw(count)

    def held_out_pairs(self) -> list[PreferencePair]:
        return list(self.held)

    @property
    def train_rows(self) -> int:
        """The training pairs one epoch draws (``algorithm.max_epochs`` counts by them)."""
        return self.epochs.size

    def state(self) -> Any:
        return self.epochs.state()

    def set_state(self, state: Any) -> None:
        self.epochs.set_state(state)


class DigitEchoPreference(DigitPreference):
    """Pairs of answers such as a policy samples on ``digit_echo``: 1 to 6 tokens, each the
    prompt's digit or any other word of the vocabulary, ending with end-of-sequence unless cut at
    6; the one ``digit_echo`` scores higher (its share of tokens equal to the digit) is chosen.
    2,000 training and 200 held-out pairs, fixed by the seed. A reward model trained on them scores
    the task on the kind of answers GRPO explores (``digit_preference``'s answers are all three
    repeats, and a reward model trained on those was measured to be exploited by GRPO)."""

    TRAIN = 2000
    HELD_OUT = 200
    LONGEST = 6

    def __init__(self, context: TaskContext) -> None:
        super().__init__(context)
        self.vocabulary = len(context.tokenizer)
        rng = random.Random(context.seed + 2)
        pairs = [self.sampled_pair(rng) for _ in range(self.TRAIN + self.HELD_OUT)]
        self.train_list, self.held_list = pairs[:self.TRAIN], pairs[self.TRAIN:]
        self.epochs = Epochs(len(self.train_list), random.Random(context.seed + 1))

    def answer(self, rng: random.Random, target: int) -> list[int]:
        share = rng.random()
        others = [w for w in range(4, self.vocabulary) if w != target]
        # half the answers repeat one wrong digit: a reward model must compare with the prompt,
        # not count repeats (one trained without them scored any repeated digit high)
        wrong = rng.choice([d for d in self.digits if d != target]) if rng.random() < 0.5 else None
        words = [target if rng.random() < share else wrong if wrong is not None else rng.choice(others)
                 for _ in range(rng.randint(1, self.LONGEST))]
        return words if len(words) == self.LONGEST and rng.random() < 0.5 else [*words, self.eos]

    def sampled_pair(self, rng: random.Random) -> PreferencePair:
        digit = rng.randrange(10)
        target = self.digits[digit]
        while True:
            first, second = self.answer(rng, target), self.answer(rng, target)
            scores = [sum(w == target for w in a) / len(a) for a in (first, second)]
            if scores[0] != scores[1]:
                chosen, rejected = (first, second) if scores[0] > scores[1] else (second, first)
                return [*self.prefix, target, self.colon], chosen, rejected

    def train_pairs(self) -> list[PreferencePair]:
        return list(self.train_list)

    def held_out_pairs(self) -> list[PreferencePair]:
        return list(self.held_list)
