"""SkyRL's FSDP sections (``trainer.policy.fsdp_config``, ``trainer.ref.fsdp_config``,
``trainer.critic.fsdp_config`` and the SFT entry point's ``fsdp_config``) in corerl's
configuration, and the ``trainer.strategy`` values this plugin runs (``fsdp``, ``fsdp2``, and
SkyRL's RL default): the rules this plugin contributes to the core's SkyRL dialect. No engine is
imported here."""

from __future__ import annotations

from corerl.sdk import Rule, SectionRules

acts, inert, refused = Rule.acts, Rule.inert, Rule.refused
_PERF = Rule.PERF

_WRAP = "corerl's dtensor backend wraps each decoder layer"
_PRECISION = "corerl's dtensor backend computes in policy.precision (SkyRL: bf16 parameters, fp32 reductions)"


def _section(prefix: str, target: str | None) -> dict[str, Rule]:
    """One model's ``fsdp_config`` (``target``: corerl's key of its CPU offload; None: inert)."""
    offload = acts(target) if target else inert("the critic's CPU offload follows the policy's layout", Rule.truthy)
    return {
        f"{prefix}.cpu_offload": offload,
        f"{prefix}.reshard_after_forward": inert(_PERF),
        f"{prefix}.fsdp_size": inert("-1: shard over every worker (corerl's FSDP shards over the data-parallel "
                                     "workers; hybrid sharding is policy.dtensor_cfg.dp_replicate_size)",
                                     lambda value: value not in (-1, None)),
        f"{prefix}.mixed_precision.*": inert(_PRECISION),
        f"{prefix}.mixed_precision": inert(_PRECISION),
        f"{prefix}.wrap_policy.*": inert(_WRAP),
        f"{prefix}.wrap_policy": inert(_WRAP),
    }


RULES: dict[str, Rule] = {
    # the value switch: fsdp and fsdp2 run on corerl's dtensor backend (FSDP2; FSDP1's sharding is the same math)
    "trainer.strategy": acts("policy.dtensor_cfg.enabled", lambda _: True,
                             "corerl's dtensor backend (FSDP2) trains the policy"),
    "strategy": acts("policy.dtensor_cfg.enabled", lambda _: True, "corerl's dtensor backend (FSDP2)"),
    **_section("trainer.policy.fsdp_config", "policy.dtensor_cfg.cpu_offload"),
    **_section("trainer.ref.fsdp_config", "policy.reference.cpu_offload"),
    **_section("trainer.critic.fsdp_config", None),
    **_section("fsdp_config", "policy.dtensor_cfg.cpu_offload"),
}

SECTION = SectionRules(
    rules=RULES,
    claims={"trainer.strategy": ("fsdp", "fsdp2", None), "strategy": ("fsdp", "fsdp2")},
)
