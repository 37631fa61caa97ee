"""The real tasks (corerl.tasks.real_tasks): gsm_symbolic and arithmetic (reasoning-gym) and game24
(tree-of-thoughts-llm), their verifiers, fixed splits, prompts and missing-package errors."""

from __future__ import annotations

import importlib.util
import sys
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import pytest

from corerl.config.schema import DataConfig
from corerl.errors import ConfigError, RunError
from corerl.generation.contract import Sample
from corerl.models.tiny import build_tokenizer
from corerl.tasks import TaskContext, TaskSource
from corerl.tasks.expression_reward import (
    evaluate_expression,
    expression_answer,
    extract_expression,
    solve,
)

HAS_GYM = importlib.util.find_spec("reasoning_gym") is not None
HAS_TOT = importlib.util.find_spec("tot") is not None
HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None
needs_gym = pytest.mark.skipif(not (HAS_GYM and HAS_MATH_VERIFY),
                               reason="pip install --no-deps reasoning-gym==0.1.25 (docs/real-tasks.md)")
needs_tot = pytest.mark.skipif(not HAS_TOT, reason="pip install --no-deps tree-of-thoughts-llm==0.1.0")

PUZZLE = {"numbers": [4, 9, 10, 13], "target": 24}


class CharTokenizer:
    """A character-level stand-in for a tokenizer: every text round-trips exactly."""

    bos_token_id, eos_token_id = 1, 2
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) + 3 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i - 3) for i in ids if i > 2)


def context(tokenizer: Any = None, seed: int = 0, reward: Any = None, **data: Any) -> TaskContext:
    return TaskContext(tokenizer or CharTokenizer(), seed=seed, data=attrs.evolve(DataConfig(), **data), reward=reward)


def completion(tokenizer: Any, text: str) -> Sample:
    ids = (*tokenizer.encode(text), tokenizer.eos_token_id)
    return Sample(prompt_ids=(1,), completion_ids=ids, logprobs=(0.0,) * len(ids), finish_reason="stop")


# --- the expression verifier (no package needed) ---


@pytest.mark.parametrize("text", [
    "\\boxed{(13 - 9) * (10 - 4)}",
    "Let me think.\n(13-9)*(10-4)",
    "(13 - 9) * (10 - 4) = 24",
    "24 = (10 - 4) * (13 - 9)",
    "#### (13 - 9) * (10 - 4)",
    "$\\boxed{\\left(13 - 9\\right) \\times (10 - 4)}$",
    "so (13 − 9) × (10 − 4).",
    "Answer: (13 - 9) * (10 - 4)",
])
def test_a_correct_expression_scores_one(text: str) -> None:
    assert expression_answer(text, PUZZLE) == 1.0


@pytest.mark.parametrize("text", [
    "\\boxed{(13 - 9) * (10 + 4)}",  # the numbers, the wrong value
    "\\boxed{(13 - 9) * 6}",  # 6 is not given
    "\\boxed{4 * 6}",  # two numbers missing
    "\\boxed{(13 - 9) * (10 - 4) * 1}",  # an extra number
    "\\boxed{(13 - 9) * (10 - 4) + 4 - 4}",  # 4 used three times
    "\\boxed{24}",
    "\\boxed{(13.0 - 9) * (10 - 4)}",  # a decimal is not one of the numbers
    "\\boxed{-(4 - 13) * 10 - 9 * 4}",  # unary minus is not allowed
    "-(10 - 4) * (13 - 9)",  # -24: the sign is kept, not dropped with the words
    "The answer is -(10 - 4) * (13 - 9)",
    "I give up",
    "",
    "\\boxed{(13 - 9) * (10 - 4)",  # an unclosed box: the last line is read, and it is not an expression
    "\\boxed{(13 - 9 * (10 - 4)}",  # unbalanced parentheses
])
def test_a_wrong_or_malformed_expression_scores_zero(text: str) -> None:
    assert expression_answer(text, PUZZLE) == 0.0


