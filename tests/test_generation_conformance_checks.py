"""The generation conformance suite's own checks shown to fail where they should: a backend whose
samples leak the checkpoint's generation_config.json defaults fails the distribution check, one
whose stop ids replace the end of sequence fails the stop-id check, and the suite's ``plugin``
attribute registers a backend beside the installed plugins (the recipe's training backend among
them), or says in one line what else the recipe needs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from corerl.generation.contract import Sample, SamplingSettings
from corerl.registry import GenerationBackend
from corerl.testing import plugin_from, write_recipe
from corerl.testing.generation_conformance import (
    CHECKPOINT_SAMPLING_DEFAULTS,
    GenerationBackendConformance,
    check_first_tokens_follow,
    frequency_outliers,
    write_sampling_defaults,
)

Failed = pytest.fail.Exception


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The suite's first model: its generation_config.json says sample with top-k 5, top-p 0.7,
    temperature 0.5 and a repetition penalty of 1.5."""
    from corerl.models.tiny import build_tiny_model

    folder = str(build_tiny_model(tmp_path_factory.mktemp("leaky"), seed=0, initializer_range=0.3, hidden_size=128,
                                  num_heads=4, num_kv_heads=2))
    write_sampling_defaults(folder)
    return folder


class TransformersSampler:
    """A backend of one's own on ``model.generate()``, passing ``passed`` of the sampling settings
    and leaving transformers to fill the rest from the checkpoint's generation_config.json."""

    def __init__(self, model_dir: str, passed: tuple[str, ...]) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.passed = passed

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings, n: int = 1) -> list[list[Sample]]:
        settings = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
                    "top_k": sampling.top_k or 0, "repetition_penalty": 1.0}
        torch.manual_seed(sampling.seed if sampling.request_seeds is None else sampling.request_seeds[0])
        out = []
        for prompt in prompts:
            result = self.model.generate(torch.tensor([prompt]), max_new_tokens=sampling.max_new_tokens,
                                         num_return_sequences=n, pad_token_id=0, return_dict_in_generate=True,
                                         output_logits=True, **{k: v for k, v in settings.items() if k in self.passed})
            logprobs = torch.log_softmax(result.logits[0].float(), dim=-1)
            out.append([Sample(prompt_ids=tuple(prompt), completion_ids=(int(row[-1]),),
                               logprobs=(float(logprobs[i, row[-1]]),), finish_reason="length")
                        for i, row in enumerate(result.sequences.tolist())])
        return out


EVERY_SETTING = ("do_sample", "temperature", "top_p", "top_k", "repetition_penalty")


@pytest.mark.parametrize("passed", [
    ("do_sample", "temperature", "top_p"),  # top-k 5 and the repetition penalty leak in (the backend)
    ("do_sample", "temperature", "top_p", "top_k"),  # the repetition penalty alone leaks in
    ("do_sample", "top_p", "top_k", "repetition_penalty"),  # the checkpoint's temperature leaks in
], ids=["top_k-and-penalty", "penalty", "temperature"])
def test_the_distribution_check_fails_a_backend_leaking_generation_config_defaults(model_dir, passed):
    with pytest.raises(Failed, match="do not follow the model's distribution"):
        check_first_tokens_follow(TransformersSampler(model_dir, passed), model_dir, temperature=0.8,
                                  samples=800, seed=21)


def test_the_distribution_check_passes_the_same_backend_passing_every_setting(model_dir):
    check_first_tokens_follow(TransformersSampler(model_dir, EVERY_SETTING), model_dir, temperature=0.8,
                              samples=800, seed=21)


def test_the_frequency_test_keeps_its_false_failure_rate_and_sees_a_small_shift():
    # 300 sets of 400 exact draws from a spread distribution: none may fail (the bound is 1e-6 a set)
    generator = torch.Generator().manual_seed(0)
    expected = torch.softmax(torch.randn(128, generator=generator, dtype=torch.float64) * 2, dim=-1)
    for _ in range(300):
        counts = torch.bincount(torch.multinomial(expected, 400, replacement=True, generator=generator), minlength=128)
        assert not frequency_outliers(counts, expected)
    # the most likely token a quarter less likely: seen in 4000 draws
    shifted = expected.clone()
    best = int(expected.argmax())
    shifted[best] *= 0.75
    shifted /= shifted.sum()
    counts = torch.bincount(torch.multinomial(shifted, 4000, replacement=True, generator=generator), minlength=128)
    assert any(line.startswith(f"token {best}:") for line in frequency_outliers(counts, expected))


