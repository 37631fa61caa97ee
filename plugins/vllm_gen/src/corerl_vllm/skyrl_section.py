"""SkyRL's inference engine's own keys (``generator.inference_engine.*``: memory, layout, eager
mode, batching, the engine's arguments) in corerl's configuration, and the
``generator.inference_engine.backend`` value this plugin runs (``vllm``, SkyRL's default): the
rules this plugin contributes to the core's SkyRL dialect. No engine is imported here.

``engine_init_kwargs`` are vLLM's own engine arguments, which SkyRL passes to the engine last, as
given: corerl passes them the same way (``policy.generation.vllm_cfg.engine_args``, also applied
last). Those corerl sets itself from other keys (the checkpoint, the precision, the engine's
parallel layout, LoRA, the weight-refit extension) are refused, naming the key that sets them."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, refused = Rule.acts, Rule.inert, Rule.refused
_truthy, _not = Rule.truthy, Rule.other_than
_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_E = "generator.inference_engine."
_TO = "policy.generation.vllm_cfg."
_SERVING = "vLLM's scheduling and serving settings; corerl drives vLLM in process or in a Ray actor"


RULES: dict[str, Rule] = {
    _E + "backend": acts("policy.generation.backend", lambda _: "vllm", "vLLM generates the rollouts"),
    _E + "gpu_memory_utilization": acts(_TO + "gpu_memory_utilization"),
    _E + "tensor_parallel_size": acts(_TO + "tensor_parallel_size"),
    _E + "pipeline_parallel_size": acts(_TO + "pipeline_parallel_size"),
    _E + "enforce_eager": acts(_TO + "enforce_eager"),
    _E + "max_num_seqs": acts(_TO + "engine_args.max_num_seqs"),
    _E + "max_num_batched_tokens": acts(_TO + "engine_args.max_num_batched_tokens"),
    _E + "enable_prefix_caching": inert(_SERVING),
    _E + "enable_chunked_prefill": inert(_SERVING),
    # SkyRL requires expert_parallel_size = data_parallel_size x tensor_parallel_size: the engine's own ranks
    _E + "expert_parallel_size": Rule.inert_with_warning(
        "corerl's vLLM engine keeps the experts split over its tensor-parallel ranks (the same GPUs SkyRL lays "
        "them out expert-parallel over) rather than expert-parallel: the same samples, another speed",
        lambda value: value not in (1, None)),
    _E + "data_parallel_size": inert("corerl starts one vLLM engine per generation group",
                                     lambda value: value != 1),
    _E + "vllm_v1_disable_multiproc": inert(_SERVING),
    _E + "enable_return_routed_experts": inert("corerl takes the routes from vLLM where policy.moe.router_replay "
                                               "asks for them"),
    _E + "fully_sharded_loras": inert(_PERF),
    _E + "offload_kv_for_weight_sync": inert(_PERF),
    _E + "use_expandable_segments": inert(_PERF),
    _E + "speculative_config": acts(_TO + "speculative_config"),
    "trainer.mtp.num_speculative_tokens": Rule.derived(
        "with trainer.mtp.enabled: policy.generation.vllm_cfg.speculative_config {method: mtp, "
        "num_speculative_tokens: N}, the trained heads drafting (generator.inference_engine.speculative_config, "
        "where given, is passed instead)"),
    _E + "engine_init_kwargs.max_model_len": acts(_TO + "max_model_len"),
    _E + "engine_init_kwargs.enable_log_requests": inert(_SERVING),
    # prefill/decode disaggregation's cache hand-over (enable_pd, inert in the core's rules): not passed
    _E + "engine_init_kwargs.kv_transfer_config.*": Rule.inert_with_warning(
        "vLLM's KV-cache transfer between prefill and decode engines (SkyRL's enable_pd): corerl's engines each keep "
        "their own cache, so it is not passed; the same samples", lambda value: value is not None),
    _E + "engine_init_kwargs.chat_template": acts("policy.chat_template"),
    _E + "engine_init_kwargs.language_model_only": inert("corerl loads the model's language part for text prompts"),
    _E + "engine_init_kwargs.*": Rule.derived("passed to vLLM as given, as SkyRL passes them: "
                                              "policy.generation.vllm_cfg.engine_args (an argument corerl sets "
                                              "itself from another key is refused, naming that key)"),
    _E + "engine_init_kwargs": inert("no engine arguments"),
}

#: vLLM engine arguments corerl sets itself -> the SkyRL key (or what) that sets them in corerl
_SET_BY_CORERL: dict[str, str] = {
    **dict.fromkeys(("model", "tokenizer"), "trainer.policy.model.path (the policy's checkpoint: generation "
                                            "refits it)"),
    "dtype": "trainer.bf16 (corerl generates in the precision it trains in, policy.precision)",
    "seed": "trainer.seed (each request's seed derives from it)",
    **{key: f"generator.inference_engine.{key} (corerl places the engine's ranks and memory by it)" for key in (
        "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization")},
    "enforce_eager": "generator.inference_engine.enforce_eager",
    **dict.fromkeys(("data_parallel_size", "distributed_executor_backend"),
                    "corerl itself (one engine per generation group, laid out by "
                    "policy.generation.vllm_cfg.engine_layout)"),
    **dict.fromkeys(("context_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"),
                    "the training backend's context parallelism only (corerl places vLLM's ranks by "
                    "tensor_parallel_size and pipeline_parallel_size)"),
    **dict.fromkeys(("enable_lora", "max_loras", "max_lora_rank", "enable_mixed_moe_lora_format"),
                    "trainer.policy.model.lora.rank (corerl sizes vLLM's LoRA from the policy's adapter)"),
    "worker_extension_cls": "corerl itself (its extension loads the trained weights into the engine)",
    "trust_remote_code": "nothing: corerl never runs Python code shipped inside a checkpoint (docs/security.md)",
    **dict.fromkeys(("hf_overrides", "rope_scaling", "rope_theta", "rope_parameters"),
                    "trainer.policy.model_config_kwargs (corerl lays it over the checkpoint's config for training "
                    "and generation alike)"),
}
_ARGS = _E + "engine_init_kwargs."
#: engine_init_kwargs with a rule of their own (above)
_OWN = ("max_model_len", "enable_log_requests", "kv_transfer_config", "chat_template", "language_model_only")


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}.{key}")]
    return [(prefix, node)]


def _drafter(out: Any) -> None:
    """``trainer.mtp.enabled``: vLLM drafts with the checkpoint's multi-token-prediction heads (SkyRL's
    ``speculative_config`` method mtp, ``trainer.mtp.num_speculative_tokens`` deep, default 1), unless
    ``generator.inference_engine.speculative_config`` is given (passed as it is)."""
    key, depth = "trainer.mtp.num_speculative_tokens", out.value("trainer.mtp.num_speculative_tokens")
    if out.value(_E + "backend") not in (None, "vllm"):
        return  # another engine generates: this section's keys are inert in the script already
    if out.value("trainer.mtp.enabled") not in (True, "true", "True"):
        if depth is not None:
            out.inert(key, "used only with trainer.mtp.enabled")
        return
    if out.value(_E + "speculative_config") is not None:
        if depth is not None:
            out.inert(key, "generator.inference_engine.speculative_config gives vLLM's speculative decoding")
        return
    config = {"method": "mtp", "num_speculative_tokens": 1 if depth is None else depth}
    if depth is None:
        out.set("trainer.mtp.enabled", _TO + "speculative_config", config)
    else:
        out.put(key, _TO + "speculative_config", config)


def derived(raw: dict[str, Any], out: Any) -> None:
    """``engine_init_kwargs``: each argument without a rule of its own goes to
    ``policy.generation.vllm_cfg.engine_args`` at its place in the mapping (``kernel_config.moe_backend``
    inside ``kernel_config``); one corerl sets itself is refused. An argument that is also one of
    the engine's own keys corerl passes in ``engine_args`` (``max_num_seqs``) wins, as in SkyRL,
    where ``engine_init_kwargs`` are applied last: the other key is then inert."""
    _drafter(out)
    given = out.value(_ARGS[:-1])
    if not isinstance(given, dict):
        return
    for path, value in _leaves(given, _ARGS[:-1]):
        name = path[len(_ARGS):]
        top = name.split(".")[0]
        if top in _OWN or any(f.key == path for f in out.fates):
            continue  # its own rule, or the section is inert in this script (another engine)
        if top in _SET_BY_CORERL:
            out.refuse(path, f"a vLLM engine argument corerl sets itself, from {_SET_BY_CORERL[top]}",
                       "remove it from engine_init_kwargs" + (
                           "" if not _SET_BY_CORERL[top].startswith(("trainer.", "generator.")) else
                           f" (set {_SET_BY_CORERL[top].split(' ')[0]})"))
            continue
        out.put(path, _TO + "engine_args." + name, value)
        shadowed = _E + top
        if top in ("max_num_seqs", "max_num_batched_tokens") and out.value(shadowed) is not None:
            out.refate(shadowed, "inert", f"engine_init_kwargs.{top} overrides it (SkyRL applies engine_init_kwargs "
                                          "last)")


SECTION = SectionRules(rules=RULES, derived=derived, claims={_E + "backend": ("vllm", None)},
                       opaque=(_E + "speculative_config",))  # vLLM's speculative_config, passed whole
