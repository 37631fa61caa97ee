"""The generation-backend conformance suite: subclass :class:`GenerationBackendConformance`.

    class TestMyEngine(GenerationBackendConformance):
        backend_id = "mine"

The checks, on a tiny model built in code (fp32):

- greedy completions equal plain transformers ``generate()`` token for token;
- returned logprobs equal a transformers forward of the same tokens within ``tolerance`` (1e-4);
- after ``update_weights`` with another model's weights, greedy outputs follow the new weights;
- ``n`` samples per prompt come back grouped per prompt and in prompt order, stop at
  ``max_new_tokens`` or a stop token, and say why they ended;
- with ``request_seeds`` (contract 2.12), a prompt's samples are the same alone and beside others;
- with ``policy.lora`` (a registration with ``lora=True``): after ``load_adapter``, logprobs equal
  a plain PEFT forward of the base with that adapter, and a second adapter replaces the first; a
  registration without it is refused with ``policy.lora.enabled``, in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
import torch

from corerl.generation.contract import SamplingSettings
from corerl.testing.contract_versions import REQUEST_SEEDS, ContractCheck, stated_contract

PROMPTS = [[2, 5, 9, 13], [2, 7], [2, 11, 4, 6, 8, 10, 12], [2, 3, 3]]


def reference_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int, stop_id: int) -> list[list[int]]:
    """Greedy completions by plain transformers, one prompt at a time (no padding involved)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    for prompt in prompts:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=stop_id, pad_token_id=stop_id)[0, len(prompt):].tolist()
        if stop_id in ids:
            ids = ids[: ids.index(stop_id) + 1]
        out.append(ids)
    return out


def reference_logprobs(model_dir: str, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion[t] | prompt + completion[:t]) by a plain transformers forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) + t - 1, token]) for t, token in enumerate(completion)]