def test_the_checkpoint_defaults_do_change_what_transformers_samples(model_dir):
    # the suite's model is a fair trap: its generation_config.json is read by from_pretrained
    from transformers import AutoModelForCausalLM

    config = AutoModelForCausalLM.from_pretrained(model_dir).generation_config
    assert {k: getattr(config, k) for k in CHECKPOINT_SAMPLING_DEFAULTS} == CHECKPOINT_SAMPLING_DEFAULTS
    assert config.eos_token_id == 3


class _HFUnderTheSuite(GenerationBackendConformance):
    backend_id = "hf"


def _hf_engine(model_dir: str, tmp_path: Any) -> Any:
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "precision": "float32",
                                                           "max_seq_length": 64, "generation": {"backend": "hf"}}})
    _, engine = _HFUnderTheSuite._create(_HFUnderTheSuite._host(), recipe)
    engine.load_hf(model_dir)
    return engine


def test_the_stop_id_check_fails_a_backend_whose_stop_ids_replace_the_end_of_sequence(model_dir, tmp_path):
    engine = _hf_engine(model_dir, tmp_path)
    suite = _HFUnderTheSuite()
    suite.test_stop_ids_end_a_completion_besides_the_end_of_sequence(engine, (model_dir, model_dir))  # as it is: passes
    engine._stop_ids = lambda sampling: list(sampling.stop_token_ids)  # the stop ids instead of the end of sequence
    with pytest.raises(Failed, match=r"does not end completions at the model's end of sequence \(3\).*contract 2\.14"):
        suite.test_stop_ids_end_a_completion_besides_the_end_of_sequence(engine, (model_dir, model_dir))


# -- the suite's plugin attribute ------------------------------------------------------------------

COPIED_HF = plugin_from(generation_backends=[GenerationBackend(
    id="copied_hf", factory="corerl.generation.hf:HFGenerationBackend", description="the hf backend, under test")])


class _PluginObjectUnderTheSuite(GenerationBackendConformance):
    backend_id = "copied_hf"
    plugin = COPIED_HF


def test_the_plugin_attribute_registers_the_backend_beside_the_installed_plugins(model_dir, tmp_path):
    # as the training suite's example sets it: the recipe's training backend (dtensor) comes from
    # the installed plugins, the backend under test from the plugin object
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "precision": "float32",
                                                           "generation": {"backend": "copied_hf"}}})
    host = _PluginObjectUnderTheSuite._host()
    assert host.generation_backends.get("copied_hf").plugin == "copied_hf-under-test"
    config, engine = _PluginObjectUnderTheSuite._create(host, recipe)
    assert type(engine).__name__ == "HFGenerationBackend"
    assert _PluginObjectUnderTheSuite._contract().describe().startswith("generation backend 'copied_hf'")


def test_what_else_the_suites_recipe_needs_is_said_in_one_line(model_dir, tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": model_dir, "training_backend": "nowhere",
                                                           "generation": {"backend": "copied_hf"}}})
    with pytest.raises(Failed) as failed:
        _PluginObjectUnderTheSuite._create(_PluginObjectUnderTheSuite._host(), recipe)
    line = str(failed.value)
    assert "\n" not in line and "needs more than the backend under test" in line and "'nowhere'" in line


def test_the_tied_weight_check_fails_a_backend_whose_head_goes_stale(model_dir, tmp_path):
    from corerl.models.tiny import build_tiny_model

    other = str(build_tiny_model(tmp_path / "b", seed=1, initializer_range=0.3, hidden_size=128, num_heads=4,
                                 num_kv_heads=2))
    engine = _hf_engine(model_dir, tmp_path)
    suite = _HFUnderTheSuite()
    suite.test_an_update_may_leave_out_the_tied_copy(engine, (model_dir, other))  # as it is: passes
    engine.load_hf(model_dir)
    # an engine that keeps the output head as a copy of its own (as one that re-packs weights may)
    engine.own_model.lm_head.weight = torch.nn.Parameter(engine.own_model.lm_head.weight.detach().clone())
    with pytest.raises(Failed, match=r"stale output head .*contract 2\.14"):
        suite.test_an_update_may_leave_out_the_tied_copy(engine, (model_dir, other))
