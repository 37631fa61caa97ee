"""NeMo RL's single-turn VLM reward environments: ``clevr_cogent``, ``geometry3k``, ``refcoco`` and
``vlm`` (NeMo RL's ``clevr-cogent``, ``geometry3k``, ``refcoco`` and ``vlm``).

One class plays them all; the ids differ only in their default ``env.<id>.reward_functions``
(what NeMo RL's ``vlm_grpo_3B.yaml`` gives each). The model answers once; the reward is the
weighted sum of the listed reward functions, each scoring the turn against the row's ground truth
(its ``data.answer_key`` column), the weights normalised to sum to 1:

``format``
    0.25 when the turn holds a ``<think>...</think>`` block, plus 0.75 when it holds an
    ``<answer>...</answer>`` block (kwargs ``think_tag``, ``answer_tag``).
``exact_alnum``
    1 when the answer's letters and digits (ASCII, case ignored, everything else dropped) are the
    ground truth's, else 0 (kwarg ``answer_tag``).
``math_expr``
    1 when math-verify finds the answer mathematically equal to the ground truth, else 0 (kwarg
    ``answer_tag``; needs the math-verify package, as the ``math`` environment does). A bare
    expression (no ``$`` or ``\\boxed``) is read whole as LaTeX: ``2\\sqrt{3}`` is not ``2``.
``bbox_giou``
    the overlap of the answer's box ``[x1, y1, x2, y2]`` with the ground truth's: the IoU when it
    is at least ``giou_penalty_thres``, else the generalised IoU (the IoU less the share of the
    two boxes' enclosing box that neither covers: between -1 and 1, negative for far-off boxes);
    ``giou_penalty_thres`` defaults to 1 (any value from 1 up: GIoU always; 0: IoU always).
    A box that cannot be read (not four numbers, ``x2 <= x1`` or ``y2 <= y1``) scores 0
    (kwargs ``giou_penalty_thres``, ``answer_tag``).

The answer is the text of the turn's last ``<answer>...</answer>`` block; a turn without one
scores 0 on ``exact_alnum``, ``math_expr`` and ``bbox_giou``. A ground truth wrapped in answer
tags itself is read inside them. A row whose ground truth is missing, or (``bbox_giou``) is not a
box, fails its episode with a one-line cause.

This module imports nothing beyond attrs and the standard library (registering it is cheap).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from corerl.config.fields import setting
from corerl.environments.contract import EnvironmentContext, EnvironmentSettings, EpisodeView, Turn
from corerl.errors import ConfigError, ConfigErrors
from corerl.tasks import column_value

_FUNCTIONS_HELP = ("the reward functions, each {name, weight, kwargs}: name one of format, exact_alnum, math_expr, "
                   "bbox_giou; the reward is their weighted sum, the weights normalised to sum to 1 "
                   "(docs/environments.md)")

_MISSING = object()  # a row without the answer column (a None answer is a value)


def _functions(*items: tuple[str, float, dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": name, "weight": weight, "kwargs": kwargs} for name, weight, kwargs in items]


@attrs.define(kw_only=True)
class VLMSettings(EnvironmentSettings):
    """``env.vlm``: the reward functions scoring the model's one answer."""

    reward_functions: list[dict[str, Any]] = setting(_functions(("format", 0.2, {}), ("exact_alnum", 0.8, {})),
                                                     help=_FUNCTIONS_HELP)


@attrs.define(kw_only=True)
class ClevrCogentSettings(VLMSettings):
    """``env.clevr_cogent``: CLEVR counting answers, checked as letters and digits (``env.vlm``'s
    reward functions)."""


@attrs.define(kw_only=True)
class Geometry3kSettings(VLMSettings):
    """``env.geometry3k``: geometry answers, checked as mathematics."""

    reward_functions: list[dict[str, Any]] = setting(_functions(("format", 0.1, {}), ("math_expr", 0.9, {})),
                                                     help=_FUNCTIONS_HELP)


@attrs.define(kw_only=True)
class RefcocoSettings(VLMSettings):
    """``env.refcoco``: referring-expression boxes, scored by their overlap with the ground truth's."""

    reward_functions: list[dict[str, Any]] = setting(
        _functions(("format", 0.1, {}), ("bbox_giou", 0.9, {"giou_penalty_thres": 0.5})), help=_FUNCTIONS_HELP)


# -- reading a turn --------------------------------------------------------------------------------

_TAG = re.compile(r"[A-Za-z][\w-]*")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BRACKETED = re.compile(r"[\[(]([^\[\]()]*)[\])]")


def tagged(text: str, tag: str) -> str | None:
    """The text of the last complete ``<tag>...</tag>`` block of ``text`` (None: there is none)."""
    blocks = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, flags=re.DOTALL)
    return blocks[-1] if blocks else None


def ground_truth(gold: Any, tag: str = "answer") -> Any:
    """The row's ground truth, read inside answer tags when it is text wrapped in them."""
    if isinstance(gold, str):
        inner = tagged(gold, tag)
        return (inner if inner is not None else gold).strip()
    return gold


