"""Grading a ``\\boxed{...}`` answer against a reference as mathematics, the way SkyRL's geometry3k
example grades (its ``math_utils``, which follows the MATH benchmark's normalisation and a sympy
comparison). Written here from what it does; the two checks and their order are the example's:

1. **MATH-style normalisation** (:func:`mathd_normal`): both strings are rewritten into one
   canonical spelling (``\\dfrac``/``\\tfrac`` as ``\\frac``, ``\\frac12`` as ``\\frac{1}{2}``,
   ``\\sqrt3`` as ``\\sqrt{3}``, degrees, ``\\left``/``\\right``, dollar and percent signs, a
   trailing ``\\text{ unit}``, a short ``x =`` in front, spaces and line breaks dropped, ``0.5`` and
   a plain ``a/b`` as fractions) and compared as text;
2. else **sympy** (:func:`sympy_equal`): each side is normalised again (units and words like
   ``degrees`` or ``million``, LaTeX turned into plain text with pylatexenc, braces dropped,
   lower case), tuples and intervals compared element by element, and each pair of elements is
   equal when sympy simplifies their difference to 0. Two unreduced fractions must match as
   written; an integer matches only an integer; an expression with more than two distinct letters,
   or with powers sympy might hang on (``^{``, ``^(``, stacked or multi-digit exponents), is not
   handed to sympy at all.

Any failure of either check (a malformed expression, a sympy error) counts as "not equal", never
as an error. sympy evaluates the text it parses; the two-letter limit above is what keeps a model's
answer from being arbitrary Python, as in SkyRL.
"""

from __future__ import annotations

import re

__all__ = ["boxed_content", "grade_boxed", "last_boxed"]