class GenerationBackendConformance:
    """Base class of a generation backend's conformance tests; set ``backend_id``."""

    backend_id: ClassVar[str]
    overrides: ClassVar[list[str]] = []
    plugin: ClassVar[Any] = None
    tolerance: ClassVar[float] = 1e-4
    max_new_tokens: ClassVar[int] = 12

    @pytest.fixture(scope="class")
    @classmethod
    def model_dirs(cls, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
        """Two tiny models with the same shapes and different weights (peaked logits, so greedy is robust)."""
        from corerl.models.tiny import build_tiny_model

        return tuple(
            str(build_tiny_model(tmp_path_factory.mktemp(f"gen-model-{seed}"), seed=seed, initializer_range=0.3,
                                 hidden_size=128, num_heads=4, num_kv_heads=2))  # head_dim 32: vLLM's CPU kernels
            for seed in (0, 1)
        )

    @pytest.fixture(scope="class")
    @classmethod
    def engine(cls, model_dirs: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
        from corerl.testing import host_with, select_for, write_recipe

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        recipe = write_recipe(Path(tmp_path_factory.mktemp("gen-recipe")) / "r.yaml", {
            "policy": {"model_name": model_dirs[0], "precision": "float32", "max_seq_length": 64,
                       "generation": {"backend": cls.backend_id}},
        })
        config, selection = select_for(host, recipe, cls.overrides)
        choice = selection.generation_backend
        assert choice.id == cls.backend_id, choice.reason
        engine = choice.registration.create(config=config)
        try:
            yield engine
        finally:
            engine.shutdown()

    @pytest.fixture(autouse=True)
    def _fresh_weights(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        """Every test starts from model A (reloaded through the weight path, as the algorithms do)."""
        if getattr(engine, "_conformance_loaded", None) is None:
            engine.load_hf(model_dirs[0])
            engine._conformance_loaded = True
        else:
            engine.update_weights(_weights_of(model_dirs[0]))

    def test_greedy_matches_transformers(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(3,))
        got = [group[0].completion_ids for group in engine.generate(PROMPTS, sampling, n=1)]
        want = reference_greedy(model_dirs[0], PROMPTS, self.max_new_tokens, stop_id=3)
        assert [list(g) for g in got] == want

    def test_logprobs_match_a_transformers_forward(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=self.max_new_tokens, seed=7)
        for group in engine.generate(PROMPTS[:2], sampling, n=2):
            for sample in group:
                assert len(sample.logprobs) == len(sample.completion_ids) > 0
                want = reference_logprobs(model_dirs[0], list(sample.prompt_ids), list(sample.completion_ids))
                worst = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
                assert worst <= self.tolerance, f"logprobs differ by {worst:.3g}"

    def test_ignore_eos_runs_every_completion_to_max_new_tokens(self, engine: Any) -> None:
        """``SamplingSettings.ignore_eos`` (contract 2.6): no token ends a completion, not even the
        stop ids, which otherwise end nearly every one here (they are half the vocabulary)."""
        stops = tuple(range(64))
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=self.max_new_tokens, seed=11, stop_token_ids=stops)
        stopped = [s for g in engine.generate(PROMPTS, sampling, n=2) for s in g]
        assert any(s.finish_reason == "stop" for s in stopped)  # the stop ids do act without ignore_eos
        ignoring = attrs.evolve(sampling, ignore_eos=True)
        samples = [s for g in engine.generate(PROMPTS, ignoring, n=2) for s in g]
        assert all(len(s.completion_ids) == self.max_new_tokens and s.finish_reason == "length" for s in samples)

    def test_outputs_follow_refitted_weights(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        sampling = SamplingSettings(temperature=0.0, max_new_tokens=self.max_new_tokens, stop_token_ids=(3,))
        before = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        engine.update_weights(_weights_of(model_dirs[1]))
        after = [list(g[0].completion_ids) for g in engine.generate(PROMPTS, sampling)]
        assert after != before
        assert after == reference_greedy(model_dirs[1], PROMPTS, self.max_new_tokens, stop_id=3)

    def test_n_samples_come_back_grouped_in_prompt_order(self, engine: Any, model_dirs: tuple[str, str]) -> None:
        from transformers import AutoConfig

        eos = AutoConfig.from_pretrained(model_dirs[0]).eos_token_id
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=5, seed=3)
        groups = engine.generate(PROMPTS, sampling, n=3)
        assert len(groups) == len(PROMPTS)
        for prompt, group in zip(PROMPTS, groups, strict=True):
            assert len(group) == 3
            for sample in group:
                ids = list(sample.completion_ids)
                assert list(sample.prompt_ids) == prompt
                assert 0 < len(ids) <= 5 and eos not in ids[:-1]
                # a sample ends at its end-of-sequence token, which may be drawn at any step (the
                # fifth too), or else at max_new_tokens
                if ids[-1] == eos:
                    assert sample.finish_reason == "stop"
                else:
                    assert (len(ids), sample.finish_reason) == (5, "length")

    def test_the_same_prompt_twice_draws_independent_samples(self, engine: Any) -> None:
        # one seed per call must not mean one random stream per prompt: GRPO batches repeat prompts
        # and needs every sample drawn independently (the model here has high-entropy outputs)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=11)
        first, second = engine.generate([PROMPTS[0], PROMPTS[0]], sampling, n=4)
        assert [s.completion_ids for s in first] != [s.completion_ids for s in second]
        assert len({s.completion_ids for s in first}) > 1
        again = engine.generate([PROMPTS[0], PROMPTS[0]], sampling, n=4)
        assert [s.completion_ids for s in again[0]] == [s.completion_ids for s in first]


    def test_a_prompt_with_a_request_seed_samples_the_same_whatever_shares_its_call(self, engine: Any) -> None:
        # the multi-turn rollout batches episodes as their environment steps return; with request seeds a
        # prompt's samples depend on its seed alone, not on the prompts beside it (contract 2.12)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=6, seed=11)
        alone = engine.generate([PROMPTS[2]], attrs.evolve(sampling, request_seeds=(7,)), n=2)[0]
        beside = engine.generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]],
                                 attrs.evolve(sampling, request_seeds=(5, 7, 9)), n=2)[1]
        if [s.completion_ids for s in alone] != [s.completion_ids for s in beside]:
            self._contract().missing("draws a prompt's samples from the whole call's stream, not from its request "
                                     "seed", REQUEST_SEEDS)
        assert alone[0].completion_ids != alone[1].completion_ids or len(alone[0].completion_ids) <= 1
        for one, other in zip(alone, beside, strict=True):
            assert one.logprobs == pytest.approx(other.logprobs, abs=self.tolerance)

    @classmethod
    def _contract(cls) -> ContractCheck:
        """The backend held to the contract version its plugin states (:mod:`corerl.testing.contract_versions`)."""
        from corerl.testing import host_with

        host = host_with(cls.plugin, f"{cls.backend_id}-under-test")
        registration = host.generation_backends.get(cls.backend_id)
        assert registration is not None, f"no generation backend {cls.backend_id!r} is registered"
        return ContractCheck(f"generation backend {cls.backend_id!r} (plugin {registration.plugin!r})",
                             stated_contract(host, registration))

    def test_samples_follow_each_lora_adapter_loaded(self, model_dirs: tuple[str, str], tmp_path: Path) -> None:
        from corerl.errors import CorerlError
        from corerl.testing import host_with, select_for, write_recipe

        host = host_with(self.plugin, f"{self.backend_id}-under-test")
        recipe = write_recipe(tmp_path / "lora.yaml", {
            "policy": {"model_name": model_dirs[0], "precision": "float32", "max_seq_length": 64,
                       "generation": {"backend": self.backend_id}, "lora": {"enabled": True, "dim": 8, "alpha": 16}},
        })
        if not host.generation_backends.get(self.backend_id).lora:
            with pytest.raises(CorerlError, match=r"^policy\.[\w.]+: [^\n]*LoRA[^\n]*$"):
                select_for(host, recipe, self.overrides)
            return
        config, selection = select_for(host, recipe, self.overrides)
        engine = selection.generation_backend.registration.create(config=config)
        sampling = SamplingSettings(temperature=1.0, max_new_tokens=self.max_new_tokens, seed=5)
        try:
            engine.load_hf(model_dirs[0])
            seen = []
            for seed in (0, 1):
                model, adapter = _random_adapter(model_dirs[0], config.core.policy.lora, seed)
                engine.load_adapter(adapter)
                groups = engine.generate(PROMPTS, sampling)
                seen.append([g[0].completion_ids for g in groups])
                for group in groups:
                    sample = group[0]
                    ids = torch.tensor([list(sample.prompt_ids) + list(sample.completion_ids)])
                    with torch.no_grad():
                        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
                    start = len(sample.prompt_ids)
                    want = [float(logp[start + t - 1, token]) for t, token in enumerate(sample.completion_ids)]
                    worst = max(abs(a - b) for a, b in zip(sample.logprobs, want, strict=True))
                    assert worst <= self.tolerance, f"adapter {seed}: logprobs differ from PEFT's by {worst:.3g}"
            assert seen[0] != seen[1]  # the second adapter replaced the first
        finally:
            engine.shutdown()


def _random_adapter(model_dir: str, settings: Any, seed: int) -> tuple[Any, Any]:
    """A PEFT model of ``model_dir`` with an adapter of random A and B (so it changes the outputs),
    and that adapter as a LoRA refit carries it."""
    from peft import get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from corerl.lora.adapter import apply_lora, config_dict
    from corerl.lora.weights import AdapterWeights

    torch.manual_seed(seed)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), settings, model_dir)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 0.3)
    model.eval()
    tensors = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
    return model, AdapterWeights(None, config_dict(settings, model_dir), model_dir, lambda: tensors)


def _weights_of(model_dir: str) -> list[tuple[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return list(model.state_dict().items())