def alphanumeric(text: str) -> str:
    """``text``'s ASCII letters and digits, lower-cased."""
    return re.sub(r"[^0-9A-Za-z]", "", text).lower()


def read_box(value: Any) -> tuple[float, float, float, float] | None:
    """A box ``[x1, y1, x2, y2]`` from a list of four numbers or from text (its first bracketed
    group of four numbers, else its only four numbers); None when there is none, or when it is
    empty (``x2 <= x1`` or ``y2 <= y1``)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        numbers = list(value)
        if len(numbers) != 4 or not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
            return None
        box = tuple(float(n) for n in numbers)
    elif isinstance(value, str):
        groups = [_NUMBER.findall(group) for group in _BRACKETED.findall(value)]
        found = next((g for g in groups if len(g) == 4), None) or _NUMBER.findall(value)
        if len(found) != 4:
            return None
        box = tuple(float(n) for n in found)
    else:
        return None
    x1, y1, x2, y2 = box
    if not all(math.isfinite(v) for v in box) or x2 <= x1 or y2 <= y1:
        return None
    return x1, y1, x2, y2


def giou(predicted: Sequence[float], target: Sequence[float], penalty_threshold: float = 1.0) -> float:
    """The IoU of two boxes when it is at least ``penalty_threshold``, else their generalised IoU
    (the IoU less the share of their enclosing box that neither covers)."""
    px1, py1, px2, py2 = predicted
    tx1, ty1, tx2, ty2 = target
    inter = max(0.0, min(px2, tx2) - max(px1, tx1)) * max(0.0, min(py2, ty2) - max(py1, ty1))
    union = (px2 - px1) * (py2 - py1) + (tx2 - tx1) * (ty2 - ty1) - inter
    iou = inter / union
    if iou >= penalty_threshold:
        return iou
    hull = (max(px2, tx2) - min(px1, tx1)) * (max(py2, ty2) - min(py1, ty1))
    return iou - (hull - union) / hull


# -- the reward functions: fn(response, gold, **kwargs) -> float ---------------------------------

def format_reward(response: str, gold: Any, *, think_tag: str = "think", answer_tag: str = "answer") -> float:
    """0.25 for a ``<think>`` block, plus 0.75 for an ``<answer>`` block."""
    return 0.25 * (tagged(response, think_tag) is not None) + 0.75 * (tagged(response, answer_tag) is not None)


def exact_alnum_reward(response: str, gold: Any, *, answer_tag: str = "answer") -> float:
    """1.0 when the answer's letters and digits are the ground truth's (case ignored)."""
    answer = tagged(response, answer_tag)
    if answer is None:
        return 0.0
    wanted = alphanumeric(str(ground_truth(gold, answer_tag)))
    return 1.0 if wanted and alphanumeric(answer) == wanted else 0.0


@functools.cache
def _math_checker() -> Any:
    """The math environment's math-verify reader, built once (it refuses in one line without math-verify)."""
    from corerl.environments.math_env import MathEnvironment

    return MathEnvironment(EnvironmentContext(settings=None, seed=0))


_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")


def as_math(text: str) -> list[Any]:
    """What math-verify reads in ``text``: a bare expression (no ``$``, ``\\(``, ``\\[`` or
    ``\\boxed``) is read whole as LaTeX, so that ``2\\sqrt{3}`` is not read as ``2``."""
    checker = _math_checker()
    text = text.strip()
    parsed = [] if _DELIMITED.search(text) else checker.parse(f"${text}$", parsing_timeout=None)
    return parsed or checker.parse(text, parsing_timeout=None)


def math_expr_reward(response: str, gold: Any, *, answer_tag: str = "answer") -> float:
    """1.0 when math-verify finds the answer equal to the ground truth (a ground truth it cannot
    read as mathematics is compared as text)."""
    answer = tagged(response, answer_tag)
    if answer is None or not answer.strip():
        return 0.0
    target = str(ground_truth(gold, answer_tag))
    wanted, read = as_math(target) or [target], as_math(answer)
    return 1.0 if read and _math_checker().verify(wanted, read, timeout_seconds=None) else 0.0


def bbox_giou_reward(response: str, gold: Any, *, giou_penalty_thres: float = 1.0, answer_tag: str = "answer") -> float:
    """The (generalised) IoU of the answer's box with the ground truth's; 0 when the answer has none."""
    target = read_box(ground_truth(gold, answer_tag))
    if target is None:
        raise ValueError(f"the row's ground truth {gold!r} is not a box [x1, y1, x2, y2] with x1 < x2 and y1 < y2")
    answer = tagged(response, answer_tag)
    predicted = read_box(answer) if answer is not None else None
    return 0.0 if predicted is None else giou(predicted, target, giou_penalty_thres)


def _tag_ok(value: Any) -> bool:
    return isinstance(value, str) and _TAG.fullmatch(value) is not None


