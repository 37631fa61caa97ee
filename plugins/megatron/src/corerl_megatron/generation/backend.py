"""The ``megatron`` generation backend: sampling with the Megatron training model itself.

In a run the runner hands it the megatron training engine (:meth:`MegatronGeneration.
use_training_engine`): generation then runs on the training ranks' own model, so there is no
second copy of the weights and a refit from that engine costs nothing. Without one (the
training backend is another, or the engine is used alone, as the conformance suite does) it
starts a megatron engine of its own from ``policy.megatron_cfg`` and takes refits as Hugging
Face weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from corerl.sdk import (
    Config,
    Dispatch,
    Sample,
    SamplingSettings,
    cut_at_stop_strings,
    load_tokenizer_folder,
    row_seeds,
)

log = logging.getLogger(__name__)


class MegatronGeneration:
    """Batched decoding with megatron-core's KV cache on the megatron ranks (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.settings = config.section("policy.generation.mcore_generation_config")
        self.engine: Any = None
        self.owns_engine = False

    def use_training_engine(self, training: Any) -> bool:
        """Sample with ``training``'s model when it is a megatron engine; True when it is."""
        from corerl_megatron.training.backend import MegatronBackend

        if isinstance(training, MegatronBackend):
            self.engine, self.owns_engine = training, False
            return True
        return False

    def load_hf(self, model_path: str) -> None:
        if self.engine is None or self.owns_engine:
            from corerl_megatron.training.backend import MegatronBackend

            if self.engine is None:
                log.info("megatron generation: no megatron training engine to share; starting one of its own")
                self.engine, self.owns_engine = MegatronBackend(self.config), True
            self.engine.load_hf(model_path)
        elif model_path != self.engine.model_path:
            raise ValueError(f"megatron generation shares the training model (loaded from {self.engine.model_path}) "
                             f"and cannot load another one ({model_path})")
        self.tokenizer = load_tokenizer_folder(self.config.core.policy.tokenizer_path(model_path))
        self.default_stop_ids = _eos_ids(model_path, self.tokenizer)

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        rows = [list(prompt) for prompt in prompts for _ in range(n)]
        # the stop ids end a completion besides the model's end of sequence
        stop_ids = [] if sampling.ignore_eos else list(dict.fromkeys([*sampling.stop_token_ids,
                                                                       *self.default_stop_ids]))
        engine = self.engine
        # contiguous slices, one per data-parallel group, every rank of a group gets its group's slice
        dp = engine.rank_layout.data_parallel_size
        cuts = [len(rows) * d // dp for d in range(dp + 1)]
        slices: list[Any] = [rows[cuts[d]:cuts[d + 1]] for d in range(dp)]
        if (seeds := row_seeds(sampling, n)) is not None:  # each row's own stream travels with it
            slices = [(part, seeds[cuts[d]:cuts[d + 1]]) for d, part in enumerate(slices)]
        answers = engine.call(Dispatch.SPLIT_BY_DP, "generate", sampling, stop_ids, parts=slices)
        decoded = [item for answer in answers for item in answer]
        samples = []
        for row, (ids, logprobs, reason) in zip(rows, decoded, strict=True):
            kept, reason = cut_at_stop_strings(ids, sampling.stop_strings, self.tokenizer, reason)
            samples.append(Sample(prompt_ids=tuple(row), completion_ids=tuple(kept),
                                  logprobs=tuple(logprobs[: len(kept)]), finish_reason=reason))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        if getattr(weights, "engine", None) is self.engine:
            return  # the training engine's own weights: generation already runs on them
        from corerl_megatron.conversion.convert import hf_to_megatron

        hf_state = {name: tensor.detach().cpu() for name, tensor in weights}
        full = hf_to_megatron(hf_state, self.engine.family, self.engine.shape)
        self.engine.call(Dispatch.ALL, "load_weights", full)

    def sleep(self) -> None:
        log.info("megatron generation: sleep() keeps the model (it is the training model); "
                 "the KV cache lives only while a generate() call runs")

    def wake(self) -> None:
        pass

    def shutdown(self) -> None:
        if self.owns_engine and self.engine is not None:
            self.engine.shutdown()
        self.engine = None


def _eos_ids(model_path: str, tokenizer: Any) -> list[int]:
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    eos = eos if eos is not None else tokenizer.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]