def test_division_is_exact() -> None:
    # 8 / (3 - 8/3) is exactly 24; in floating point it is 23.999999999999993
    assert expression_answer("\\boxed{8 / (3 - 8 / 3)}", {"numbers": "3 3 8 8", "target": 24}) == 1.0
    assert evaluate_expression("8 / (3 - 8 / 3)", [3, 3, 8, 8]) == Fraction(24)
    assert expression_answer("\\boxed{8 / 3 * 3 * 3}", {"numbers": [3, 3, 8, 3], "target": 24}) == 1.0
    assert expression_answer("\\boxed{(8 + 3) / 3 * 8}", {"numbers": [3, 3, 8, 8], "target": 24}) == 0.0


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch PWNED')",
    "\\boxed{__import__('os').system('touch PWNED')}",
    "\\boxed{().__class__.__bases__[0].__subclasses__()}",
    "\\boxed{(lambda: 24)()}",
    "\\boxed{2**999999}",
    "\\boxed{9**9**9**9}",
    "\\boxed{4 / (9 - 9) * 10 * 13}",  # division by zero, the numbers otherwise right
    "\\boxed{4 / (13 - 13) + 9 + 10}",
    "\\boxed{" + "(" * 5000 + "4" + ")" * 5000 + "}",
    "\\boxed{" + "1+" * 100_000 + "1}",
    "\\boxed{" + "9" * 100_000 + "}",
    "\\boxed{4 + 9 + 10 + 13\x00}",
    "\\boxed{[4, 9, 10, 13]}",
    "\\boxed{4 if 9 else 10}",
    "\\boxed{x * 24}",
    "\\boxed{4 + 9 + 10 + 1e3}",
    "\\boxed{24j}",
    "\\boxed{True * 24}",
    "\\boxed{(13 - 9) @ (10 - 4)}",
    "\\boxed{(13 - 9) // 1 * (10 - 4)}",
    "\\boxed{(13 - 9) << (10 - 4)}",
])
def test_a_malicious_or_runaway_expression_scores_zero_quickly_without_raising(text: str, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """"Quickly" is the fast path, not a clock: nothing longer than MAX_EXPRESSION_CHARS is parsed
    and nothing but the row's own numbers, each once, is ever computed with."""
    from corerl.tasks import expression_reward

    monkeypatch.chdir(tmp_path)
    numbers = {"numbers": [4, 9, 10, 13], "target": 24}
    parsed: list[int] = []  # the length of each text handed to ast.parse
    computed: list[Any] = []  # each literal the evaluator computed with
    parse, value = expression_reward.ast.parse, expression_reward._value

    def parse_spy(source: Any, *args: Any, **kwargs: Any) -> Any:
        parsed.append(len(source))
        return parse(source, *args, **kwargs)

    def value_spy(node: Any) -> Any:
        if isinstance(node, expression_reward.ast.Constant):
            computed.append(node.value)
        return value(node)

    monkeypatch.setattr(expression_reward.ast, "parse", parse_spy)
    monkeypatch.setattr(expression_reward, "_value", value_spy)
    result: list[float] = []
    worker = threading.Thread(target=lambda: result.append(expression_answer(text, numbers)), daemon=True)
    worker.start()
    worker.join(timeout=120)  # a guard against a hang only (9**9**9**9 evaluated never ends), not a speed check
    assert not worker.is_alive(), "the verifier hung"
    assert result == [0.0]
    assert all(length <= expression_reward.MAX_EXPRESSION_CHARS for length in parsed), parsed
    assert computed == [] or sorted(computed) == [4, 9, 10, 13], computed
    assert not (tmp_path / "PWNED").exists()


def test_the_candidate_expression() -> None:
    assert extract_expression("a\n\\boxed{\\frac{1}{2}} then \\boxed{{1 + 2} * 3}") == "{1 + 2} * 3"
    assert extract_expression("work\n\n(1 + 2) * 8 = 24\n") == "(1 + 2) * 8"
    assert extract_expression("   \n") is None


def test_the_solver_finds_a_solution_the_verifier_accepts() -> None:
    for numbers in ([4, 9, 10, 13], [3, 3, 8, 8], [1, 1, 4, 6], [2, 3, 5, 12]):
        found = solve(numbers)
        assert found is not None
        assert expression_answer(f"\\boxed{{{found}}}", {"numbers": numbers, "target": 24}) == 1.0
    assert solve([1, 1, 1, 1]) is None


# --- game24 ---


@pytest.fixture(scope="module")
def game24_task() -> Any:
    if not HAS_TOT:
        pytest.skip("pip install --no-deps tree-of-thoughts-llm==0.1.0")
    from corerl.tasks.real_tasks import Game24

    return Game24(context(seed=3))


@needs_tot
def test_the_game24_split_is_fixed_disjoint_and_covers_every_puzzle(game24_task: Any) -> None:
    from corerl.tasks.real_tasks import Game24, game24_puzzles

    other = Game24(context(seed=11))  # another run seed: the same split
    assert isinstance(game24_task, TaskSource)
    assert len(game24_task.held) == 64 and len(game24_task.train) == 1362 - 64
    assert other.held == game24_task.held and other.train == game24_task.train
    held = {r["rank"] for r in game24_task.held}
    train = {r["rank"] for r in game24_task.train}
    assert not held & train
    assert held | train == {r["rank"] for r in game24_puzzles()} == set(range(1, 1363))
    assert sorted(held) != list(range(1, 65))  # shuffled, not the easiest 64
    smaller = Game24(context(held_out_size=10))
    assert len(smaller.held) == 10 and len(smaller.train) == 1352
    with pytest.raises(ConfigError) as error:
        Game24(context(held_out_size=700))
    assert error.value.key == "data.held_out_size"


@needs_tot
def test_game24_prompts_rewards_and_demonstrations(game24_task: Any) -> None:
    tokenizer = game24_task.tokenizer
    prompts, rows = game24_task.held_out()
    assert len(prompts) == len(rows) == 64
    text = tokenizer.decode(prompts[0])
    assert " ".join(map(str, rows[0]["numbers"])) in text and "each number once" in text and "\\boxed{}" in text
    assert "_corerl_origin" not in rows[0]
    for row in rows[:8]:
        answer = solve(row["numbers"])
        assert answer is not None
        assert game24_task.reward(completion(tokenizer, f"\\boxed{{{answer}}}"), row) == 1.0
        assert game24_task.reward(completion(tokenizer, "\\boxed{__import__('os')}"), row) == 0.0
    for prompt, response in game24_task.demonstrations(4):
        assert response[-1] == tokenizer.eos_token_id
        row = next(r for r, ids in zip(game24_task.train, game24_task.train_ids, strict=True) if ids == prompt)
        assert expression_answer(tokenizer.decode(response), row) == 1.0


@needs_tot
def test_game24_draws_training_rows_in_seeded_epochs_and_resumes() -> None:
    from corerl.tasks.real_tasks import Game24

    first, second = Game24(context(seed=5)), Game24(context(seed=5))
    assert first.sample(7) == second.sample(7)
    state = first.state()
    ahead = first.sample(5)
    second.set_state(state)
    assert second.sample(5) == ahead
    _, rows = Game24(context(seed=6)).sample(1298)  # one whole epoch: every training puzzle once
    assert sorted(r["rank"] for r in rows) == sorted(r["rank"] for r in first.train)


@needs_tot
def test_game24_uses_data_reward_and_reports_what_it_raises() -> None:
    from corerl.tasks.real_tasks import Game24

    seen: list[Any] = []
    task = Game24(context(reward=lambda text, row: seen.append((text, row)) or 0.5))
    _, rows = task.sample(1)
    assert task.reward(completion(task.tokenizer, "hello"), rows[0]) == 0.5
    assert seen == [("hello", rows[0])]

    def broken(text: str, row: Any) -> float:
        raise KeyError("answer")

    task = Game24(context(reward=broken))
    with pytest.raises(RunError) as error:
        task.reward(completion(task.tokenizer, "x"), rows[0])
    assert error.value.key == "data.reward" and "\n" not in str(error.value)


# --- prompts through a chat template ---

CHAT = ("{% for m in messages %}<bos> w1 {{ m['content'] }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}w2 :{% endif %}")


@needs_tot
def test_prompts_render_through_the_chat_template(tmp_path: Path) -> None:
    from corerl.tasks.real_tasks import Game24

    tokenizer = build_tokenizer()
    with pytest.raises(ConfigError) as error:
        Game24(context(tokenizer, apply_chat_template=True))
    assert error.value.key == "data.apply_chat_template"
    tokenizer.chat_template = CHAT
    system = tmp_path / "system.txt"
    system.write_text("w7 w8\n", encoding="utf-8")
    task = Game24(context(tokenizer, apply_chat_template=True, system_prompt_file=str(system)))
    prompts, rows = task.held_out()
    ids = prompts[0]
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "w7 w8"}, {"role": "user", "content": task.prompt_text(rows[0])}],
        add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == list(expected)
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words[:5] == ["<bos>", "w1", "w7", "w8", "<eos>"] and words[-2:] == ["w2", ":"]
    assert words.count("<bos>") == 2  # the system turn, then the user turn
    plain = Game24(context(tokenizer))  # data.apply_chat_template off: <bos> and the text
    assert plain.held_out()[0][0][0] == tokenizer.bos_token_id and "w2" not in tokenizer.convert_ids_to_tokens(
        plain.held_out()[0][0])


