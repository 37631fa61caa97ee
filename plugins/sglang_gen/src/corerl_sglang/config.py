"""``policy.generation.sglang_cfg``: the SGLang engine's settings, named as SGLang's own server
arguments (and NeMo RL's ``sglang_cfg``) name them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from corerl.sdk import setting

#: this section's settings that are SGLang's server arguments of the same name
SERVER_ARGUMENTS = ("tp_size", "dp_size", "pp_size", "ep_size", "base_gpu_id", "mem_fraction_static",
                    "max_running_requests", "disable_cuda_graph", "disable_prefill_cuda_graph",
                    "enable_weights_cpu_backup")
#: server arguments the plugin sets itself (from the run's config): not to be given in engine_args
OWNED_ARGUMENTS = {
    **{name: f"policy.generation.sglang_cfg.{name}" for name in SERVER_ARGUMENTS},
    "model_path": "policy.model_name (the engine starts on the policy's checkpoint, then takes every refit)",
    "tokenizer_path": "policy.model_name (the engine's tokenizer matches stop strings on the decoded text)",
    "skip_tokenizer_init": "the plugin: the engine keeps its tokenizer, which matches stop strings",
    "dtype": "policy.precision",
    "random_seed": "policy.generation.sglang_cfg.random_seed",
    "context_length": "policy.generation.sglang_cfg.context_length",
    "enable_deterministic_inference": "policy.generation.sglang_cfg.seeded",
    "enable_memory_saver": "the plugin: on where the engine sleeps between rollouts (colocated)",
    "trust_remote_code": "corerl never runs Python code shipped inside a checkpoint (docs/security.md)",
}


@attrs.define(kw_only=True)
class SglangConfig:
    """Settings of the sglang generation backend (SGLang's offline engine, in a Ray actor on the
    training ranks' first node; its tensor-parallel ranks are SGLang's own worker processes on
    that node's GPUs from ``base_gpu_id`` on)."""

    tp_size: int = setting(1, min=1, help="GPUs one SGLang engine's weights are split over (its tp_size)")
    dp_size: int = setting(1, min=1, max=1, help="SGLang's data-parallel replicas inside the engine: 1 (SGLang refits "
                                                 "an engine of one replica only)")
    pp_size: int = setting(1, min=1, help="pipeline stages of the engine (SGLang's pp_size)")
    ep_size: int = setting(1, min=1, help="expert-parallel ranks of a mixture of experts within the engine's "
                                          "tensor-parallel ranks (SGLang's ep_size)")
    base_gpu_id: int = setting(0, min=0, help="the first GPU of the training ranks' first node the engine takes (then the next "
                                              "tp_size x dp_size x pp_size - 1); colocated: the training ranks' GPUs")
    mem_fraction_static: float = setting(0.6, min=0.0, min_exclusive=True, max=1.0,
                                         help="share of each GPU's memory SGLang takes for weights and KV cache")
    context_length: int | None = setting(None, min=1, help="the engine's longest sequence, prompt and completion; "
                                                           "unset: policy.max_seq_length (SGLang is given 2 more: "
                                                           "it ends a request 2 tokens before its context length)")
    seeded: bool = setting(True, help="seed each request (a prompt's request seed plus the sample's index, as corerl's "
                                      "other engines do), through SGLang's deterministic inference, whose sampler is "
                                      "slower; false: SGLang's faster sampler, which reads no seeds (runs do not "
                                      "reproduce)")
    random_seed: int | None = setting(None, help="the engine's seed; unset: algorithm.seed")
    max_running_requests: int | None = setting(None, min=1, help="requests SGLang runs at once; unset: SGLang's own")
    disable_cuda_graph: bool = setting(False, help="run the decoder without CUDA graphs (faster start, slower decode)")
    disable_prefill_cuda_graph: bool = setting(False, help="run prefill without CUDA graphs (SGLang's piecewise "
                                                           "graphs; NeMo RL's disable_piecewise_cuda_graph)")
    enable_weights_cpu_backup: bool = setting(
        True, help="keep a copy of the weights in host memory while the engine sleeps, so that sleeping frees "
                   "them too (false: a sleeping engine frees its KV cache and CUDA graphs only)")
    refit_bucket_mib: float = setting(512, min=0.0, min_exclusive=True,
                                      help="a refit hands SGLang the weights in groups of about this size")
    engine_args: dict[str, Any] = setting({}, help="further SGLang server arguments (sglang.srt.server_args.ServerArgs), "
                                                   "passed through as given")

    def server_arguments(self) -> dict[str, Any]:
        """The arguments of this section that are SGLang's server arguments of the same name."""
        return {name: getattr(self, name) for name in SERVER_ARGUMENTS}

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """The engine's length holds every sequence of the run; engine_args repeats none of the
        arguments the plugin sets (nor trust_remote_code)."""
        for name in sorted(set(self.engine_args) & set(OWNED_ARGUMENTS)):
            yield (f"engine_args.{name}", f"set by {OWNED_ARGUMENTS[name]}: remove it from engine_args")
        longest = config.policy.max_seq_length
        if self.context_length is not None and self.context_length < longest:
            yield ("context_length", f"must be at least policy.max_seq_length ({longest}): completions end there")
