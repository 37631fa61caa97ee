"""NeMo RL's vLLM section (``policy.generation.vllm_cfg`` and ``vllm_kwargs``) in corerl's
configuration: the rules this plugin contributes to the core's NeMo RL dialect (a key without a
rule means what the same key of corerl's ``policy.generation.vllm_cfg`` means). No engine is
imported here."""

from __future__ import annotations

from typing import Any

from corerl.sdk import Rule, SectionRules

acts, inert, inert_with_warning, refused, derived = (Rule.acts, Rule.inert, Rule.inert_with_warning, Rule.refused,
                                                     Rule.derived)
_truthy, _not, _above, _OFF, _PERF, _ENV = Rule.truthy, Rule.other_than, Rule.above, Rule.OFF, Rule.PERF, Rule.ENV

#: as the core's vision rules say it (corerl.config.dialects.nemo_rl_vision.AUDIO_VIDEO)
AUDIO_VIDEO = ("audio and video inputs are not built into corerl yet (images are, with Qwen2-VL, Qwen2.5-VL and "
               "Qwen3-VL (dense) models)")

RULES: dict[str, Rule] = {
    "policy.generation.vllm_cfg.logprobs_mode": inert("corerl takes the model's untempered logprobs from vLLM, as "
                                                      "the loss wants them"),
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's serving, metrics and refit-server settings; corerl "
                                                  "drives vLLM in process or in a Ray actor")
       for key in ("use_tqdm", "enable_vllm_metrics_logger", "vllm_metrics_logger_interval",
                   "http_refit_api_key_env_var", "reset_encoder_cache_after_weight_update", "http_refit_server_port",
                   "zmq_refit_server_port", "distributed_executor_backend", "http_server_serving_chat_kwargs")},
    "policy.generation.vllm_cfg.env_vars": inert_with_warning(_ENV, _truthy),
    "policy.generation.vllm_cfg.expose_http_server": inert("corerl serves the engine over HTTP only to agent "
                                                          "harnesses (env.openai_agent)"),
    "policy.generation.vllm_cfg.is_mx": inert("used only with vllm_cfg.precision: fp8, where it is vLLM's MXFP8 "
                                              "generation (engine_args.quantization=mxfp8)"),
    "policy.generation.vllm_cfg.quantization_ignored_layer_kws": inert(
        "used only with vllm_cfg.precision: fp8, where the layers it names stay unquantised "
        "(engine_args.quantization_config.ignore)"),
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's serving and parsing settings; corerl drives vLLM in "
                                                  "process or in a Ray actor")
       for key in ("skip_tokenizer_init", "reasoning_parser_plugin", "enable_prefix_caching",
                   "enforce_monotonicity", "http_server_serving_chat_kwargs.*")},
    **{f"policy.generation.vllm_cfg.{key}": inert("vLLM's loading and serving settings; corerl drives vLLM in "
                                                  "process or in a Ray actor")
       for key in ("enable_thinking", "load_format", "cap_max_tokens_to_context")},
    "policy.generation.vllm_cfg.limit_mm_per_prompt.image": derived("policy.generation.vllm_cfg.engine_args."
                                                                   "limit_mm_per_prompt.image (vLLM's images a "
                                                                   "prompt may hold)"),
    "policy.generation.vllm_cfg.limit_mm_per_prompt.*": refused(AUDIO_VIDEO),
    "policy.generation.vllm_cfg.async_engine": inert("corerl hands vLLM a step's prompts in one call; the async engine "
                                                     "changes how NeMo RL drives vLLM, not what is sampled"),
    "policy.generation.vllm_cfg.precision": inert("the engine runs in policy.precision; fp8 is vLLM's FP8 "
                                                  "generation (engine_args.quantization=fp8)"),
    "policy.generation.vllm_cfg.enable_expert_parallel": inert_with_warning(
        "corerl's vLLM engine keeps the experts split over its tensor-parallel ranks (vllm_cfg.tensor_parallel_size) "
        "rather than laying them out expert-parallel: the same samples, another speed", _truthy),
    "policy.generation.vllm_cfg.expert_parallel_size": inert_with_warning(
        "corerl's vLLM engine keeps the experts split over its tensor-parallel ranks (vllm_cfg.tensor_parallel_size) "
        "rather than laying them out expert-parallel: the same samples, another speed", _above(1)),
    "policy.generation.vllm_cfg.use_deep_gemm": inert(_PERF),
    "policy.generation.vllm_cfg.num_last_layers_in_bf16": inert(_OFF, _truthy),
    "policy.generation.vllm_cfg.num_first_layers_in_bf16": inert(_OFF, _truthy),
    "policy.generation.vllm_kwargs": acts("policy.generation.vllm_cfg.engine_args"),
    "policy.generation.vllm_cfg.video.*": refused(AUDIO_VIDEO),
}


