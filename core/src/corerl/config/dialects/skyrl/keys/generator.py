"""SkyRL's ``generator.*`` in corerl's configuration: sampling, samples per prompt, turns and the
inference engines' shared keys. An engine's own keys (``gpu_memory_utilization``,
``enforce_eager``, ...) come from the plugin that registers the engine (``DialectSection(
dialect="skyrl")``), which also claims the engine's ``generator.inference_engine.backend`` value."""

from __future__ import annotations

from corerl.config.dialects.rules import (
    Rule,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    inert_with_warning,
    refused,
)

_PERF = "a memory or speed switch of SkyRL's: the same updates; corerl leaves the choice to its backend"

_G = "generator."
_E = "generator.inference_engine."
_DELTA = ("weights reach corerl's own engines over its own path (as for weight_sync_backend), not as deltas "
          "through a shared folder")
_OFF = "a switch SkyRL leaves off by default; corerl has no such feature, so only false is accepted"
_ENGINES = "corerl starts one generation engine per worker group; its layout is the engine's section's"


def _stop(value: object) -> list[str] | None:
    return None if value is None else [str(value)] if isinstance(value, str) else [str(v) for v in value]  # type: ignore[union-attr]


def _template_arguments(value: object) -> dict[str, object]:
    """The template's variables; a name no template can read is refused (OmegaConf, which reads
    SkyRL's overrides, takes ``{name:'v'}`` without a space after the colon as one key
    ``name:'v'`` with no value, which SkyRL passes on and no template reads)."""
    arguments = dict(value or {})  # type: ignore[call-overload]
    for name in arguments:
        if not str(name).isidentifier():
            hint = " (YAML reads {name:'v'} as one key; write {name: v}, with a space)" if ":" in str(name) else ""
            raise ValueError(f"{name!r} is not a template variable name, so no chat template reads it{hint}")
    return arguments


def _top_k(value: object) -> int | None:
    return None if value in (None, -1, 0) else int(value)  # type: ignore[call-overload]


