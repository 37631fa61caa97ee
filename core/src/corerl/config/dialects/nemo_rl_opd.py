"""NeMo RL's GRPO advantage estimator (``grpo.adv_estimator.name``) and its ``opd`` estimator's
``on_policy_distillation`` section, in corerl's configuration.

``grpo``, ``gdpo`` and ``reinforce_plus_plus`` are corerl's ``algorithm.advantage_estimator`` of
the same name. ``opd`` (on-policy distillation: each sampled token's advantage is a teacher's
logprob of it less the student's) is corerl's ``distillation`` algorithm with the reverse KL, its
teacher the one ``on_policy_distillation.teacher_model_by_agent_name`` names (NeMo Gym's agents
may each name another; corerl distils from one), and ``use_orm_advantage`` with
``orm_advantage_weight`` adding that much of each sample's GRPO advantage of its reward
(``algorithm.distillation.outcome_advantage_weight``)."""

from __future__ import annotations

from typing import Any

from corerl.config.dialects.nemo_rl_keys.algorithms import _estimator
from corerl.config.dialects.rules import _OFF, Translator
from corerl.config.tree import set_at, value_at

SECTION = "on_policy_distillation"
NO_RATIO = "loss_fn.disable_ppo_ratio"
TEACHERS = f"{SECTION}.teacher_model_by_agent_name"


def translate(raw: dict[str, Any], out: Translator, algorithm: str | None) -> None:
    """The estimator of ``algorithm``'s section (grpo's, and the sections that share its keys)."""
    key = f"{algorithm}.adv_estimator.name"
    name = value_at(raw, key)
    opd = raw.get(SECTION) if isinstance(raw.get(SECTION), dict) else {}
    if name == "opd":
        _opd(raw, out, key, opd)
        return
    if name is not None:
        try:
            out.put(key, "algorithm.advantage_estimator", _estimator(name))
        except ValueError as exc:
            out.refuse(key, str(exc), "change the value")
    if opd.get("enabled"):
        out.refuse(f"{SECTION}.enabled", f"on-policy distillation acts with grpo.adv_estimator.name opd, and it is "
                   f"{name or 'grpo'!r}", "set grpo.adv_estimator.name=opd, or on_policy_distillation.enabled=false")


def without_ratio(raw: dict[str, Any], out: Translator) -> None:
    """``loss_fn.disable_ppo_ratio``: true is the policy gradient without PPO's ratio, which is
    what corerl's distillation takes (one on-policy pass: each token's ratio is 1); with another
    algorithm only its default, false, is accepted."""
    if NO_RATIO not in out.origins:
        return
    distilling = value_at(out.tree, "algorithm.name") == "distillation"
    if value_at(raw, NO_RATIO) and not distilling:
        out.refuse(NO_RATIO, f"True is not supported: {_OFF}", "remove the key or use NeMo RL's default")
    elif distilling:
        out.inert(NO_RATIO, "corerl's distillation takes one on-policy pass, where each token's ratio is 1: the "
                            "policy gradient without a ratio either way")
    else:
        out.inert(NO_RATIO, _OFF)


def _opd(raw: dict[str, Any], out: Translator, key: str, opd: dict[str, Any]) -> None:
    if not opd.get("enabled"):
        out.refuse(key, "the opd estimator distils from the teachers of on_policy_distillation, which is not enabled",
                   "set on_policy_distillation.enabled=true and name its teacher, or use grpo")
        return
    out.put(key, "algorithm.name", "distillation", "algorithm.name distillation: each sampled token's advantage is "
            "the teacher's logprob of it less the student's (algorithm.distillation.kl_type reverse)")
    out.refate(f"{SECTION}.enabled", "acts", "with grpo.adv_estimator.name opd: corerl's on-policy distillation")
    if value_at(raw, "loss_fn.kl_type") is None:
        set_at(out.tree, "algorithm.distillation.kl_type", "reverse")
    teachers = opd.get("teacher_model_by_agent_name") or {}
    named = sorted({str(path) for path in teachers.values() if path is not None})
    alias = opd.get("default_teacher_alias")
    if len(named) != 1:
        out.refuse(TEACHERS, f"names {len(named)} teachers" + (" (one per NeMo Gym agent)" if named else "") +
                   "; corerl distils from one teacher", "name one checkpoint for every agent (or only a default)")
    else:
        for agent in teachers:
            out.put(f"{TEACHERS}.{agent}", "algorithm.distillation.teacher_model", named[0], "the teacher")
    if alias is not None:
        if teachers and alias not in teachers:
            out.refuse(f"{SECTION}.default_teacher_alias", f"{alias!r} is none of teacher_model_by_agent_name's "
                       f"agents ({', '.join(map(str, teachers))})", "name one of them")
        else:
            out.inert(f"{SECTION}.default_teacher_alias", "names the one teacher")
    for inert, why in (("strict_agent_name_match", "with one teacher, every sample is scored by it"),
                       ("deduplicate_shared_teacher_checkpoints", "one teacher, loaded once")):
        if f"{SECTION}.{inert}" in out.origins:
            out.inert(f"{SECTION}.{inert}", why)
    use = bool(opd.get("use_orm_advantage"))
    weight = float(opd.get("orm_advantage_weight") or 0.0)
    if f"{SECTION}.use_orm_advantage" in out.origins:
        out.inert(f"{SECTION}.use_orm_advantage", "with orm_advantage_weight: whether the outcome advantage is added")
    if f"{SECTION}.orm_advantage_weight" in out.origins:
        if use:
            out.put(f"{SECTION}.orm_advantage_weight", "algorithm.distillation.outcome_advantage_weight", weight)
        else:
            out.inert(f"{SECTION}.orm_advantage_weight", "use_orm_advantage is false")
    elif use:
        out.refuse(f"{SECTION}.use_orm_advantage", "adds the outcome advantage with orm_advantage_weight, which is "
                   "not given", "give orm_advantage_weight")
