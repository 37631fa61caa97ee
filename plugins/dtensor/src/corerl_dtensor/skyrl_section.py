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
_FSDP_SIZE = ("-1 or every worker: shard over every worker, as corerl's FSDP does; a group of N dividing the W "
              "workers (hybrid sharding: sharded within each group, replicated across them): "
              "policy.dtensor_cfg.dp_replicate_size W / N")
_ULYSSES = ("each sequence split over that many ranks: policy.dtensor_cfg.context_parallel_size. corerl splits it "
            "into load-balanced chunks with ring attention, where SkyRL's Ulysses splits it with an all-to-all over "
            "the attention heads: the same split of each sequence over the ranks and the same updates, another "
            "communication pattern (and no need for the heads to divide by it); with trainer.strategy megatron "
            "only 1 is accepted")


def _section(prefix: str, target: str | None, policy: bool = False) -> dict[str, Rule]:
    """One model's ``fsdp_config`` (``target``: corerl's key of its CPU offload; None: inert;
    ``policy``: the policy's, whose ``fsdp_size`` lays out the backend)."""
    offload = acts(target) if target else inert("the critic's CPU offload follows the policy's layout", Rule.truthy)
    return {
        f"{prefix}.cpu_offload": offload,
        f"{prefix}.reshard_after_forward": inert(_PERF),
        f"{prefix}.fsdp_size": Rule.derived(_FSDP_SIZE) if policy else inert(
            "corerl lays this model out as the policy (hybrid sharding or not: the same scores and updates)"),
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
    **_section("trainer.policy.fsdp_config", "policy.dtensor_cfg.cpu_offload", policy=True),
    **_section("trainer.ref.fsdp_config", "policy.reference.cpu_offload"),
    **_section("trainer.critic.fsdp_config", None),
    **_section("fsdp_config", "policy.dtensor_cfg.cpu_offload", policy=True),
    # SkyRL's Ulysses sequence parallelism is its FSDP strategy's (the SFT key aliases the policy's)
    "trainer.policy.sequence_parallel_size": Rule.derived(_ULYSSES),
}

def _workers(out: Any, sft: bool) -> int:
    """The policy's workers in SkyRL's placement (its defaults where the script leaves it)."""
    if sft:
        return (out.value("placement.num_nodes") or 1) * (out.value("placement.num_gpus_per_node") or 4)
    return (out.value("trainer.placement.policy_num_nodes") or 1) * (
        out.value("trainer.placement.policy_num_gpus_per_node") or 1)


def _fated(out: Any, key: str) -> bool:
    return any(f.key == key for f in out.fates)


def _sequence_parallel(out: Any, sft: bool) -> int:
    """``sequence_parallel_size`` (SkyRL's Ulysses): corerl's context parallelism on this backend;
    with another strategy (its section inert in the script) only 1. Returns the size (1: none)."""
    key = "sequence_parallel_size" if sft else "trainer.policy.sequence_parallel_size"
    size = out.value(key)
    if size is None:
        return 1
    if _fated(out, key):  # trainer.strategy picked another engine: this section's keys are inert
        if size != 1:
            out.refuse(key, f"{size}: SkyRL's Ulysses sequence parallelism runs with its FSDP strategy only",
                       "set it to 1 (with megatron, megatron_config.context_parallel_size splits sequences)")
        return 1
    workers = _workers(out, sft)
    if not isinstance(size, int) or size < 1 or workers % size:
        out.refuse(key, f"{size!r} does not divide the policy's {workers} workers", "give a divisor of them")
        return 1
    out.put(key, "policy.dtensor_cfg.context_parallel_size", size,
            "policy.dtensor_cfg.context_parallel_size (ring attention, where SkyRL uses Ulysses)")
    if sft and size > 1 and out.value("use_sequence_packing"):
        out.refuse(key, "context parallelism splits padded rows; packed rows (use_sequence_packing) are not split "
                        "yet", "set use_sequence_packing=false, or sequence_parallel_size=1")
    return size


def derived(raw: dict[str, Any], out: Any) -> None:
    """``sequence_parallel_size`` is context parallelism; the policy's ``fsdp_size`` is -1 or
    every worker (FSDP's own sharding: inert), or a group dividing them: hybrid sharding,
    ``policy.dtensor_cfg.dp_replicate_size`` = workers / ``fsdp_size`` (the data-parallel groups
    the model is replicated over)."""
    sft = out.value("trainer") is None and any(
        out.value(key) is not None for key in ("fsdp_config", "strategy", "sequence_parallel_size", "placement"))
    cp = _sequence_parallel(out, sft)
    workers = _workers(out, sft)
    for key in ("trainer.policy.fsdp_config.fsdp_size", "fsdp_config.fsdp_size"):
        size = out.value(key)
        if size is None or _fated(out, key):
            continue  # unset, or another engine's section (already inert in this script)
        if size in (-1, workers):
            out.inert(key, f"{size}: shard over every worker ({workers}), as corerl's FSDP does")
        elif not isinstance(size, int) or size < 1 or workers % size:
            out.refuse(key, f"{size!r} does not divide the policy's {workers} workers (hybrid sharding shards "
                            "within groups of that many)", "give a divisor of them, or -1 (every worker)")
        elif cp > 1:
            out.refuse(key, f"sharding over {size} of the {workers} workers (hybrid sharding) together with "
                            "sequence_parallel_size > 1 is not built into corerl's dtensor backend",
                       "set it to -1 (shard over every worker), or sequence_parallel_size=1")
        else:
            out.put(key, "policy.dtensor_cfg.dp_replicate_size", workers // size,
                    f"policy.dtensor_cfg.dp_replicate_size {workers // size} (sharded within groups of {size})")


SECTION = SectionRules(
    rules=RULES,
    derived=derived,
    claims={"trainer.strategy": ("fsdp", "fsdp2", None), "strategy": ("fsdp", "fsdp2")},
)
