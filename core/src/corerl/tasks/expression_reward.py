"""The ``expression_answer`` reward: the completion's arithmetic expression, checked without ``eval``.

For Game of 24 and countdown-style rows: ``example["numbers"]`` (a list of integers, or a string
of them separated by spaces) and ``example["target"]`` (24 when absent). The reward is 1.0 when
the completion's expression uses exactly those numbers, each once, combined with ``+ - * /``
and parentheses, and equals the target exactly (``fractions.Fraction``: ``8 / 3`` is not
rounded); else 0.0. Nothing in the completion is executed: the expression is parsed with
``ast`` and only number literals and the four binary operators are accepted (no names, calls,
attributes, powers, unary signs or decimals); an expression longer than
:data:`MAX_EXPRESSION_CHARS` characters, a division by zero or anything unreadable scores 0.0.

Where the expression is looked for: inside the last ``\\boxed{...}``, else after the last
``####``, else the last non-empty line. LaTeX ``\\times``, ``\\cdot``, ``\\div``, ``\\left(``,
``\\right)``, the signs ``×``, ``÷``, ``−`` and ``$`` are read as plain arithmetic, and in
``(13 - 9) * (10 - 4) = 24`` the longest side of the ``=`` is the expression; words before it
(``Answer: ...``) are dropped.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

#: longer candidate expressions are refused before parsing (four numbers need about 30)
MAX_EXPRESSION_CHARS = 200

_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
              ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_PROSE = re.compile(r"^[A-Za-z\s:,]*(?=[(\d])")  # words before the expression
_SPELLINGS = (("\\left", ""), ("\\right", ""), ("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"),
              ("×", "*"), ("÷", "/"), ("−", "-"), ("$", ""))


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{...}`` in ``text`` (braces balanced), None when there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def extract_expression(completion: str) -> str | None:
    """The candidate expression of a completion (see the module's docstring), None when there is none."""
    boxed = last_boxed(completion)
    if boxed is not None:
        text = boxed
    elif "####" in completion:
        text = completion.rsplit("####", 1)[1]
    else:
        lines = [line for line in completion.splitlines() if line.strip()]
        if not lines:
            return None
        text = lines[-1]
    for spelling, plain in _SPELLINGS:
        text = text.replace(spelling, plain)
    text = max(text.split("="), key=lambda side: len(side.strip())).strip().rstrip(".").strip()
    text = _PROSE.sub("", text)  # "Answer: (13 - 9) * (10 - 4)"; a sign or a digit is never dropped
    return text or None


def _literals(node: ast.AST) -> list[int] | None:
    """The integer literals of an expression tree of ``+ - * /`` and integers, None when it holds anything else."""
    if isinstance(node, ast.Expression):
        return _literals(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        return [value] if type(value) is int and value >= 0 else None
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _literals(node.left), _literals(node.right)
        return None if left is None or right is None else left + right
    return None


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    assert isinstance(node, ast.BinOp)
    return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))


def evaluate_expression(text: str, numbers: Sequence[int]) -> Fraction | None:
    """The exact value of ``text`` when it is an expression of ``+ - * /``, parentheses and the
    integers ``numbers``, each used exactly once; None otherwise (including a division by zero).
    Never executes the text and never raises."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    try:
        literals = _literals(tree)
        if literals is None or Counter(literals) != Counter(int(n) for n in numbers):
            return None  # checked before evaluating: only the given, small numbers are ever computed with
        return _value(tree)
    except (ZeroDivisionError, RecursionError, ValueError, TypeError, OverflowError):
        return None


def parse_numbers(value: Any) -> list[int]:
    """A row's numbers: a list of integers, or a string of them separated by spaces or commas."""
    if isinstance(value, str):
        return [int(part) for part in value.replace(",", " ").split()]
    return [int(part) for part in value]


def expression_answer(completion: str, example: Mapping[str, Any]) -> float:
    """1.0 when the completion's expression uses each of ``example["numbers"]`` exactly once with
    ``+ - * /`` and parentheses and equals ``example["target"]`` (default 24) exactly; else 0.0."""
    expression = extract_expression(completion)
    if expression is None:
        return 0.0
    value = evaluate_expression(expression, parse_numbers(example["numbers"]))
    return 1.0 if value is not None and value == Fraction(example.get("target", 24)) else 0.0


def solve(numbers: Sequence[int], target: int = 24) -> str | None:
    """One expression over ``numbers`` (each once, ``+ - * /``) equal to ``target``, None when
    there is none: an exhaustive search, for SFT demonstrations and checks (four numbers: milliseconds)."""
    goal = Fraction(target)

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == goal else None
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                options = [(a + b, f"({ea} + {eb})"), (a - b, f"({ea} - {eb})"), (a * b, f"({ea} * {eb})")]
                if b != 0:
                    options.append((a / b, f"({ea} / {eb})"))
                for value, text in options:
                    found = search([*rest, (value, text)])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is not None and len(numbers) > 1:
        found = found[1:-1]  # the outermost parentheses
    return found