_TEXT_WRAPPER = re.compile(r"^\\text\{(?P<inner>.+?)\}$")
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard")
_UNIT_PATTERNS = tuple(re.compile(unit + r"(es)?(s)? *(\^[0-9]+)?") for unit in _UNITS)
_GROUPED_THOUSANDS = re.compile(r"(\d),(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_HANGS_SYMPY = ("^{", "^(")
_HANGS_SYMPY_RE = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"
_UNICODE_MATH = {"\u221a": "sqrt", "\u03c0": "pi", "\u221e": "inf", "\u222a": "U", "\u00b7": "*", "\u00d7": "*"}


# -- the boxed answer ---------------------------------------------------------------------------

def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` of ``text`` with its braces balanced (else the last ``\\fbox``'s
    span), from the command to its closing brace; None when there is none or it never closes."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start:index + 1]
    return None


def boxed_content(text: str) -> str | None:
    """What the last ``\\boxed{...}`` of ``text`` holds (None: no such box, or an ``\\fbox``)."""
    span = last_boxed(text)
    if span is None or not span.startswith("\\boxed{") or not span.endswith("}"):
        return None
    return span[len("\\boxed{"):-1]


def grade_boxed(solution: str, truth: str) -> bool:
    """Whether the last boxed answer of ``solution`` equals ``truth`` (itself boxed or plain): the
    MATH-style normalised texts are the same, or sympy finds them equal (module docstring)."""
    if not truth:
        return False
    truth = str(truth)
    if "\\boxed" in truth:
        truth = boxed_content(truth)  # type: ignore[assignment]
    given = boxed_content(solution) if "\\boxed" in solution else None
    if given is None:
        return False
    return mathd_normal(given) == mathd_normal(truth) or sympy_equal(given, truth)


# -- check 1: the MATH benchmark's normalisation ------------------------------------------------

def mathd_normal(answer: str | None) -> str | None:
    """``answer`` in the MATH benchmark's canonical spelling; where a rewrite fails on a malformed
    answer, the answer as it is (its ``\\text{}`` wrapper removed)."""
    if answer is None:
        return None
    answer = answer.strip()
    wrapped = _TEXT_WRAPPER.search(answer)
    if wrapped is not None:
        answer = wrapped.group("inner").strip()
    try:
        return _canonical(answer)
    except (IndexError, ValueError):
        return answer


def _canonical(text: str) -> str:
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        text = text.replace(old, new)
    if "\\text{ " in text:  # a unit on the right
        kept, *rest = text.split("\\text{ ")
        if len(rest) != 1:
            raise ValueError("more than one unit")
        text = kept
    text = text.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text.startswith("."):
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5", "AB=3"
        text = sides[1]
    text = _braced_sqrt(text).replace(" ", "")
    text = _braced_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_as_frac(text)


def _braced_sqrt(text: str) -> str:
    """``\\sqrt3`` as ``\\sqrt{3}`` (one character taken as the argument)."""
    if "\\sqrt" not in text:
        return text
    head, *pieces = text.split("\\sqrt")
    out = [head]
    for piece in pieces:
        out.append("\\sqrt" + piece if piece[0] == "{" else "\\sqrt{" + piece[0] + "}" + piece[1:])
    return "".join(out)


def _braced_fracs(text: str) -> str:
    """``\\frac12`` as ``\\frac{1}{2}``, ``\\frac1{72}`` as ``\\frac{1}{72}``; a ``\\frac`` with
    fewer than two characters after it leaves the text as it was."""
    head, *pieces = text.split("\\frac")
    out = [head]
    for piece in pieces:
        if piece[0] == "{":
            out.append("\\frac" + piece)
            continue
        if len(piece) < 2:
            return text
        numerator, denominator, rest = piece[0], piece[1], piece[2:]
        if denominator == "{":
            out.append("\\frac{" + numerator + "}{" + rest)
        else:
            out.append("\\frac{" + numerator + "}{" + denominator + "}" + rest)
    return "".join(out)


def _slash_as_frac(text: str) -> str:
    """``3/4`` (two integers written plainly) as ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        numerator, denominator = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{numerator}}}{{{denominator}}}" if text == f"{numerator}/{denominator}" else text


# -- check 2: sympy ------------------------------------------------------------------------------

def sympy_equal(given: str, truth: str) -> bool:
    """Whether ``given`` equals ``truth`` element by element under sympy (module docstring)."""
    truth_n, given_n = _plain_normal(truth), _plain_normal(given)
    if truth_n is None:
        return False
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_parts, given_parts = _elements(truth_n), _elements(given_n)
    if len(truth_parts) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # an interval's brackets must match
    if len(truth_parts) != len(given_parts):
        return False
    for want, got in zip(truth_parts, given_parts, strict=True):
        if _FRACTION.search(want) and _FRACTION.search(got):
            same = want == got  # an unreduced fraction is not the reduced one
        elif _is_integer_text(want) != _is_integer_text(got):
            same = False
        else:
            same = _simplifies_to_zero(f"({want})-({got})")
        if not same:
            return False
    return True


def _plain_normal(expr: str | None) -> str | None:
    """An answer as plain lower-case text sympy can parse: units, words and LaTeX rewritten."""
    if expr is None:
        return None
    wrapped = _TEXT_WRAPPER.search(expr)
    if wrapped is not None:
        expr = wrapped.group("inner")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                     ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    for unit in _UNIT_PATTERNS:
        expr = unit.sub("", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    number = _as_float(expr)
    if number is not None and _near_integer(number):
        expr = str(int(round(number)))
    if "\\" in expr:
        try:
            expr = _latex_as_text(expr)
        except Exception:  # noqa: BLE001 - pylatexenc on a malformed answer: keep it as it is
            pass
    expr = re.sub("- *", "-", expr)
    expr = _MIXED_NUMBER.sub(r"\1+\2", expr)  # "7 3/4" is 7 + 3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _is_integer_text(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _latex_as_text(expr: str) -> str:
    from pylatexenc import latex2text

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for symbol, name in _UNICODE_MATH.items():
        expr = expr.replace(symbol, name)
    return expr.strip()


def _as_float(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _near_integer(number: float) -> bool:
    try:
        return abs(number - int(round(number))) <= 1e-7
    except (OverflowError, ValueError):  # inf, nan
        return False


def _without_grouping_commas(expr: str) -> str:
    """``1,000,000`` as ``1000000``; a tuple's commas stay."""
    while True:
        changed = _GROUPED_THOUSANDS.sub(r"\1\2\3", expr)
        if changed == expr:
            return expr
        expr = changed


def _is_integer_text(text: str) -> bool:
    number = _as_float(_without_grouping_commas(text))
    return number is not None and _near_integer(number)


def _elements(expr: str) -> list[str]:
    """A tuple's or interval's elements (``(1,2]``: ``1``, ``2``), else the expression alone."""
    expr = _without_grouping_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS and not any(c in inner for c in _BRACKETS):
        return [part.strip() for part in inner.split(",")]
    return [expr]


def _may_evaluate(expr: str) -> bool:
    """Whether sympy may parse ``expr``: at most two distinct letters (``sqrt`` and ``frac`` aside),
    no exponents it might hang on."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or any(bad in expr for bad in _HANGS_SYMPY):
        return False
    return not any(pattern.search(expr) for pattern in _HANGS_SYMPY_RE)


def _simplifies_to_zero(expr: str) -> bool:
    if not _may_evaluate(expr):
        return False
    try:
        import sympy
        from sympy.parsing import sympy_parser

        parsed = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=(
            *sympy_parser.standard_transformations, sympy_parser.implicit_multiplication_application))
        return bool(sympy.simplify(parsed) == 0)
    except Exception:  # noqa: BLE001 - sympy on a malformed answer: not equal
        return False
