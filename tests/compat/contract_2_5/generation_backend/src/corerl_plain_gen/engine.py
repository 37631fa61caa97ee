"""The engine: plain transformers forwards, one prompt and one sample at a time, no KV cache
(slow, and simple enough to be obviously right). Written to docs/plugins.md's "The
generation-backend contract" at plugin contract 2.5."""

from __future__ import annotations

import torch

from corerl.sdk import Sample, choose_tokens, cut_at_stop_strings


class PlainEngine:
    def __init__(self, config):
        self.config = config
        self.model = None
        self.tokenizer = None

    def load_hf(self, model_path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        except (OSError, ValueError):  # a model folder without a tokenizer: no stop strings
            self.tokenizer = None
        self.eos = self.model.generation_config.eos_token_id
        if self.eos is None:
            self.eos = self.model.config.eos_token_id

    def generate(self, prompts, sampling, n=1):
        generator = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        stops = list(sampling.stop_token_ids) if sampling.stop_token_ids else (
            [self.eos] if isinstance(self.eos, int) else list(self.eos or []))
        return [[self._one(list(prompt), sampling, stops, generator) for _ in range(n)] for prompt in prompts]

    @torch.no_grad()
    def _one(self, prompt, sampling, stops, generator):
        ids, logprobs, reason = list(prompt), [], "length"
        for _ in range(sampling.max_new_tokens):
            logits = self.model(input_ids=torch.tensor([ids])).logits[:, -1, :]
            token, logprob = choose_tokens(logits, sampling, generator)
            ids.append(int(token[0]))
            logprobs.append(float(logprob[0]))
            if ids[-1] in stops:
                reason = "stop"
                break
        completion = ids[len(prompt):]
        if sampling.stop_strings and self.tokenizer is not None and reason == "length":
            completion, reason = cut_at_stop_strings(completion, tuple(sampling.stop_strings), self.tokenizer, reason)
        return Sample(prompt_ids=tuple(prompt), completion_ids=tuple(completion),
                      logprobs=tuple(logprobs[:len(completion)]), finish_reason=reason)

    def update_weights(self, pairs):
        params = dict(self.model.named_parameters())
        buffers = dict(self.model.named_buffers())
        with torch.no_grad():
            for name, tensor in pairs:
                target = params.get(name, buffers.get(name))
                if target is not None:
                    target.copy_(tensor)

    def sleep(self):
        pass  # nothing to release: the engine runs on the CPU

    def wake(self):
        pass

    def shutdown(self):
        self.model = None