def _threshold_ok(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 and math.isfinite(value)


_TAG_RULE = (_tag_ok, "a tag name (letters, digits, '_', '-')")


@attrs.frozen
class RewardFunction:
    """A reward function the VLM environments know: its function and its keyword arguments, each
    with a check and what the check wants."""

    function: Callable[..., float]
    kwargs: Mapping[str, tuple[Callable[[Any], bool], str]]


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "format": RewardFunction(format_reward, {"think_tag": _TAG_RULE, "answer_tag": _TAG_RULE}),
    "exact_alnum": RewardFunction(exact_alnum_reward, {"answer_tag": _TAG_RULE}),
    "math_expr": RewardFunction(math_expr_reward, {"answer_tag": _TAG_RULE}),
    "bbox_giou": RewardFunction(bbox_giou_reward, {"giou_penalty_thres": (_threshold_ok, "a number >= 0"),
                                                   "answer_tag": _TAG_RULE}),
}
_ITEM_KEYS = ("name", "weight", "kwargs")


def reward_function_errors(functions: Any, section: str) -> list[ConfigError]:
    """What is wrong with ``env.<id>.reward_functions`` (``section`` is ``env.<id>``), one line each."""
    key = f"{section}.reward_functions"
    if not isinstance(functions, list) or not functions:
        return [ConfigError("needs at least one reward function {name, weight, kwargs}", key=key,
                            hint=f"name one of {', '.join(REWARD_FUNCTIONS)}")]
    errors: list[ConfigError] = []
    total = 0.0
    for i, item in enumerate(functions):
        at = f"{key}[{i}]"
        if not isinstance(item, Mapping):
            errors.append(ConfigError(f"expected a mapping {{name, weight, kwargs}}, got {item!r}", key=at))
            continue
        errors += [ConfigError("unknown key", key=f"{at}.{k}", hint=f"known keys here: {', '.join(_ITEM_KEYS)}")
                   for k in item if k not in _ITEM_KEYS]
        name = item.get("name")
        known = REWARD_FUNCTIONS.get(name) if isinstance(name, str) else None
        if known is None:
            errors.append(ConfigError(f"{name!r} is not a reward function of the VLM environments", key=f"{at}.name",
                                      hint=f"known: {', '.join(REWARD_FUNCTIONS)}"))
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0 or \
                not math.isfinite(weight):
            errors.append(ConfigError(f"must be a number >= 0, got {weight!r}", key=f"{at}.weight"))
        else:
            total += weight
        kwargs = item.get("kwargs") or {}
        if not isinstance(kwargs, Mapping):
            errors.append(ConfigError(f"expected a mapping of keyword arguments, got {kwargs!r}", key=f"{at}.kwargs"))
        elif known is not None:
            for arg, value in kwargs.items():
                if arg not in known.kwargs:
                    errors.append(ConfigError(f"{name} takes no argument {arg!r}", key=f"{at}.kwargs.{arg}",
                                              hint=f"its arguments: {', '.join(known.kwargs)}"))
                elif not known.kwargs[arg][0](value):
                    errors.append(ConfigError(f"expected {known.kwargs[arg][1]}, got {value!r}",
                                              key=f"{at}.kwargs.{arg}"))
    if not errors and total <= 0:
        errors.append(ConfigError("the weights add up to 0: the reward would always be 0", key=key,
                                  hint="give at least one reward function a weight above 0"))
    return errors


def check_vlm_environment(config: Any) -> None:
    """Refuse, one line each, reward functions the VLM environment played (``data.env_name``)
    does not know, with arguments they do not take, or weights that are not numbers >= 0."""
    section = f"env.{config.core.data.env_name}"
    settings = config.section(section)
    if settings is None:
        return
    errors = reward_function_errors(getattr(settings, "reward_functions", None), section)
    if errors:
        raise ConfigErrors(list(errors))


class WeightedReward:
    """The weighted sum of reward functions, the weights normalised to sum to 1."""

    def __init__(self, functions: Sequence[Mapping[str, Any]], section: str = "env.vlm") -> None:
        errors = reward_function_errors(list(functions), section)
        if errors:
            raise ConfigErrors(list(errors))
        weights = [float(item.get("weight", 1.0)) for item in functions]
        total = sum(weights)
        self.terms = [(partial(REWARD_FUNCTIONS[item["name"]].function, **dict(item.get("kwargs") or {})),
                       weight / total) for item, weight in zip(functions, weights, strict=True)]
        if any(item["name"] == "math_expr" for item in functions):
            _math_checker()  # refuses now, in one line, when math-verify is missing

    def __call__(self, response: str, gold: Any) -> float:
        return sum(weight * function(response, gold) for function, weight in self.terms if weight)


class VLMEnvironment:
    """Scores the model's one answer against the row's ground truth (see the module's docstring)."""

    def __init__(self, context: EnvironmentContext) -> None:
        settings = context.settings if context.settings is not None else VLMSettings()
        self.reward = WeightedReward(settings.reward_functions)
        self.answer_key = getattr(context.data, "answer_key", "answer") if context.data is not None else "answer"

    def step(self, episode: EpisodeView) -> Turn:
        row = episode.row
        try:
            gold = column_value(row, self.answer_key) if isinstance(row, Mapping) else _MISSING
        except KeyError:
            gold = _MISSING
        if gold is _MISSING:
            raise ValueError(f"the row has no {self.answer_key!r} column (data.answer_key), its ground truth")
        return Turn(reward=float(self.reward(episode.response, gold)), done=True)
