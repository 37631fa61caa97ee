"""NeMo RL's dtensor sections (``policy.dtensor_cfg``, the critic's ``value.dtensor_cfg``, and the
teacher's and reward model's ``dtensor_cfg.cpu_offload``) in corerl's configuration: the rules this
plugin contributes to the core's NeMo RL dialect (a key without a rule means what the same key of
corerl's ``policy.dtensor_cfg`` means). No engine is imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, inert_with_warning, refused = Rule.acts, Rule.inert, Rule.inert_with_warning, Rule.refused
_truthy, _PERF, _ENV = Rule.truthy, Rule.PERF, Rule.ENV

RULES: dict[str, Rule] = {
    "policy.dtensor_cfg._v2": inert("corerl has one DTensor path (FSDP2 by default)"),
    "policy.dtensor_cfg.env_vars": inert_with_warning(_ENV, _truthy),
    "policy.dtensor_cfg.automodel_kwargs": inert("corerl loads models with transformers directly", _truthy),
    "policy.dtensor_cfg.clear_cache_every_n_steps": inert(_PERF),
    "policy.dtensor_cfg.automodel_kwargs.*": inert("corerl loads models with transformers directly"),
    "env.reward_model.dtensor_cfg.cpu_offload": acts("reward_model.cpu_offload"),
    "policy.dtensor_cfg.moe_parallelizer.*": inert("Automodel's MoE wrapping options; corerl's dtensor backend lays "
                                                   "experts out itself (policy.dtensor_cfg.expert_parallel_size)"),
    "teacher.dtensor_cfg.cpu_offload": acts("algorithm.distillation.teacher_cpu_offload"),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_vision_tower": acts("policy.freeze_vision_tower"),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_audio_tower": inert(
        "corerl trains no audio tower (audio models are not built in)"),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_language_model": inert(
        "corerl trains the language model (with LoRA, its adapters)", _truthy),
    "policy.dtensor_cfg.automodel_kwargs.freeze_config.*": refused(
        "an Automodel freeze option corerl does not have (freeze_vision_tower is policy.freeze_vision_tower)"),
    "policy.dtensor_cfg.lora_cfg.match_all_linear": acts("policy.lora.match_all_linear"),
    "policy.dtensor_cfg.lora_cfg.lora_A_init": acts("policy.lora.lora_A_init"),
    "policy.dtensor_cfg.lora_cfg.use_triton": inert("PEFT's LoRA layers run (no Triton kernels of NeMo RL's)"),
    # LoRA: the section maps to policy.lora (PEFT)
    **{f"policy.dtensor_cfg.lora_cfg.{key}": acts(f"policy.lora.{target}")
       for key, target in (("enabled", "enabled"), ("target_modules", "target_modules"),
                           ("exclude_modules", "exclude_modules"), ("dim", "dim"), ("alpha", "alpha"),
                           ("dropout", "dropout"), ("dropout_position", "dropout_position"))},
    "value.dtensor_cfg.lora_cfg.enabled": inert("the critic trains whole: LoRA is the policy's", _truthy),
}


def derived(raw: dict[str, Any], out: Any) -> None:
    """``sequence_parallel`` with one tensor-parallel rank has no effect in NeMo RL: off in corerl."""
    if out.value("policy.dtensor_cfg.sequence_parallel") and (
            out.value("policy.dtensor_cfg.tensor_parallel_size") or 1) == 1 and out.value(
            "policy.dtensor_cfg.enabled") is not False:
        out.make_inert("policy.dtensor_cfg.sequence_parallel", "policy.dtensor_cfg.sequence_parallel", False,
                       "true with tensor_parallel_size 1: no effect in NeMo RL, off in corerl")


SECTION = SectionRules(
    rules=RULES,
    switched={"policy.dtensor_cfg": True, "policy.dtensor_cfg.lora_cfg": False, "value.dtensor_cfg": True,
              "value.dtensor_cfg.lora_cfg": False},
    opaque=("policy.dtensor_cfg.env_vars",),
    frozen_inert=("dtensor_cfg._v2", "dtensor_cfg.activation_checkpointing", "dtensor_cfg.lora_cfg",
                  "dtensor_cfg.clear_cache_every_n_steps"),
    derived=derived,
)
