"""The vllm backend's ``adapter_sampler``: ``corerl serve RECIPE`` samples its many LoRA adapters
with one vLLM engine on the base model, each request with its own adapter (a ``LoRARequest``).

The engine holds ``max_adapters`` adapters at once (vLLM's ``max_loras``, and as many kept in host
memory), of rank up to ``max_rank`` rounded up to a rank vLLM takes (``max_lora_rank``,
:data:`corerl_vllm.support.VLLM_LORA_RANKS`), in the recipe's ``policy.precision``. An adapter is
a PEFT folder the service exported; vLLM loads it at its first request and keeps it until the
folder's weights change or more adapters than it holds were asked for (least recently used
first). The logprobs are vLLM's ``processed_logprobs``: those of the distribution sampled from,
after temperature (at temperature 0, the model's own), and after ``top_k``/``top_p`` truncation
where a request asks for it.

The CPU traps of :mod:`corerl_vllm.engine` hold here too: vLLM runs in this process on a machine
without a GPU (whole-prompt prefill, which seeded sampling needs there), in worker processes on a GPU.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from corerl.sdk import EngineNotAvailable
from corerl_vllm.engine import (
    INSTALL_HINT,
    _hide_broken_vision_packages,
    cpu_kv_cache_bytes,
    resolve_layout,
    shutdown_llm,
    tokens_prompt,
    vllm_lora_rank,
)
from corerl_vllm.support import VLLM_LORA_RANKS

#: what the service reads from a folder: PEFT's adapter files
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def build(config: Any, model_path: str | Path, max_adapters: int, max_rank: int) -> VllmAdapterSampler:
    """The registration's ``adapter_sampler`` (:class:`corerl.sdk.GenerationBackend`)."""
    if max_rank > VLLM_LORA_RANKS[-1]:
        raise EngineNotAvailable(f"vLLM serves LoRA adapters up to rank {VLLM_LORA_RANKS[-1]}, and corerl serve was "
                                 f"asked to take ranks up to {max_rank}", key="policy.generation.backend",
                                 hint=f"start corerl serve with --max-lora-rank {VLLM_LORA_RANKS[-1]} or less, or "
                                      "sample with policy.generation.backend=hf")
    return VllmAdapterSampler(config, str(model_path), max_adapters, max_rank)


class VllmAdapterSampler:
    """One ``vllm.LLM`` with LoRA enabled, sampling each request under its own adapter folder."""

    #: vLLM adapts the decoder layers' projections only, not the output projection
    takes_unembed = False

    def __init__(self, config: Any, model_path: str, max_adapters: int, max_rank: int) -> None:
        import torch

        settings = config.section("policy.generation.vllm_cfg")
        policy = config.core.policy
        on_gpu = torch.cuda.is_available()
        layout = resolve_layout(settings.engine_layout, on_gpu)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if layout == "in_process" else "1"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        _hide_broken_vision_packages()
        try:
            from vllm import LLM
        except Exception as exc:  # a broken install says what to do, in one line
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise EngineNotAvailable(f"generation backend 'vllm' cannot sample corerl serve's adapters: vLLM failed "
                                     f"to import ({type(exc).__name__}: {first})", key="policy.generation.backend",
                                     hint=INSTALL_HINT) from exc
        self.max_length = int(settings.max_model_len or policy.max_seq_length)
        self.max_adapters = max_adapters
        kwargs: dict[str, Any] = dict(
            model=model_path, tokenizer=model_path, dtype=policy.precision, max_model_len=self.max_length,
            enforce_eager=(not on_gpu) if settings.enforce_eager is None else settings.enforce_eager,
            tensor_parallel_size=settings.tensor_parallel_size, pipeline_parallel_size=settings.pipeline_parallel_size,
            seed=config.core.algorithm.seed, enable_lora=True, max_loras=max_adapters, max_cpu_loras=max_adapters,
            max_lora_rank=vllm_lora_rank(max_rank), logprobs_mode="processed_logprobs",
        )
        if on_gpu:
            kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
        else:
            kwargs["enable_chunked_prefill"] = False  # seeded sampling on CPU needs whole-prompt prefill
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(config, self.max_length)
        kwargs.update(settings.engine_args)
        self.llm: Any = LLM(**kwargs)
        self._ids: OrderedDict[str, tuple[int, int]] = OrderedDict()  # folder -> (its weights' mtime, lora id)
        self._next_id = 0
        self._lock = threading.Lock()

    def sample(self, adapter: str | None, prompt: list[int], num_samples: int, *, max_tokens: int,
               temperature: float, top_k: int, top_p: float, seed: int | None, stop_tokens: list[int],
               stop_strings: list[str], stop_at_eos: bool) -> list[dict[str, Any]]:
        from vllm import SamplingParams

        # one request a sample (vLLM takes n > 1 only when sampling at random), sample j seeded seed + j
        # as vLLM seeds the samples of one request
        params = [SamplingParams(
            n=1, temperature=temperature, top_k=top_k if top_k > 0 else 0, top_p=top_p, max_tokens=max_tokens,
            seed=None if seed is None else seed + j, logprobs=0, stop=list(stop_strings) or None,
            stop_token_ids=list(stop_tokens) or None, ignore_eos=not stop_at_eos,
        ) for j in range(num_samples)]
        with self._lock:
            request = self._request(adapter) if adapter is not None else None
            outputs = self.llm.generate([tokens_prompt(list(prompt), None)] * num_samples, params, use_tqdm=False,
                                        lora_request=request)
        samples = []
        for completion in (output.outputs[0] for output in outputs):
            tokens = [int(t) for t in completion.token_ids]
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, tokens, strict=True)]
            samples.append({"tokens": tokens, "logprobs": logprobs,
                            "stop_reason": "length" if completion.finish_reason == "length" else "stop"})
        return samples

    def _request(self, adapter: str) -> Any:
        """The ``LoRARequest`` of the adapter folder: a new id when its weights changed since vLLM
        loaded it (the old one removed), the least recently used removed past ``max_adapters``."""
        from vllm.lora.request import LoRARequest

        folder = str(Path(adapter).resolve())
        mtime = (Path(folder) / ADAPTER_FILE).stat().st_mtime_ns
        known = self._ids.get(folder)
        if known is not None and known[0] != mtime:
            self.llm.llm_engine.remove_lora(known[1])
            del self._ids[folder]
            known = None
        if known is None:
            self._next_id += 1
            known = self._ids[folder] = (mtime, self._next_id)
            while len(self._ids) > self.max_adapters:
                _, (_, evicted) = self._ids.popitem(last=False)
                self.llm.llm_engine.remove_lora(evicted)
        self._ids.move_to_end(folder)
        return LoRARequest(f"adapter-{known[1]}", known[1], folder)

    def close(self) -> None:
        if self.llm is not None:
            shutdown_llm(self.llm)
            self.llm = None
