"""Which algorithm each SkyRL entry point runs (issue 75).

A SkyRL launch script starts one Python module (``-m skyrl.train.entrypoints.main_base``, an
example's own ``main_*.py``, ``skyrl.train.main_sft``, ...) with ``key=value`` overrides; the module
decides the algorithm as much as the keys do. Each module the corpus of SkyRL's examples starts has
an :class:`EntryPoint` here: a canonical id (what the translator is given), the algorithm family,
its schedule, and, for an example whose module adds code of its own (an environment, a loss, a
generator), either what corerl does in its place (``implies``: settings the module stands for;
``registers``: a name the module adds to one of SkyRL's registries, which a key then selects) or,
where corerl lacks it, what that code is (``adds``), so that the translator can refuse it in one
line. A script starting any other module is refused in one line naming its line and the known
entry points.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from corerl.errors import ConfigError

__all__ = ["DEFAULT_MODULE", "ENTRY_POINTS", "NOT_TRAINING", "EntryPoint", "Registered", "by_id", "by_module", "known",
           "registered", "resolve"]


@attrs.frozen
class Registered:
    """A name an example's module adds to one of SkyRL's registries (``PolicyLossRegistry``,
    ``AdvantageEstimatorRegistry``): the SkyRL ``key`` that selects it, the ``name``, and the
    corerl ``settings`` (dotted key, value) it stands for. Unlike ``implies``, it acts only where
    the script's key names it (the module's registration makes the name available; the key picks
    it)."""

    key: str
    name: str
    settings: tuple[tuple[str, Any], ...]


@attrs.frozen
class EntryPoint:
    """One SkyRL entry point.

    ``family``: ``rl`` (main_base's PPO/GRPO family: the algorithm is
    ``trainer.algorithm.advantage_estimator``'s: ``gae`` trains a critic (PPO), ``grpo``, ``rloo``,
    ``reinforce++``, ... do not), ``dapo`` (main_base's with DAPO's soft overlong punishment),
    ``sft`` (supervised fine-tuning: SkyRL's SFT config, top-level keys), ``distillation``
    (on-policy distillation from ``trainer.ref``'s teacher) or ``generate`` (generation and
    evaluation only, no training). ``schedule``: ``sync``, ``async`` (one step off-policy) or
    ``fully_async`` (``trainer.fully_async``). ``adds``: what the module adds that a ``key=value``
    does not say (None: nothing; the translator refuses a module that adds code corerl lacks).
    ``implies``: corerl settings (dotted key, value) that stand for what the module adds, where
    corerl has it (an environment it registers); set after the keys'. ``registers``: the names it
    adds to SkyRL's registries, each with the corerl settings it stands for, acting where a key
    selects it (:class:`Registered`, :func:`registered`)."""

    id: str
    module: str
    family: Literal["rl", "dapo", "sft", "distillation", "generate"]
    schedule: Literal["sync", "async", "fully_async"] = "sync"
    adds: str | None = None
    implies: tuple[tuple[str, Any], ...] = ()
    registers: tuple[Registered, ...] = ()


#: the module a hand-written ``corerl run --dialect skyrl key=value ...`` starts
DEFAULT_MODULE = "skyrl.train.entrypoints.main_base"

_EX = "examples.train."
_ALG = "trainer.algorithm."
_GYM = "env.skyrl_gym"
_INT = "examples.train_integrations."
ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("main_base", DEFAULT_MODULE, "rl"),
    EntryPoint("dapo", _EX + "algorithms.dapo.main_dapo", "dapo"),
    EntryPoint("dapo_fully_async", _EX + "algorithms.dapo.main_dapo_fully_async", "dapo", "fully_async"),
    EntryPoint("dapo_tis", _EX + "tis_correction.main_tis_dapo", "dapo"),
    EntryPoint("sft", "skyrl.train.main_sft", "sft"),
    # its PerplexityLogger logs exp(min(loss, 20)) each step: corerl's SFT logs that as perplexity itself
    EntryPoint("sft_with_callbacks", _EX + "callbacks.main_sft_with_callbacks", "sft"),
    EntryPoint("fully_async", _EX + "fully_async.main_fully_async", "rl", "fully_async"),
    # a simulated trainer (sleeps instead of training): trainer.fully_async.simulate_training, which it requires
    EntryPoint("fully_async_sim", _EX + "fully_async.main_fully_async_sim", "rl", "fully_async"),
    EntryPoint("async", _EX + "async.main_async", "rl", "async"),
    EntryPoint("on_policy_distillation", _EX + "on_policy_distillation.main_on_policy_distill", "distillation"),
    # generation and evaluation of the model as it is: corerl run's eval.only
    EntryPoint("generate", "skyrl.train.entrypoints.main_generate", "generate", implies=(("eval.only", True),)),
    # registers skyrl-gym's "multiply" (a \boxed{} answer scored 1 right, 0.5 wrong, retried): corerl-skyrl-gym's own
    EntryPoint("multiply", _EX + "multiply.main_multiply", "rl",
               implies=((f"{_GYM}.register.multiply", "corerl_skyrl_gym.multiply:MultiplyEnv"),)),
    EntryPoint("custom_policy_loss", _EX + "algorithms.custom_policy_loss.main_custom_policy_loss", "rl",
               registers=(Registered(_ALG + "policy_loss_type", "reinforce", (("algorithm.policy_loss", "reinforce"),)),)),
    EntryPoint("custom_advantage_estimator", _EX + "algorithms.custom_advantage_estimator.main_custom_adv_est", "rl",
               registers=(Registered(_ALG + "advantage_estimator", "simple_baseline",
                                     (("algorithm.advantage_estimator", "batch_mean"),)),)),
    EntryPoint("llm_as_a_judge", _EX + "llm_as_a_judge.main_llm_judge", "rl",
               implies=((f"{_GYM}.register.llm_as_a_judge", "corerl_skyrl_gym.llm_judge:LLMJudgeEnv"),)),
    EntryPoint("mini_swe_agent", _EX + "mini_swe_agent.main_mini_swe", "rl",
               adds="the mini-SWE-agent generator (agents in Docker sandboxes)"),
    EntryPoint("rlm", _EX + "rlm.main_rlm", "rl", adds="the recursive language model (RLM) environment"),
    # registers skyrl-gym's "geometry3k" (a diagram and a question, answers checked with a calc_score tool call over
    # up to 3 turns, scored as mathematics): corerl-skyrl-gym's own
    EntryPoint("geometry3k", _EX + "geometry3k.geometry3k_entrypoint", "rl",
               implies=((f"{_GYM}.register.geometry3k", "corerl_skyrl_gym.geometry3k:Geometry3kEnv"),)),
    EntryPoint("visgym", _EX + "visgym.entrypoint", "rl", adds="VisGym's vision-language environments"),
    # a memory test: every batch made-up sequences of the full length, the environment never called
    EntryPoint("full_context", "examples.train_scripts.full_context.main_full_ctx", "rl",
               implies=(("data.full_context", True), ("policy.generation.ignore_eos", True), ("data.env_name", None))),
    EntryPoint("verifiers", _INT + "verifiers.entrypoints.main_verifiers", "rl",
               adds="the verifiers library's environments and generator"),
    EntryPoint("openenv", _INT + "openenv.entrypoints.main_openenv", "rl", adds="OpenEnv's environments"),
    EntryPoint("openreward", _INT + "openreward.entrypoints.main_openreward", "rl",
               adds="the OpenReward environment (a hosted service)"),
    EntryPoint("harbor", _INT + "harbor.entrypoints.main_harbor", "rl", adds="Harbor's agent trials (Docker)"),
    EntryPoint("harbor_fully_async", _INT + "harbor.entrypoints.main_harbor_fully_async", "rl", "fully_async",
               adds="Harbor's agent trials (Docker)"),
    EntryPoint("harbor_generate", _INT + "harbor.entrypoints.main_harbor_generate", "generate",
               adds="Harbor's agent trials (Docker)"),
    EntryPoint("thunder_agent", _EX + "thunder_agent.main_thunder_agent", "rl", "fully_async",
               adds="ThunderAgent's router over external inference servers"),
    EntryPoint("harbor_thunder_agent", _EX + "thunder_agent.main_harbor_thunder_agent", "rl", "fully_async",
               adds="Harbor's agent trials with ThunderAgent's router"),
)

#: SkyRL modules a launch script may start that train nothing (a script running only these has no
#: training command): what each is
NOT_TRAINING = {
    "skyrl.train.entrypoints.serve": "SkyRL's inference server",
    "skyrl.tinker.api": "SkyRL's Tinker API server",
}

_BY_MODULE = {e.module: e for e in ENTRY_POINTS}
_BY_ID = {e.id: e for e in ENTRY_POINTS}


def by_module(module: str) -> EntryPoint | None:
    """The entry point a module (``a.b.c``, or a script path ``a/b/c.py``) is, or None."""
    return _BY_MODULE.get(module_of(module))


def by_id(entry_id: str) -> EntryPoint:
    """The entry point with a canonical id (KeyError for another)."""
    return _BY_ID[entry_id]


def registered(entry_id: str, key: str, value: Any) -> tuple[tuple[str, Any], ...] | None:
    """The corerl settings a SkyRL ``key=value`` stands for where the entry point ``entry_id``'s
    module registered ``value`` under ``key`` (None: it did not, or an unknown id)."""
    entry = _BY_ID.get(entry_id)
    for item in entry.registers if entry is not None else ():
        if item.key == key and item.name == value:
            return item.settings
    return None


def known() -> str:
    """The known entry points, for a refusal: SkyRL's own modules, then the examples' by their
    last name (``main_dapo``)."""
    own = [e.module for e in ENTRY_POINTS if e.module.startswith("skyrl.")]
    examples = sorted({e.module.rsplit(".", 1)[-1] for e in ENTRY_POINTS if not e.module.startswith("skyrl.")})
    return f"{', '.join(own)} and the examples' {', '.join(examples)}"


def module_of(target: str) -> str:
    """A module name from what ``python -m`` or ``python`` is given: ``a/b/c.py`` (relative, or
    absolute inside a SkyRL checkout: from its ``examples``/``skyrl`` folder on) is ``a.b.c``."""
    if not target.endswith(".py"):
        return target
    parts = [p for p in target[:-3].split("/") if p not in ("", ".")]
    starts = [i for i, part in enumerate(parts) if part in ("examples", "skyrl")]
    return ".".join(parts[starts[0]:] if starts else parts)


def resolve(target: str, where: str) -> EntryPoint:
    """The entry point ``target`` (a module or script path) is; an unknown one is refused in one
    line naming ``where`` (the script and line) and the known ones."""
    found = by_module(target)
    if found is None:
        raise ConfigError(f"unknown SkyRL entry point {module_of(target)!r}: corerl knows {known()}",
                          source=where, hint="start one of them, or write a corerl recipe")
    return found
