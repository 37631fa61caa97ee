"""The ``hf`` generation backend: transformers ``generate()`` on the Hugging Face model.

No extra engine: the reference for correctness tests and the fallback where vLLM is not
installed. torch and transformers are imported when the backend is built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from corerl.generation.contract import Sample, SamplingSettings
from corerl.generation.sampling import cut_at_stop_ids, cut_at_stop_strings

log = logging.getLogger(__name__)


class HFGenerationBackend:
    """Batched ``generate()`` with left padding; logprobs from a separate fp32-softmax forward."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.model: Any = None

    def load_hf(self, model_path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        self.device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype[self.config.core.policy.precision]
        ).to(self.device)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)

    def _stop_ids(self, sampling: SamplingSettings) -> list[int]:
        if sampling.stop_token_ids:
            return list(sampling.stop_token_ids)
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        return list(eos) if isinstance(eos, (list, tuple)) else [eos]

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        import torch

        stop_ids = self._stop_ids(sampling)
        pad = stop_ids[0]  # after a stop, generate() pads with it: the first stop id ends the completion
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention[row, width - len(prompt):] = 1
        kwargs: dict[str, Any] = {"do_sample": sampling.temperature > 0}
        if sampling.temperature > 0:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                max_new_tokens=sampling.max_new_tokens, min_new_tokens=0, num_return_sequences=n,
                eos_token_id=stop_ids, pad_token_id=pad, use_cache=True, **kwargs,
            )
        completions: list[tuple[list[int], list[int], str]] = []
        for row in range(out.shape[0]):
            prompt = prompts[row // n]
            ids = out[row, width:].tolist()
            ids, reason = cut_at_stop_ids(ids, stop_ids)
            ids, reason = cut_at_stop_strings(ids, sampling.stop_strings, self.tokenizer, reason)
            completions.append((prompt, ids, reason))
        logprobs = self._logprobs([(p, c) for p, c, _ in completions])
        samples = [
            Sample(prompt_ids=tuple(p), completion_ids=tuple(c), logprobs=tuple(lp), finish_reason=r)
            for (p, c, r), lp in zip(completions, logprobs, strict=True)
        ]
        return [samples[i * n:(i + 1) * n] for i in range(len(prompts))]

    def _logprobs(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        import torch

        from corerl.training.batching import right_pad
        from corerl.training.logprobs import model_logprobs

        ids, mask = right_pad([p + c for p, c in pairs])
        with torch.no_grad():
            lp = model_logprobs(self.model, {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)})
        lp = lp.cpu()
        return [lp[row, len(p): len(p) + len(c)].tolist() for row, (p, c) in enumerate(pairs)]

    def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        state = {name: tensor for name, tensor in weights}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        missing = [m for m in missing if m not in tied]
        if missing or unexpected:
            raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def sleep(self) -> None:
        if self.device.type == "cpu":
            log.info("hf generation: sleep() is a no-op on CPU")
            return
        self.model.to("cpu")

    def wake(self) -> None:
        if self.device.type != "cpu":
            self.model.to(self.device)

    def shutdown(self) -> None:
        self.model = None