@needs_tot
def test_a_prompt_too_long_for_the_sequence_is_refused_in_one_line() -> None:
    from corerl.tasks.real_tasks import Game24

    with pytest.raises(ConfigError) as error:
        Game24(attrs.evolve(context(), max_prompt_tokens=20))
    assert error.value.key == "policy.max_seq_length" and "24.csv rank" in str(error.value)


# --- gsm_symbolic ---


@pytest.fixture(scope="module")
def gsm_task() -> Any:
    if not (HAS_GYM and HAS_MATH_VERIFY):
        pytest.skip("pip install --no-deps reasoning-gym==0.1.25 (docs/real-tasks.md)")
    from corerl.tasks.real_tasks import GSMSymbolic

    return GSMSymbolic(context(seed=2))


@needs_gym
def test_the_gsm_symbolic_split_is_fixed_and_disjoint(gsm_task: Any) -> None:
    from corerl.tasks.real_tasks import GSM_TRAIN_SIZE, gsm_symbolic_rows

    assert len(gsm_task.held) == 64 and 4000 < len(gsm_task.train) <= GSM_TRAIN_SIZE
    again_train, again_held = gsm_symbolic_rows(train=200)  # generated anew: the same items
    assert again_held == gsm_task.held and again_train == gsm_task.train[:200]
    held = {r["question"] for r in gsm_task.held}
    assert not held & {r["question"] for r in gsm_task.train}
    assert len(held) == 64
    assert all(r["answer"] and r["solution"] for r in gsm_task.held)


