"""What a generation backend does for the algorithms.

A generation backend's factory is called as ``factory(config=Config)`` and returns an object
with the methods of :class:`GenerationEngine`. Prompts and completions are token ids; the
tokenizer is the algorithm's business.

A backend that samples with the training model itself (megatron's) also has
``use_training_engine(training) -> bool``: the runner calls it with the training engine before
``load_hf``, and the backend answers whether it will share that engine's model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import attrs

# the image types are model facts, below the engines: re-exported here, where the contract names them
from corerl.models.images import ImagePrompt, Images, images_of, with_images  # noqa: F401

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length"]


@attrs.frozen(kw_only=True)
class SamplingSettings:
    """How to sample. ``temperature`` 0 means greedy. The samples follow these settings alone
    (temperature, then ``top_k``, then ``top_p``: :func:`corerl.generation.sampling.choose_tokens`),
    nothing of the checkpoint's ``generation_config.json`` but its end-of-sequence ids.

    ``stop_token_ids`` end a completion besides the model's end of sequence (contract 2.14: the
    checkpoint's ``eos_token_id``, else the tokenizer's), the stop token kept as its last; with
    ``ignore_eos`` neither ends it.

    ``request_seeds`` (contract 2.12): one seed per prompt of a call. Sample ``j`` of prompt ``i``
    then draws from its own stream, seeded ``request_seeds[i] + j`` (as vLLM seeds the samples of
    one request), so what a prompt gets depends on its seed, its tokens and the weights, not on
    the other prompts of the call: a caller may batch requests as they become ready (the
    multi-turn rollout does) and still reproduce a run. None: ``seed`` seeds the call as a whole."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # no token ends a completion: each runs to max_new_tokens (contract 2.6)
    request_seeds: tuple[int, ...] | None = None
    #: words a completion never holds (contract 2.18; a backend bans them where it sets
    #: ``accepts_bad_words = True``: :mod:`corerl.generation.bad_words`)
    bad_words: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Any, **changes: Any) -> SamplingSettings:
        """``policy.generation`` of a validated config (``algorithm.seed`` as the seed)."""
        gen = config.core.policy.generation
        values = dict(
            temperature=gen.temperature, top_p=gen.top_p, top_k=gen.top_k, max_new_tokens=gen.max_new_tokens,
            stop_strings=tuple(gen.stop_strings or ()), stop_token_ids=tuple(gen.stop_token_ids or ()),
            seed=config.core.algorithm.seed, ignore_eos=gen.ignore_eos, bad_words=tuple(gen.bad_words or ()),
        )
        values.update(changes)
        return cls(**values)

    def within(self, max_seq_length: int, prompts: Any) -> SamplingSettings:
        """These settings with ``max_new_tokens`` cut so that the longest of ``prompts`` and its
        completion fit in ``max_seq_length`` (completions end there, as NeMo RL's do)."""
        room = max_seq_length - max((len(p) for p in prompts), default=0)
        return attrs.evolve(self, max_new_tokens=max(1, min(self.max_new_tokens, room)))


@attrs.frozen(kw_only=True)
class Sample:
    """One completion: its prompt, the generated ids (a final stop token included), the
    logprob of each generated id under the model (untempered: before temperature, top-k and
    top-p, whatever it was sampled with), and why it ended.

    A multi-turn episode is one sample too: ``completion_ids`` holds everything after the prompt,
    the environment's tokens between the model's turns included, and ``completion_mask`` marks
    the model's own tokens (1) apart from the environment's (0, logprob 0, left out of the loss).
    None, as generation backends leave it: every completion token is the model's.

    ``versions``: the policy version (optimizer steps taken) of the weights that produced each
    completion token, stamped by asynchronous generation (:mod:`corerl.asynchronous`); None,
    as generation backends leave it, where the weights never changed under a request.

    ``images`` (contract 2.13): the images of the prompt and of a multi-turn episode's
    observations, in the order of their image tokens; the core sets them from the prompts
    (a backend may leave them None).

    ``routed_experts`` (contract 2.18): a mixture of experts' chosen experts while the engine ran
    the sample's tokens, an integer array ``[tokens, decoder layers, experts per token]`` from the
    first prompt token (a layer without a router holds no meaning, -1 or 0: the trainers read the MoE
    layers only; tokens the engine never ran, such as the last one, hold -1 or are cut off). A backend that sets ``reports_routed_experts = True`` fills it when
    ``policy.moe.router_replay`` is ``r3`` (:mod:`corerl.generation.routes`); training then routes
    the same tokens to the same experts."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    completion_mask: tuple[int, ...] | None = None
    versions: tuple[int, ...] | None = None
    images: Images | None = attrs.field(default=None, eq=False)
    routed_experts: Any = attrs.field(default=None, eq=False)


def check_reads_images(backend: Any, registration: Any, model_path: str) -> None:
    """Refuse, in one line, a generation backend that does not read images (no ``accepts_images =
    True``, contract 2.13) for a vision-language policy: it would sample from the text alone while
    training reads the images, and the run would optimise logprobs of samples it never drew."""
    from corerl.errors import ConfigError
    from corerl.models.hf_config import is_vision_language, read_hf_config

    if getattr(backend, "accepts_images", False) or not is_vision_language(read_hf_config(model_path)):
        return
    raise ConfigError(f"generation backend {registration.id!r} (plugin {registration.plugin!r}) does not read images, "
                      "and the policy is a vision-language model", key="policy.generation.backend",
                      hint="sample with policy.generation.backend=hf")


@runtime_checkable
class GenerationEngine(Protocol):
    """The methods every generation backend provides to the algorithms."""

    def load_hf(self, model_path: str) -> None:
        """Start (or restart) the engine on a Hugging Face checkpoint directory."""

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        """``n`` samples per prompt: one list per prompt, in prompt order, each with ``n`` samples.

        A backend that sets ``accepts_images = True`` (contract 2.13) reads the images of a
        prompt that is an :class:`ImagePrompt` and never samples the model's vision tokens; a
        vision-language policy is refused with any other backend (:func:`check_reads_images`).

        With ``sampling.seed`` set, the same call returns the same samples, and every sample of
        the call (a prompt repeated in ``prompts`` included) is drawn independently. With
        ``sampling.request_seeds`` (one per prompt), each prompt's samples come from its own
        seed whatever else the call holds."""

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place from ``(Hugging Face name, tensor)`` pairs (a training
        backend's ``weight_stream()``) without restarting the engine."""

    def sleep(self) -> None:
        """Release accelerator memory between phases where the engine can (logged where it cannot)."""

    def wake(self) -> None:
        """Take back what :meth:`sleep` released."""

    def shutdown(self) -> None:
        """Stop the engine and release its resources."""
