"""NeMo RL's ``policy`` section in corerl's configuration: the keys every training and generation
engine shares (model, tokenizer, batch sizes, optimizer, scheduler, generation sampling, MoE and
quantisation switches). The engines' own sections (``policy.<engine>_cfg``) come from the plugins
that register the engines (:class:`corerl.registry.DialectSection`)."""

from __future__ import annotations

from typing import Any

from corerl.config.dialects import nemo_rl_vision as vision
from corerl.config.dialects.rules import (
    _OFF,
    _PERF,
    DERIVED,
    Rule,
    _not,
    _truthy,
    acts,
    derived,
    inert,
    refused,
)


def _torch_optimizer(name: Any) -> str:
    known = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
             # Transformer Engine's fused kernel of AdamW (decoupled weight decay, its default adam_w_mode)
             "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam": "adamw"}
    if name not in known:
        raise ValueError(f"optimizer {name!r} is not one corerl builds; use one of {', '.join(known)}")
    return known[name]


RULES: dict[str, Rule] = {
    # -- policy --
    "policy.tokenizer.name": acts("policy.tokenizer_name"),
    "policy.tokenizer.chat_template": DERIVED,
    "policy.tokenizer.chat_template_kwargs": acts("policy.chat_template_kwargs", lambda value: dict(value or {})),
    "policy.train_global_batch_size": DERIVED,
    "policy.scheduler": DERIVED,
    "policy.scheduler.*": DERIVED,
    "policy.logprob_batch_size": acts("policy.logprob_micro_batch_size"),
    "policy.max_total_sequence_length": acts("policy.max_seq_length"),
    "policy.generation_batch_size": inert("the hf backend generates the whole step's prompts in one batch"),
    "policy.logprob_chunk_size": inert("computing logprobs in chunks of the sequence saves memory and gives the same "
                                       "values; " + _PERF),
    "policy.make_sequence_length_divisible_by": inert("corerl pads rows as its tensor-parallel plan needs"),
    "policy.offload_optimizer_for_logprob": inert("where the optimizer state sits while logprobs are computed "
                                                  "changes memory only; corerl's is policy.offload.policy"),
    "policy.optimizer": inert("null in NeMo RL's recipes whose training engine has an optimizer section of "
                              "its own, which configures it"),
    "policy.optimizer.name": acts("policy.optimizer.name", _torch_optimizer),
    "policy.optimizer.kwargs.lr": acts("policy.optimizer.lr"),
    "policy.optimizer.kwargs.weight_decay": acts("policy.optimizer.weight_decay"),
    "policy.optimizer.kwargs.betas": acts("policy.optimizer.betas"),
    "policy.optimizer.kwargs.eps": acts("policy.optimizer.eps"),
    "policy.optimizer.kwargs.momentum": acts("policy.optimizer.momentum"),
    "policy.optimizer.kwargs.foreach": inert("corerl picks torch's optimizer implementation itself"),
    "policy.optimizer.kwargs.fused": inert("corerl picks torch's optimizer implementation itself"),
    "policy.tokenizer.use_fastokens": inert(_OFF, _truthy),
    "policy.sequence_packing.microbatch_order": inert("the order packed micro-batches run in changes nothing summed "
                                                      "over a step"),
    "policy.draft": inert("null: no draft model (speculative decoding)"),
    "policy.generation.port_range_low": inert("ports of NeMo RL's generation servers; corerl's engines open none"),
    "policy.generation.port_range_high": inert("ports of NeMo RL's generation servers; corerl's engines open none"),
    "policy.generation.val_temperature": derived("with evaluation during training: eval.temperature"),
    **{f"policy.generation.val_{key}": derived(f"evaluation samples with policy.generation.{key}: another value is "
                                               "refused where the recipe evaluates")
       for key in ("top_p", "top_k")},
    "policy.generation.top_k": acts("policy.generation.top_k", lambda value: None if value in (-1, 0) else value,
                                    "-1 and 0 (no top-k, as NeMo RL spells it) are unset"),
    "policy.generation.refit_transport": inert("how NeMo RL moves weights to its engines; corerl's refit is its own "
                                               "(shared memory on one machine, Ray otherwise)"),
    "policy.generation.refit_cfg.*": inert("how NeMo RL moves weights to its engines; corerl's refit is its own"),
    "policy.generation.real_quant_export_cpu_offload": inert(_PERF),
    # generation engines corerl does not have: their settings, inert (policy.generation.backend naming one is refused)
    **{f"policy.generation.{section}.*": inert(f"settings of the {engine} generation engine, which corerl does not "
                                               "have (policy.generation.backend naming it is refused)")
       for section, engine in (("trtllm_cfg", "TensorRT-LLM"), ("trtllm_kwargs", "TensorRT-LLM"),
                               ("dynamo_cfg", "Dynamo"))},
    "policy.generation.use_async_rollouts": inert(_OFF, _truthy),
    "policy.generation.quant_cfg": inert("quantised (ModelOpt) generation is not built into corerl yet",
                                         lambda value: value is not None),
    # NeMo RL's router replay takes the experts vLLM chose while generating: corerl's r3
    "policy.router_replay.enabled": acts("policy.moe.router_replay", lambda on: "r3" if on else "none"),
    "policy.activation_checkpointing_enabled": inert(_OFF, _truthy),
    "policy.quant_cfg": inert("quantisation-aware training (ModelOpt) is not built into corerl yet",
                              lambda value: value is not None),
    **{f"policy.{key}": inert("used only with quantisation-aware training (policy.quant_cfg)")
       for key in ("disable_modelopt_layer_spec", "quant_calib_data", "quant_calib_size", "quant_batch_size",
                   "quant_sequence_length")},
    "policy.tokenizer.video.*": refused(vision.AUDIO_VIDEO),
    "policy.generation.real_quant": inert("quantised generation is not built into corerl yet", _truthy),
    "policy.generation.real_quant_ignore": inert("used only with quantised generation"),
    "policy.refit_buffer_size_gb": inert("how NeMo RL buckets weights for its refit; corerl's refit is its own"),
    "policy.sequence_packing.fuse_loss": inert(_PERF),
    "policy.optimizer.kwargs.*": inert("precision options of NeMo RL's fused optimizer; corerl keeps float32 "
                                       "optimizer state"),
    "policy.draft.*": refused("speculative decoding with a draft model is not built into corerl yet"),
    # vision-language models (NeMo RL's VLM recipes): the Qwen-VL image families on dtensor; _vision() checks the
    # model and the datasets, and refuses megatron's VLM path
    "policy.is_vlm": inert("corerl reads whether the model is a vision-language one from its config.json "
                           f"(model_type); a VLM recipe's model must be a {vision.SUPPORTED_FAMILIES} one"),
    "policy.dequantize_base_checkpoint": acts("policy.dequantize_base_checkpoint"),
    "policy.reward_model_cfg.enabled": derived("true with an rm section: algorithm.name=rm trains a score head on "
                                               "the policy's model; refused in a recipe of another algorithm"),
    "policy.reward_model_cfg.reward_model_type": inert("only Bradley-Terry reward models are built into corerl",
                                                       _not("bradley_terry")),
    "policy.reward_model_cfg.*": refused("a reward-model option corerl does not have"),
    "policy.hf_config_overrides": acts("policy.hf_config_overrides", lambda value: dict(value or {})),
    "policy.tokenizer.is_tokenizer_processor": inert("corerl loads the tokenizer, and a vision-language model's "
                                                     "image processor beside it"),
    "policy.sequence_packing.sequence_length_round": inert("corerl packs exact lengths"),
    "policy.dynamic_batching.sequence_length_round": inert("corerl cuts micro-batches at exact lengths"),
}

SWITCHED_SECTIONS = {
    "policy.dynamic_batching": True, "policy.sequence_packing": True, "policy.draft": False,
    "policy.reward_model_cfg": True,
}
UNSUPPORTED_SECTIONS = {
    "policy.draft": "speculative decoding with a draft model is not built into corerl yet",
}
# mappings taken whole (their keys are not NeMo RL's own)
OPAQUE_KEYS = ("policy.hf_config_overrides", "policy.tokenizer.chat_template_kwargs")