def _at(tree: Any, path: str) -> Any:
    for part in path.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


ENGINE_ARGS = "policy.generation.vllm_cfg.engine_args"


def _merge(out: Any, source: str, target: str, name: str, value: Any) -> None:
    """``source`` sets ``name`` in the mapping at ``target`` (vLLM's engine arguments, or one of
    them), merged with what ``vllm_kwargs`` and other keys gave there."""
    given = _at(out.tree, target)
    out.put(source, target, {**(given if isinstance(given, dict) else {}), name: value}, f"{target}.{name}")


def translate(raw: dict[str, Any], out: Any) -> None:
    """An evaluation recipe's engine length and precision are the policy's (it has no policy);
    ``vllm_cfg.precision: fp8`` is vLLM's FP8 generation (its engine argument ``quantization=fp8``:
    the engine quantises the weights it loads and each refit's), and ``vllm_cfg.limit_mm_per_prompt.image``,
    vLLM's engine argument, is merged into ``policy.generation.vllm_cfg.engine_args`` (with what
    ``vllm_kwargs`` gave)."""
    prefix = "generation" if out.eval_recipe else "policy.generation"
    precision = f"{prefix}.vllm_cfg.precision"
    if out.value(precision) == "fp8" and not out.switched_off(precision):
        _quantised_generation(out, prefix)
    if out.eval_recipe:
        for key, target in (("generation.vllm_cfg.max_model_len", "policy.max_seq_length"),
                            ("generation.vllm_cfg.precision", "policy.precision")):
            value = out.value(key)
            if value is not None and value != "fp8":
                out.set(key, target, value)
                detail = next((f.detail for f in out.fates if f.key == key and f.fate == "acts"), None)
                out.refate(key, "acts", f"{detail}, {target}" if detail else target)
    source = f"{prefix}.vllm_cfg.limit_mm_per_prompt.image"
    limit = out.value(source)
    if limit is None or out.switched_off(source):
        return
    _merge(out, source, f"{ENGINE_ARGS}.limit_mm_per_prompt", "image", limit)


def _quantised_generation(out: Any, prefix: str) -> None:
    """``vllm_cfg.precision: fp8``: vLLM quantises the weights it loads and each refit's. FP8
    (``quantization=fp8``), or MXFP8 with ``is_mx: true`` (vLLM's online ``mxfp8``); the layers
    ``quantization_ignored_layer_kws`` names by keyword stay in the training precision, through
    vLLM's ``quantization_config.ignore`` (fnmatch patterns, which its online schemes read: FP8
    then takes the online block-wise scheme, ``fp8_per_block``)."""
    precision, is_mx = f"{prefix}.vllm_cfg.precision", f"{prefix}.vllm_cfg.is_mx"
    kws_key = f"{prefix}.vllm_cfg.quantization_ignored_layer_kws"
    kws = [str(k) for k in out.value(kws_key) or []]
    mx = bool(out.value(is_mx)) and not out.switched_off(is_mx)
    method = "mxfp8" if mx else "fp8_per_block" if kws else "fp8"
    _merge(out, precision, ENGINE_ARGS, "quantization", method)
    out.refate(precision, "acts", f"policy.generation.vllm_cfg.engine_args.quantization={method} (vLLM's "
                                  f"{'MXFP8' if mx else 'FP8'} weights)")
    if mx:
        out.refate(is_mx, "acts", "policy.generation.vllm_cfg.engine_args.quantization=mxfp8")
    if kws:
        _merge(out, kws_key, ENGINE_ARGS, "quantization_config", {"ignore": [f"*{k}*" for k in kws]})
        out.refate(kws_key, "acts", "policy.generation.vllm_cfg.engine_args.quantization_config.ignore")


SECTION = SectionRules(rules=RULES, opaque=("policy.generation.vllm_kwargs", "policy.generation.vllm_cfg.env_vars"),
                       derived=translate)