@needs_gym
def test_gsm_symbolic_is_scored_by_math_verify(gsm_task: Any) -> None:
    tokenizer = gsm_task.tokenizer
    prompts, rows = gsm_task.held_out()
    text = tokenizer.decode(prompts[0])
    assert rows[0]["question"] in text and "\\boxed{}" in text
    row = rows[0]
    answer = row["answer"]
    wrong = str(int(float(answer)) + 1)
    assert gsm_task.reward(completion(tokenizer, f"So the total is \\boxed{{{answer}}}."), row) == 1.0
    assert gsm_task.reward(completion(tokenizer, f"So the total is \\boxed{{{wrong}}}."), row) == 0.0
    assert gsm_task.reward(completion(tokenizer, "no idea"), row) == 0.0
    assert gsm_task.reward(completion(tokenizer, "\\boxed{__import__('os')}"), row) == 0.0
    for prompt, response in gsm_task.demonstrations(5):  # the worked solutions score 1
        assert response[-1] == tokenizer.eos_token_id
        index = gsm_task.train_ids.index(prompt)
        assert gsm_task.reward(completion(tokenizer, tokenizer.decode(response)), gsm_task.example(
            gsm_task.train[index])) == 1.0


@needs_gym
def test_gsm_symbolic_rows_play_in_the_math_environment(gsm_task: Any) -> None:
    from corerl.environments.contract import EnvironmentContext
    from corerl.environments.math_env import MathEnvironment

    env = MathEnvironment(EnvironmentContext(settings=None, seed=0, data=DataConfig()))
    _, rows = gsm_task.held_out()
    assert env.correct(f"\\boxed{{{rows[1]['answer']}}}", rows[1][env.answer_key])