RULES: dict[str, Rule] = {
    _G + "n_samples_per_prompt": acts("algorithm.num_generations_per_prompt"),
    _G + "sampling_params.max_generate_length": acts("policy.generation.max_new_tokens"),
    _G + "sampling_params.temperature": acts("policy.generation.temperature"),
    _G + "sampling_params.top_p": acts("policy.generation.top_p"),
    _G + "sampling_params.top_k": acts("policy.generation.top_k", _top_k, "-1: no top-k"),
    _G + "sampling_params.min_p": inert("corerl samples without a min-p cut", lambda v: v not in (None, 0, 0.0)),
    _G + "sampling_params.repetition_penalty": inert("corerl samples without a repetition penalty",
                                                     lambda v: v not in (None, 1, 1.0)),
    _G + "sampling_params.logprobs": inert("corerl keeps the sampled tokens' logprobs"),
    _G + "sampling_params.stop": acts("policy.generation.stop_strings", _stop),
    _G + "sampling_params.additional_kwargs": inert("engine sampling arguments corerl does not pass", _truthy),
    _G + "eval_sampling_params.temperature": acts("eval.temperature"),
    _G + "eval_sampling_params.max_generate_length": inert("corerl's evaluation answers within "
                                                           "policy.generation.max_new_tokens"),
    _G + "eval_sampling_params.top_p": inert("corerl's evaluation samples with the training top_p"),
    _G + "eval_sampling_params.top_k": inert("corerl's evaluation samples with the training top_k"),
    _G + "eval_sampling_params.stop": inert("corerl's evaluation stops where training does "
                                            "(generator.sampling_params.stop)"),
    _G + "eval_sampling_params.*": inert("corerl's evaluation samples as training does, at eval.temperature"),
    _G + "eval_n_samples_per_prompt": derived("with evaluation during training: eval.num_samples"),
    _G + "batched": inert("corerl generates a step's prompts as one batch in its single-turn rollout and "
                          "per episode in its multi-turn one"),
    _G + "max_turns": acts("algorithm.max_rollout_turns"),
    _G + "max_input_length": inert("corerl bounds an episode by policy.max_seq_length"),
    _G + "use_conversation_multi_turn": derived("false over several turns: env.skyrl_gym.conversation_format false, "
                                                "the environment's observations appended as text inside the model's "
                                                "one assistant message (their tokens out of the loss); true: each "
                                                "observation a new message of the conversation (corerl's default); "
                                                "with one turn (generator.max_turns 1) either value is inert"),
    _G + "append_eos_token_after_stop_str_in_multi_turn": inert("corerl ends a turn at its stop string as "
                                                                "the chat template does"),
    _G + "zero_reward_on_non_stop": acts("algorithm.overlong_penalty.truncated_reward_factor",
                                         lambda v: 0.0 if v else None, "true: a truncated answer's reward is 0"),
    _G + "use_cache_salt": inert(_PERF),
    _G + "apply_overlong_filtering": acts("algorithm.overlong_filtering"),
    _G + "step_wise_trajectories": acts("algorithm.step_wise_trajectories"),
    _G + "merge_stepwise_output": acts("algorithm.step_wise_merge"),
    _G + "vision_language_generator": inert("true: SkyRL's vision-language generator, which gives the model the prompt's "
                                            "images (and an observation's); corerl's rollout does so whenever the rows "
                                            "have images and the policy is a vision-language model (a text-only "
                                            "policy's rows with images are refused), and on text rows both are the same"),
    _G + "chat_template.source": inert("name: the tokenizer's own template", _not("name")),
    _G + "chat_template.name_or_path": acts("policy.chat_template"),
    _G + "chat_template_kwargs": acts("policy.chat_template_kwargs", _template_arguments),
    # the example-specific generators' keys: their entry points' features
    _G + "rate_limit.*": refused("SkyRL's rate-limited agent generator is not built into corerl"),
    _G + "miniswe_config_path": refused("the mini-SWE-agent generator is not built into corerl"),
    _G + "miniswe_traj_dir": refused("the mini-SWE-agent generator is not built into corerl"),
    _G + "enable_child_agents": refused("SkyRL's recursive-LM child agents are not built into corerl"),
    _G + "train_child_trajectories": refused("SkyRL's recursive-LM child agents are not built into corerl"),
    "harbor_trial_config.*": refused("the Harbor agent harness's trials are not built into corerl"),
    # the inference engines' shared keys
    _E + "num_engines": inert(_ENGINES),
    _E + "run_engines_locally": derived("false: generation by servers started apart from the run "
                                        "(policy.generation.backend remote: docs/generation-backends.md); true: corerl "
                                        "starts its generation engines itself"),
    _E + "weight_sync_backend": inert("corerl hands weights to its engines over its own path (CUDA IPC where "
                                      "colocated, NCCL otherwise)"),
    _E + "weight_transfer_threshold_cuda_ipc_GB": inert(_PERF),
    _E + "model_dtype": inert("the engine samples in the policy's precision"),
    _E + "distributed_executor_backend": inert(_ENGINES),
    _E + "async_engine": inert("corerl's engines serve requests asynchronously"),
    _E + "served_model_name": inert("corerl's engines are not served over HTTP"),
    _E + "language_model_only": inert("corerl loads the model's language part for text prompts"),
    _E + "external_proxy_url": derived("with run_engines_locally false: policy.generation.remote.proxy_url"),
    _E + "external_server_urls": derived("with run_engines_locally false: policy.generation.remote.urls"),
    # a serving layout: the same samples whichever engine prefills; corerl's engines do both
    _E + "enable_pd": inert_with_warning("prefill/decode disaggregation (prefill engines handing the cache to decode "
                                         "engines) is a serving layout of SkyRL's: corerl's engines each prefill and "
                                         "decode their own requests, the same samples without the split's speed",
                                         _truthy),
    _E + "num_prefill": inert("used only with enable_pd: corerl's engines each prefill their own requests"),
    _E + "router_init_kwargs": inert("used only with several engines behind SkyRL's router"),
    # SkyRL's weight transport through a shared folder (its trainer publishes deltas, its engines
    # apply them); corerl's engines are its own, started here, and get the weights as with any
    # weight_sync_backend: the same weights, another path (external servers take them over HTTP)
    _E + "delta_weight_sync.sync_dir": inert_with_warning(_DELTA + "; nothing is published to this folder",
                                                          lambda value: value not in (None, "")),
    _E + "delta_weight_sync.*": inert(_DELTA),
    _E + "delta_weight_sync": inert("null: weights are handed over directly"),
    _E + "enable_ray_prometheus_stats": inert("SkyRL's metrics export; corerl logs its own"),
    _E + "thunder_agent_mode": refused("ThunderAgent's inference mode is not built into corerl"),
    _E + "thunder_agent_profile_enabled": refused("ThunderAgent's inference mode is not built into corerl"),
    _E + "thunder_agent_metrics_enabled": refused("ThunderAgent's inference mode is not built into corerl"),
}
