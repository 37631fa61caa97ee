"""SkyRL's FSDP sections (``trainer.policy.fsdp_config``, ``trainer.ref.fsdp_config``,
``trainer.critic.fsdp_config`` and the SFT entry point's ``fsdp_config``) in corerl's
configuration, and the ``trainer.strategy`` values this plugin runs (``fsdp``, ``fsdp2``, and
SkyRL's RL default): the rules this plugin contributes to the core's SkyRL dialect. No engine is
imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, refused = Rule.acts, Rule.inert, Rule.refused
_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_WRAP = "corerl's dtensor backend wraps each decoder layer"
_PRECISION = "corerl's dtensor backend computes in policy.precision (SkyRL: bf16 parameters, fp32 reductions)"


def _section(prefix: str, target: str | None) -> dict[str, Rule]:
    """One model's ``fsdp_config`` (``target``: corerl's key of its CPU offload; None: inert)."""
    offload = acts(target) if target else inert("the critic's CPU offload follows the policy's layout", Rule.truthy)
    return {
        f"{prefix}.cpu_offload": offload,
        f"{prefix}.reshard_after_forward": inert(_PERF),
        f"{prefix}.fsdp_size": Rule.derived("-1 or every worker: shard over every worker, as corerl's FSDP does; "
                                            "a smaller group (hybrid sharding) is refused"),
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

def derived(raw: dict[str, Any], out: Any) -> None:
    """``fsdp_size``: -1, or the policy's whole worker count (the same sharding), is inert; a
    smaller sharding group (hybrid sharding) is refused."""
    nodes = out.value("trainer.placement.policy_num_nodes") or 1
    gpus = out.value("trainer.placement.policy_num_gpus_per_node") or out.value("placement.num_gpus_per_node") or 1
    for prefix in ("trainer.policy", "trainer.ref", "trainer.critic", ""):
        key = f"{prefix}.fsdp_config.fsdp_size".lstrip(".")
        size = out.value(key)
        if size is None or any(f.key == key for f in out.fates):
            continue  # unset, or another engine's section (already inert in this script)
        if size in (-1, nodes * gpus):
            out.inert(key, f"{size}: shard over every worker ({nodes * gpus}), as corerl's FSDP does")
        else:
            out.refuse(key, f"sharding over {size} of the {nodes * gpus} workers (hybrid sharding) is not built into "
                            "corerl's SkyRL translation", "set it to -1 (shard over every worker)")


SECTION = SectionRules(
    rules=RULES,
    derived=derived,
    claims={"trainer.strategy": ("fsdp", "fsdp2", None), "strategy": ("fsdp", "fsdp2")},
)