# --- arithmetic ---


@pytest.fixture(scope="module")
def arithmetic_task() -> Any:
    if not (HAS_GYM and HAS_MATH_VERIFY):
        pytest.skip("pip install --no-deps reasoning-gym==0.1.25 (docs/real-tasks.md)")
    from corerl.tasks.real_tasks import Arithmetic

    return Arithmetic(context(seed=4))


@needs_gym
def test_the_arithmetic_split_is_fixed_and_disjoint(arithmetic_task: Any) -> None:
    import re

    from corerl.tasks.real_tasks import ARITH_TRAIN_SIZE, Arithmetic, arithmetic_rows

    assert isinstance(arithmetic_task, TaskSource)
    assert len(arithmetic_task.held) == 64 and 3500 < len(arithmetic_task.train) <= ARITH_TRAIN_SIZE
    again_train, again_held = arithmetic_rows(train=300)  # generated anew: the same items
    assert again_held == arithmetic_task.held and again_train == arithmetic_task.train[:len(again_train)]
    other = Arithmetic(context(seed=9))  # another run seed: the same split
    assert other.held == arithmetic_task.held and other.train == arithmetic_task.train
    held = {r["question"] for r in arithmetic_task.held}
    assert len(held) == 64 and not held & {r["question"] for r in arithmetic_task.train}
    assert all("seed 70000" in r["_corerl_origin"] for r in arithmetic_task.held)
    assert all("seed 60000" in r["_corerl_origin"] for r in arithmetic_task.train)
    for row in [*arithmetic_task.held, *arithmetic_task.train[:500]]:  # two terms of 0 .. 100, + or -
        match = re.fullmatch(r"Calculate (\d{1,3}) ([+-]) (\d{1,3})\.", row["question"])
        assert match is not None and row["expression"] == row["question"][len("Calculate "):-1]
        a, op, b = int(match[1]), match[2], int(match[3])
        assert a <= 100 and b <= 100 and int(row["answer"]) == (a + b if op == "+" else a - b)
    assert {r["question"][len("Calculate "):].split()[1] for r in arithmetic_task.held} == {"+", "-"}
    smaller = Arithmetic(context(held_out_size=10))
    assert smaller.held == arithmetic_task.held[:10]


@needs_gym
def test_arithmetic_is_scored_by_an_integer_in_the_last_box(arithmetic_task: Any) -> None:
    tokenizer = arithmetic_task.tokenizer
    prompts, rows = arithmetic_task.held_out()
    assert len(prompts) == len(rows) == 64 and "_corerl_origin" not in rows[0]
    text = tokenizer.decode(prompts[0])
    assert text == f"{rows[0]['question']}\nPut the final answer, an integer, in \\boxed{{}}."
    negative = next(r for r in rows if int(r["answer"]) < 0)
    for row in (rows[0], negative):
        answer = row["answer"]
        assert arithmetic_task.reward(completion(tokenizer, f"The result is \\boxed{{{answer}}}."), row) == 1.0
        assert arithmetic_task.reward(completion(tokenizer, f"\\boxed{{{int(answer) + 1}}}"), row) == 0.0
        assert arithmetic_task.reward(completion(tokenizer, "no idea"), row) == 0.0
    assert arithmetic_task.reward(completion(tokenizer, f"\\boxed{{{negative['answer'].lstrip('-')}}}"),
                                  negative) == 0.0  # the sign counts
    expression = rows[0]["question"].removeprefix("Calculate ").rstrip(".")
    assert arithmetic_task.reward(completion(tokenizer, f"\\boxed{{{expression}}}"), rows[0]) == 0.0  # copied, not solved
    assert arithmetic_task.reward(completion(tokenizer, expression), rows[0]) == 0.0
    for prompt, response in arithmetic_task.demonstrations(5):  # the demonstrations score 1
        assert response[-1] == tokenizer.eos_token_id
        row = arithmetic_task.example(arithmetic_task.train[arithmetic_task.train_ids.index(prompt)])
        assert arithmetic_task.reward(completion(tokenizer, tokenizer.decode(response)), row) == 1.0


