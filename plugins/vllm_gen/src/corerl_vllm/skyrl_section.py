"""SkyRL's inference engine's own keys (``generator.inference_engine.*``: memory, layout, eager
mode, batching, the engine's arguments) in corerl's configuration, and the
``generator.inference_engine.backend`` value this plugin runs (``vllm``, SkyRL's default): the
rules this plugin contributes to the core's SkyRL dialect. No engine is imported here."""

from __future__ import annotations

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
    _E + "expert_parallel_size": inert("corerl's vLLM engines shard experts with their tensor-parallel ranks",
                                       lambda value: value != 1),
    _E + "data_parallel_size": inert("corerl starts one vLLM engine per generation group",
                                     lambda value: value != 1),
    _E + "vllm_v1_disable_multiproc": inert(_SERVING),
    _E + "enable_return_routed_experts": inert("corerl takes the routes from vLLM where policy.moe.router_replay "
                                               "asks for them"),
    _E + "fully_sharded_loras": inert(_PERF),
    _E + "offload_kv_for_weight_sync": inert(_PERF),
    _E + "use_expandable_segments": inert(_PERF),
    _E + "speculative_config": refused("speculative decoding is not built into corerl's rollouts"),
    _E + "engine_init_kwargs.max_model_len": acts(_TO + "max_model_len"),
    _E + "engine_init_kwargs.enable_log_requests": inert(_SERVING),
    _E + "engine_init_kwargs.kv_transfer_config.*": refused("vLLM's KV transfer between engines is not built into "
                                                            "corerl"),
    _E + "engine_init_kwargs.chat_template": acts("policy.chat_template"),
    _E + "engine_init_kwargs.language_model_only": inert("corerl loads the model's language part for text prompts"),
    _E + "engine_init_kwargs.quantization": refused("quantised generation is not built into corerl"),
    _E + "engine_init_kwargs.*": refused("a vLLM engine argument the dialect does not map (a corerl recipe gives it "
                                         "as policy.generation.vllm_cfg.engine_args)"),
    _E + "engine_init_kwargs": inert("no engine arguments"),
}

SECTION = SectionRules(rules=RULES, claims={_E + "backend": ("vllm", None)})
