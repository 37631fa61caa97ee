"""The ``example_sampler`` generation backend: a decoding loop on its own copy of the policy.

The engine lives where its factory is called: in the driver process, beside the run loop (an
engine that wants other processes or GPUs starts them itself, as the vllm plugin starts a Ray
actor). It keeps its own copy of the weights: ``load_hf`` loads the checkpoint once, and every
later change, the SFT warm start's weights included, arrives through ``update_weights``.

What a backend must get right (corerl's generation conformance suite checks each):

- samples follow ``SamplingSettings`` alone: temperature, then top-k, then top-p, drawn by
  ``corerl.sdk.choose_tokens`` (``choose_tokens_per_row`` with request seeds). Nothing is read
  from the checkpoint's ``generation_config.json`` but its end-of-sequence ids: its sampling
  defaults (``do_sample``, ``top_k``, ``repetition_penalty``, ...) would make the samples follow
  another distribution than the logprobs describe;
- logprobs are of the model's untempered distribution (one log-softmax of the raw logits);
- ``stop_token_ids`` end a completion besides the model's end of sequence; ``ignore_eos`` ends
  none early; a stop token is kept as the completion's last token;
- an update may leave out a tied weight (``lm_head.weight`` of a model that ties it to the
  embeddings): the tie keeps it current.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from corerl.sdk import (
    Config,
    Sample,
    SamplingSettings,
    choose_tokens,
    choose_tokens_per_row,
    cut_at_stop_strings,
    load_tokenizer_folder,
    row_generators,
    row_seeds,
)

log = logging.getLogger(__name__)


class ExampleSampler:
    """Batched decoding with a KV cache: the prompts left-padded, one forward a new token."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.model: Any = None

    def load_hf(self, model_path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[self.config.core.policy.precision]
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device).eval()
        tokenizer = load_tokenizer_folder(self.config.core.policy.tokenizer_path(model_path))
        self.tokenizer = tokenizer
        # the only thing read from generation_config.json: the model's end of sequence
        eos = self.model.generation_config.eos_token_id
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        import torch

        rows = [list(prompt) for prompt in prompts for _ in range(n)]
        seeds = row_seeds(sampling, n)  # request seeds: sample j of prompt i from request_seeds[i] + j
        if seeds is not None:
            generators = row_generators(seeds, self.device)
        else:  # one stream for the whole call: repeated prompts still draw independent samples
            generator = torch.Generator(device=self.device)
            if sampling.seed is not None:
                generator.manual_seed(sampling.seed)
            else:
                generator.seed()
        stop_ids = set() if sampling.ignore_eos else {*sampling.stop_token_ids, *self.eos_ids}

        width = max(len(row) for row in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padding: every row's next token is at the last column
            input_ids[i, width - len(row):] = torch.tensor(row)
            attention[i, width - len(row):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        chosen: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        done = [False] * len(rows)
        with torch.no_grad():
            out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
            for step in range(sampling.max_new_tokens):
                logits = out.logits[:, -1].float()
                if seeds is not None:
                    tokens, picked = choose_tokens_per_row(logits, sampling, generators)
                else:
                    tokens, picked = choose_tokens(logits, sampling, generator)
                for i, (token, logprob) in enumerate(zip(tokens.tolist(), picked.tolist(), strict=True)):
                    if not done[i]:
                        chosen[i].append(token)
                        logprobs[i].append(logprob)
                        done[i] = token in stop_ids
                if all(done) or step == sampling.max_new_tokens - 1:
                    break
                attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=1)
                positions = positions[:, -1:] + 1
                out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=attention, position_ids=positions,
                                 past_key_values=out.past_key_values, use_cache=True)

        samples = []
        for i, row in enumerate(rows):
            ids, reason = cut_at_stop_strings(chosen[i], sampling.stop_strings, self.tokenizer,
                                              "stop" if done[i] else "length")
            samples.append(Sample(prompt_ids=tuple(row), completion_ids=tuple(ids),
                                  logprobs=tuple(logprobs[i][: len(ids)]), finish_reason=reason))
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """New weights in place under their Hugging Face names (a training backend's stream; after an
        SFT warm start, its weights). A name left out is refused unless it is tied to one given."""
        state = {name: tensor for name, tensor in weights}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        shared: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            shared.setdefault(id(param), []).append(name)
        tied = {name for names in shared.values() if any(n in state for n in names) for name in names}
        missing = [name for name in missing if name not in tied]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def sleep(self) -> None:
        if self.device.type == "cpu":
            log.info("example_sampler: sleep() is a no-op on CPU")
            return
        self.model.to("cpu")

    def wake(self) -> None:
        if self.device.type != "cpu":
            self.model.to(self.device)

    def shutdown(self) -> None:
        self.model = None