@needs_gym
def test_arithmetic_prompts_render_through_the_chat_template() -> None:
    from corerl.tasks.real_tasks import Arithmetic

    tokenizer = build_tokenizer()
    tokenizer.chat_template = CHAT
    task = Arithmetic(context(tokenizer, apply_chat_template=True))
    prompts, rows = task.held_out()
    expected = tokenizer.apply_chat_template([{"role": "user", "content": task.prompt_text(rows[0])}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
    assert prompts[0] == list(expected)
    words = tokenizer.convert_ids_to_tokens(prompts[0])
    assert words[:2] == ["<bos>", "w1"] and words[-2:] == ["w2", ":"]


@needs_gym
def test_arithmetic_draws_training_rows_in_seeded_epochs_and_resumes() -> None:
    from corerl.tasks.real_tasks import Arithmetic

    first, second = Arithmetic(context(seed=5)), Arithmetic(context(seed=5))
    assert first.sample(7) == second.sample(7)
    state = first.state()
    ahead = first.sample(5)
    second.set_state(state)
    assert second.sample(5) == ahead


# --- missing packages ---


@pytest.mark.parametrize(("task", "says"), [("GSMSymbolic", "reasoning-gym"), ("Arithmetic", "the arithmetic task")],
                         ids=["gsm_symbolic", "arithmetic"])
def test_a_missing_reasoning_gym_names_data_task_and_the_pip_command(monkeypatch: pytest.MonkeyPatch, task: str,
                                                                    says: str) -> None:
    from corerl.tasks import real_tasks

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    for name in [m for m in sys.modules if m.startswith("reasoning_gym.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigError) as error:
        getattr(real_tasks, task)(context(reward=lambda text, row: 0.0))
    line = str(error.value)
    assert error.value.key == "data.task" and "\n" not in line
    assert says in line and "pip install --no-deps reasoning-gym==0.1.25" in line


def test_a_missing_reasoning_gym_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from corerl.tasks.real_tasks import GSMSymbolic

    real = __import__

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic":
            raise ModuleNotFoundError("No module named 'cellpylib'", name="cellpylib")
        return real(name, *args, **kwargs)

    monkeypatch.setattr("builtins.__import__", refuse)
    with pytest.raises(ConfigError) as error:
        GSMSymbolic(context(reward=lambda text, row: 0.0))
    assert error.value.key == "data.task" and "'cellpylib'" in str(error.value) and "cellpylib==2.4.0" in str(error.value)


def test_a_missing_math_verify_names_data_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from corerl.tasks.real_tasks import GSMSymbolic

    monkeypatch.setitem(sys.modules, "math_verify", None)  # arithmetic's integer_answer does not need it
    with pytest.raises(ConfigError) as error:
        GSMSymbolic(context())
    assert error.value.key == "data.task" and "math-verify==0.9.0" in str(error.value)
    assert "the gsm_symbolic task" in str(error.value)


def test_a_missing_tree_of_thoughts_names_data_task_and_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from corerl.tasks import real_tasks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tot" else real(name, *a))
    with pytest.raises(ConfigError) as error:
        real_tasks.Game24(context())
    line = str(error.value)
    assert error.value.key == "data.task" and "\n" not in line
    assert "game24" in line and "pip install --no-deps tree-of-thoughts-llm==0.1.0" in line


def test_the_modules_import_neither_torch_nor_the_packages_at_import_time() -> None:
    import ast

    import corerl.tasks.expression_reward
    import corerl.tasks.real_tasks

    for module in (corerl.tasks.real_tasks, corerl.tasks.expression_reward):
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
        assert names and not {m.split(".")[0] for m in names} & {"torch", "reasoning_gym", "tot", "math_verify",
                                                                  "transformers"}
