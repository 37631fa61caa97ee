"""The ``hf`` generation backend: transformers ``generate()`` on the Hugging Face model.

No extra engine: the reference for correctness tests and the fallback where vLLM is not
installed. torch and transformers are imported when the backend is built.

Logprobs come from each decoding step's raw next-token logits (untempered, one log-softmax),
read by a forward hook as the model returns them (:func:`_step_logprobs`): no second forward runs,
and no step's logits are kept past the next step (``generate()``'s ``output_logits`` would keep
``rows x steps x vocabulary`` floats until it returns). The checkpoint's ``generation_config.json`` is set aside
while sampling (:func:`without_checkpoint_defaults`): only ``SamplingSettings`` shape the draw. ``policy.generation.hf_kv_cache`` picks the KV cache
(static on a GPU by default: its fixed shapes let transformers compile the decoding step with CUDA
graphs). Beside a training engine that keeps its unsharded model in this process (dtensor at
world size 1), the backend samples with that very model
(:meth:`HFGenerationBackend.use_training_engine`): no second copy of the weights, and a refit from
that engine copies nothing. One exception: a float32 training model under bf16/fp16 autocast
with the static cache decodes through a 16-bit copy of its weights (:mod:`corerl.generation.decode_copy`),
refreshed in place before every call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import attrs

from corerl.generation.bad_words import banned_sequences
from corerl.generation.contract import Sample, SamplingSettings, images_of
from corerl.generation.routes import recorded_routes, wants_routes
from corerl.generation.sampling import (
    choose_tokens_per_row,
    cut_at_stop_ids,
    cut_at_stop_strings,
    row_generators,
    row_seeds,
)
from corerl.training.image_rows import image_fields, image_inputs, image_token_id
from corerl.training.parking import HostStore

log = logging.getLogger(__name__)


class HFGenerationBackend:
    """Batched ``generate()`` with left padding; logprobs from the logits of each decoding step."""

    # called between decoding steps with the number of tokens generated so far; True ends the
    # call there (its completions are returned as they stand): asynchronous generation's hook
    # for weights that arrive while a request runs (corerl.asynchronous.worker)
    between_tokens: Any = None
    #: bans policy.generation.bad_words (contract 2.18: corerl.generation.bad_words)
    accepts_bad_words = True
    #: reads a prompt's images (contract 2.13: an ImagePrompt's pixel values go into generate())
    accepts_images = True
    #: fills Sample.routed_experts for router replay r3 (contract 2.18: corerl.generation.routes)
    reports_routed_experts = True

    def __init__(self, config: Any) -> None:
        self.config = config
        self.own_model: Any = None
        self.vision_tokens: list[int] = []  # a vision-language model's image tokens: never sampled
        self.shared_engine: Any = None  # the training engine whose model this backend samples with
        self.decode_copy: Any = None  # a 16-bit copy of the shared model to decode with (static cache)
        self.parked = HostStore()  # on a CPU, what sleep() freed until wake()

    @property
    def model(self) -> Any:
        """The model sampled with: the shared training engine's current one (it may rebuild it, as
        a reload after SFT does), else this backend's own."""
        return self.shared_engine.local_model() if self.shared_engine is not None else self.own_model

    def use_training_engine(self, training: Any) -> bool:
        """Sample with ``training``'s own model when it lives here unsharded (True), unless the
        offload policy moves its parameters away while generating (they would leave with it) or
        sequence packing gave it the packed-rows attention."""
        model = training.local_model() if hasattr(training, "local_model") else None
        if model is None:
            return False
        policy = self.config.core.policy
        if policy.offload.policy == "full":
            log.info("hf generation: the 'full' offload policy moves the training parameters away while "
                     "generating; keeping a copy of its own")
            return False
        if policy.sequence_packing.enabled:
            log.info("hf generation: the training model attends within packed rows (sequence packing), which "
                     "decoding with a KV cache does not use; keeping a copy of its own")
            return False
        self.shared_engine = training
        return True

    def load_hf(self, model_path: str) -> None:
        import torch
        from transformers.utils import logging as hf_logging

        from corerl.models.tokenizer import load_tokenizer_folder
        from corerl.models.vision import (
            auto_model_class,
            is_vision_language,
            read_hf_config,
            vision_token_ids,
        )

        hf_logging.disable_progress_bar()
        self.model_path = model_path
        precision = self.config.core.policy.precision
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[precision]
        if self.shared_engine is not None:  # the training model (float32 weights, autocast to the precision)
            self.device = next(self.model.parameters()).device
            self.autocast = dtype if dtype != torch.float32 else None
        else:
            self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            self.own_model = auto_model_class(model_path).from_pretrained(model_path, dtype=dtype).to(self.device)
            self.own_model.eval()
            self.autocast = None
        self.tokenizer = load_tokenizer_folder(self.config.core.policy.tokenizer_path(model_path))
        hf_config = read_hf_config(model_path)
        self.vision_tokens = vision_token_ids(hf_config)
        choice = self.config.core.policy.generation.hf_kv_cache
        self.static_cache = choice == "static" or (choice == "auto" and self.device.type == "cuda")
        if self.static_cache and is_vision_language(hf_config):
            # Qwen-VL's rotary positions depend on the prompt's images, kept beside a dynamic cache
            log.info("hf generation: a vision-language model decodes with the dynamic KV cache")
            self.static_cache = False
        self.decode_copy = None
        if self.static_cache and self.autocast is not None:
            # a static cache is allocated in the weights' dtype (float32 here) while autocast hands
            # it keys and values in the lower precision (generate() would fail): decode through a
            # copy of the weights in that precision instead, without autocast
            from corerl.generation.decode_copy import DecodeCopy

            self.decode_copy = DecodeCopy(self.autocast)
            log.info("hf generation: the shared training model runs under %s autocast; decoding with the static "
                     "KV cache through a %s copy of its weights, refreshed before every call", precision, precision)

    def _stop_ids(self, sampling: SamplingSettings) -> list[int]:
        """What ends a completion: ``sampling.stop_token_ids`` besides the model's end of sequence
        (the checkpoint's ``generation_config.json`` ids, else the tokenizer's), as every backend reads them."""
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        eos_ids = list(eos) if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]
        return list(dict.fromkeys([*sampling.stop_token_ids, *eos_ids]))

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        """Samples ``n`` completions of each prompt, in as many ``generate()`` calls as keep the
        logits they return within ``policy.max_logits_mb`` (one call under asynchronous
        generation's between-tokens hook, which ends a whole call)."""
        self._require_awake("sample")
        per_call = len(prompts) if self.between_tokens is not None else self._prompts_per_call(sampling, n)
        if sampling.seed is not None:  # once: the calls after the first go on from the same stream
            import torch

            torch.manual_seed(sampling.seed)
        out: list[list[Sample]] = []
        for first in range(0, len(prompts), per_call):
            part = sampling
            if sampling.request_seeds is not None:
                part = attrs.evolve(sampling, request_seeds=sampling.request_seeds[first:first + per_call])
            out.extend(self._generate(prompts[first:first + per_call], part, n))
        return out

    def _prompts_per_call(self, sampling: SamplingSettings, n: int) -> int:
        """How many prompts' rows one ``generate()`` call takes: a decoding step holds its rows'
        next-token logits and their float32 copy (:func:`_step_logprobs`), rows x vocabulary x 8 bytes."""
        vocab = int(getattr(self.model.config, "vocab_size", 0) or 0)
        budget = self.config.core.policy.max_logits_mb * 2**20
        per_prompt = n * vocab * 8
        return max(1, budget // per_prompt) if per_prompt else 1 << 30

    def _generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int) -> list[list[Sample]]:
        import torch

        stop_ids = self._stop_ids(sampling)
        # after a stop, generate() pads with it: the first stop id ends the completion
        pad = stop_ids[0] if stop_ids else int(self.tokenizer.pad_token_id or 0)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        kwargs: dict[str, Any] = {"do_sample": sampling.temperature > 0}
        seeds = row_seeds(sampling, n) if sampling.temperature > 0 else None
        images = [images_of(prompt) for prompt in prompts]
        returned = n
        if seeds is not None or any(images):  # rows repeated here (images stay with their rows)
            input_ids, attention = input_ids.repeat_interleave(n, dim=0), attention.repeat_interleave(n, dim=0)
            returned = 1
        if seeds is not None:  # each row from its own stream: chosen by our processor, kept by greedy search
            kwargs = {"do_sample": False, "logits_processor": _seeded_choice(sampling, seeds, self.device)}
        elif sampling.temperature > 0:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)
        if sampling.bad_words:  # transformers' ban runs before the seeded choice (its processors come first)
            kwargs["bad_words_ids"] = banned_sequences(self.tokenizer, sampling.bad_words)
        if self.static_cache:
            kwargs["cache_implementation"] = "static"
        if self.between_tokens is not None:
            kwargs["stopping_criteria"] = _hook_criteria(self.between_tokens, width)
        if any(images):
            rows = {"input_ids": input_ids, **image_fields([i for i in images for _ in range(n)])}
            kwargs.update({k: v.to(self.device) for k, v in image_inputs(rows, image_token_id(self.model)).items()})
        if self.vision_tokens:  # a completion never holds an image's own tokens (training counts them as images)
            kwargs["suppress_tokens"] = self.vision_tokens
        model = self.model if self.decode_copy is None else self.decode_copy.refreshed_from(self.model)
        autocast = self.autocast if self.decode_copy is None else None
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), torch.autocast(self.device.type, dtype=autocast, enabled=autocast is not None), \
                    without_checkpoint_defaults(model), _step_logprobs(model) as recorded, \
                    (recorded_routes(model) if wants_routes(self.config) else nullcontext()) as routes:
                out = model.generate(
                    input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                    max_new_tokens=sampling.max_new_tokens, num_return_sequences=returned,
                    min_new_tokens=sampling.max_new_tokens if sampling.ignore_eos else 0,
                    eos_token_id=stop_ids or None, pad_token_id=pad, use_cache=True, return_dict_in_generate=True,
                    **kwargs,
                )
        except RuntimeError as exc:
            if "probability tensor contains" not in str(exc):  # anything else is a real failure
                raise
            from corerl.errors import RunError

            raise RunError("the policy's next-token probabilities are not finite while sampling: its weights have "
                           "diverged", key="policy.optimizer.lr",
                           hint="lower the learning rate; the last checkpoint, if any, is intact") from exc
        finally:
            model.train(was_training)
        # the logprob of each chosen token under the model's untempered distribution: [rows, steps]
        chosen = out.sequences[:, width:]
        logprobs = recorded.logprobs(chosen)
        chosen = chosen.cpu()
        routed = routes.rows(chosen.shape[0]) if routes is not None else None  # [rows, tokens run, layers, k]
        samples = []
        for row in range(chosen.shape[0]):
            ids, reason = cut_at_stop_ids(chosen[row].tolist(), () if sampling.ignore_eos else stop_ids)
            ids, reason = cut_at_stop_strings(ids, sampling.stop_strings, self.tokenizer, reason)
            prompt = prompts[row // n]
            samples.append(Sample(prompt_ids=tuple(prompt), completion_ids=tuple(ids),
                                  logprobs=tuple(logprobs[row, : len(ids)].tolist()), finish_reason=reason,
                                  images=images[row // n],
                                  routed_experts=None if routed is None
                                  else routed[row, width - len(prompt): width + len(ids)].numpy()))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load ``weights`` into the model in place (between two decoding steps too: the KV cache
        of the tokens before stays as it was computed)."""
        if self.shared_engine is not None:
            if getattr(weights, "engine", None) is self.shared_engine:
                return  # the training engine's own weights: generation already runs on them
            raise ValueError("hf generation samples with the training model itself and takes no other weights")
        self._require_awake("take weights")
        state = {name: tensor for name, tensor in weights}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def load_adapter(self, adapter: Any) -> None:
        """A LoRA refit (:class:`corerl.lora.weights.AdapterWeights`): sampling with the training
        model itself, it already carries the adapter; otherwise this backend's own model is wrapped
        by PEFT with the adapter's config (once) and the adapter's tensors are copied in place."""
        if self.shared_engine is not None:
            if getattr(adapter, "engine", None) is self.shared_engine:
                return
            raise ValueError("hf generation samples with the training model itself and takes no other adapter")
        from peft import get_peft_model, set_peft_model_state_dict

        from corerl.lora.adapter import lora_config_of

        if adapter.base != self.model_path:  # a new base (the SFT warm start's merged model): start on it
            self.load_hf(adapter.base)
        if not hasattr(self.own_model, "disable_adapter"):
            self.own_model = get_peft_model(self.own_model, lora_config_of(adapter.config))
            self.own_model.eval()
        dtype = next(self.own_model.parameters()).dtype
        result = set_peft_model_state_dict(self.own_model, {k: v.to(dtype) for k, v in adapter.tensors().items()})
        if result.unexpected_keys:
            raise ValueError(f"the adapter does not fit the model: unexpected {result.unexpected_keys[:5]}")

    def sleep(self) -> None:
        """Free this backend's own model's memory until :meth:`wake`: moved to the CPU from a GPU;
        on a CPU the storages of its parameters are parked in host memory and freed in place
        (:mod:`corerl.training.parking`). Not to be sampled with before :meth:`wake`."""
        if self.shared_engine is not None:
            return  # the training engine's model: where it lives is the training side's business
        if self.device.type == "cpu":
            self.parked.park("parameters", self.own_model.parameters())
            return
        self.model.to("cpu")

    def wake(self) -> None:
        """Bring back what :meth:`sleep` freed."""
        if self.shared_engine is not None:
            return
        if self.device.type == "cpu":
            self.parked.unpark("parameters")
            return
        self.model.to(self.device)

    def _require_awake(self, what: str) -> None:
        """Refuse to compute from parked parameters (on a CPU, reading them would read freed memory)."""
        if "parameters" in self.parked:
            raise RuntimeError(f"hf generation cannot {what} while asleep: call wake() first")

    def shutdown(self) -> None:
        self.own_model = self.shared_engine = self.decode_copy = None



@contextmanager
def without_checkpoint_defaults(model: Any) -> Iterator[None]:
    """``model.generate()`` within sees transformers' own defaults, not the checkpoint's.

    transformers fills every setting a ``generate()`` call leaves unset from the model's
    ``generation_config`` (the checkpoint's ``generation_config.json``: ``do_sample``, ``temperature``,
    ``top_k``, ``top_p``, ``repetition_penalty``, ``no_repeat_ngram_size``, ...), and a ``generation_config``
    passed in is filled the same way. Any of them would make the samples follow another distribution
    than the one ``SamplingSettings`` states and the returned logprobs describe. The model's own
    config is set aside for the call (a PEFT model's base model's, which is the one ``generate()``
    reads) and put back after: an exported checkpoint keeps it."""
    from transformers import GenerationConfig

    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    kept = target.generation_config
    target.generation_config = GenerationConfig()
    try:
        yield
    finally:
        target.generation_config = kept


def _seeded_choice(sampling: SamplingSettings, seeds: list[int], device: Any) -> Any:
    """A logits processor that draws each row's next token from the row's own seeded generator
    (:func:`~corerl.generation.sampling.choose_tokens_per_row`) and leaves only that token
    possible, so that ``generate()``'s greedy search keeps it. transformers' own sampling draws
    every row from one stream, which ties a row's tokens to the rows beside it."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    generators = row_generators(seeds, device)

    class SeededChoice(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            tokens, _ = choose_tokens_per_row(scores, sampling, generators)
            only = torch.full_like(scores, float("-inf"))
            return only.scatter_(1, tokens.unsqueeze(1).to(scores.device), 0.0)

    return LogitsProcessorList([SeededChoice()])


class _StepLogprobs:
    """What :func:`_step_logprobs` records: each decoding step's chosen-token logprob, computed when
    the next step's forward shows which token was chosen (only one step's logits are held)."""

    def __init__(self) -> None:
        self.columns: list[Any] = []
        self.pending: Any = None  # the last step's float32 next-token logits [rows, vocab]

    def forward_hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if self.pending is not None and ids is not None:
            self._pick(ids[:, -1:])
        self.pending = output.logits[:, -1, :].float()

    def _pick(self, tokens: Any) -> None:
        import torch

        logits, self.pending = self.pending, None
        picked = logits.gather(-1, tokens.to(logits.device)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        self.columns.append(picked.cpu())

    def logprobs(self, chosen: Any) -> Any:
        """``[rows, steps]``: the recorded logprobs of ``chosen`` (the generated ids), the last step's now."""
        import torch

        if self.pending is not None and chosen.shape[1] > len(self.columns):
            self._pick(chosen[:, len(self.columns):len(self.columns) + 1])
        if len(self.columns) != chosen.shape[1]:
            raise RuntimeError(f"the hf backend recorded {len(self.columns)} decoding steps' logits for "
                               f"{chosen.shape[1]} generated tokens")
        return torch.stack(self.columns, dim=1) if self.columns else torch.zeros(chosen.shape)


@contextmanager
def _step_logprobs(model: Any) -> Iterator[_StepLogprobs]:
    """A forward hook for one ``generate()`` call on the model whose forward decodes (under a PEFT
    wrapper, its base model: PEFT's ``generate`` calls the base model's): see :class:`_StepLogprobs`."""
    recorded = _StepLogprobs()
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    handle = base.register_forward_hook(recorded.forward_hook, with_kwargs=True)
    try:
        yield recorded
    finally:
        handle.remove()


def _hook_criteria(hook: Any, width: int) -> Any:
    """A transformers stopping criterion that calls ``hook(tokens generated so far)`` after every
    decoding step and ends every row when it answers True."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class BetweenTokens(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            stop = bool(hook(int(input_ids.shape[1]) - width))
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([BetweenTokens()])
