"""Recipes, defaults inheritance, overrides, the core schema and plugin-owned sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from corerl.config import load_config
from corerl.config.recipes import load_recipe
from corerl.errors import ConfigError, ConfigErrors, UsageError
from corerl.plugin_manager import PluginHost
from tests.conftest import EXAMPLES


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost(env={})


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_chain_merges_in_order_and_the_file_wins(tmp_path):
    write(tmp_path / "a.yaml", "policy:\n  model_name: a\n  max_seq_length: 10\n  generation: {temperature: 0.5}\n")
    write(tmp_path / "b.yaml", "policy:\n  max_seq_length: 20\nalgorithm: {batch_size: 4}\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub / "top.yaml", "defaults: [../a.yaml, ../b.yaml]\npolicy:\n  generation: {max_new_tokens: 7}\n")
    data, origins = load_recipe(sub / "top.yaml")
    assert data == {
        "policy": {"model_name": "a", "max_seq_length": 20, "generation": {"temperature": 0.5, "max_new_tokens": 7}},
        "algorithm": {"batch_size": 4},
    }
    assert origins["policy.max_seq_length"].endswith("b.yaml")
    assert origins["policy.model_name"].endswith("a.yaml")
    assert origins["policy.generation.max_new_tokens"].endswith("top.yaml")


def test_example_recipes_inherit_base_and_validate(host):
    for recipe in ("grpo_dtensor.yaml", "grpo_megatron.yaml", "grpo_deepspeed.yaml", "demo.yaml", "grpo_dapo_demo.yaml"):
        config = load_config(EXAMPLES / recipe, [], host)
        assert config.core.policy.model_name
    dapo = load_config(EXAMPLES / "grpo_dapo_demo.yaml", [], host).core.algorithm
    assert dapo.dynamic_sampling.enabled and dapo.overlong_penalty.enabled
    assert (dapo.ratio_clip_min, dapo.ratio_clip_max, dapo.aggregation) == (0.2, 0.28, "token_mean")


def test_an_override_beats_the_recipe_files_value_and_says_where_it_came_from(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  max_seq_length: 10\nalgorithm: {max_steps: 20}\n")
    config = load_config(recipe, ["algorithm.max_steps=2", "policy.max_seq_length=64"], host)
    assert (config.core.algorithm.max_steps, config.core.policy.max_seq_length) == (2, 64)
    assert config.origins["algorithm.max_steps"] == "override 'algorithm.max_steps=2'"


def test_overrides_are_yaml_typed(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy: {model_name: m}\n")
    config = load_config(
        recipe,
        [
            "policy.optimizer.lr=1e-5",
            "policy.generation.temperature=0",
            "policy.generation.stop_strings=[a, b]",
            "policy.dtensor_cfg.enabled=True",
            "policy.precision=bfloat16",
            "policy.generation.top_k=null",
            "policy.optimizer.betas=[0.8, 0.95]",
        ],
        host,
    )
    core = config.core
    assert core.policy.optimizer.lr == 1e-5 and isinstance(core.policy.optimizer.lr, float)
    assert core.policy.generation.temperature == 0.0
    assert core.policy.generation.stop_strings == ["a", "b"]
    assert config.section_enabled("policy.dtensor_cfg")
    assert core.policy.precision == "bfloat16"
    assert core.policy.optimizer.betas == [0.8, 0.95]


def test_yaml_exponent_floats_in_files(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  optimizer: {lr: 3e-4, eps: 1E-6}\n")
    optimizer = load_config(recipe, [], host).core.policy.optimizer
    assert (optimizer.lr, optimizer.eps) == (3e-4, 1e-6)


def test_promised_keys_exist_with_defaults(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy: {model_name: m}\n")
    config = load_config(recipe, [], host)
    c = config.core
    promised = [
        c.cluster.gpus_per_node, c.cluster.num_nodes, c.policy.model_name, c.policy.max_seq_length,
        c.policy.precision, c.policy.train_micro_batch_size, c.algorithm.batch_size,
        c.algorithm.gradient_accumulation_steps, c.policy.generation.max_new_tokens,
        c.policy.generation.temperature, c.policy.generation.colocated.enabled,
        c.policy.generation.colocated.resources, c.policy.sequence_packing.enabled,
    ]
    assert None not in promised
    assert c.policy.training_backend is None and c.policy.generation.backend is None
    for section in ("policy.dtensor_cfg", "policy.megatron_cfg", "policy.deepspeed_cfg", "policy.generation.vllm_cfg"):
        assert config.section(section) is not None, section  # filled with the plugin schema's defaults
    assert config.section("policy.megatron_cfg").optimizer.optimizer == "adam"


def test_dtensor_config_is_an_alias_of_dtensor_cfg(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  dtensor_config: {enabled: true, tensor_parallel_size: 1}\n")
    config = load_config(recipe, ["policy.dtensor_config.activation_checkpointing=true"], host)
    section = config.section("policy.dtensor_cfg")
    assert section.enabled and section.activation_checkpointing


def test_both_alias_spellings_at_once_is_an_error(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  dtensor_config: {}\n  dtensor_cfg: {}\n")
    with pytest.raises(ConfigError, match="both policy.dtensor_cfg and its alias policy.dtensor_config"):
        load_config(recipe, [], host)


def test_all_errors_are_reported_together_with_key_paths_and_sources(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  max_seq_lenght: 5\ncluster: {num_nodes: 0}\n")
    with pytest.raises(ConfigErrors) as caught:
        load_config(recipe, ["algorithm.batch_size=-1"], host)
    by_key = {e.key: e for e in caught.value.errors}
    assert set(by_key) == {"policy.max_seq_lenght", "cluster.num_nodes", "algorithm.batch_size"}
    assert "did you mean policy.max_seq_length?" in by_key["policy.max_seq_lenght"].one_line()
    assert by_key["cluster.num_nodes"].source == str(recipe)
    assert by_key["algorithm.batch_size"].source == "override 'algorithm.batch_size=-1'"


def test_sections_of_first_party_plugins_that_are_not_installed_are_kept_as_mappings(tmp_path):
    host = PluginHost(env={"CORERL_LOAD_PLUGINS": ""})
    recipe = write(tmp_path / "r.yaml", "policy:\n  model_name: m\n  megatron_cfg: {enabled: false, anything: 1}\n")
    config = load_config(recipe, [], host)
    assert config.section("policy.megatron_cfg") == {"enabled": False, "anything": 1}


def test_override_into_a_scalar_is_refused(tmp_path, host):
    recipe = write(tmp_path / "r.yaml", "policy: {model_name: m}\n")
    with pytest.raises(ConfigError, match="policy.model_name holds a str, not a section"):
        load_config(recipe, ["policy.model_name.revision=3"], host)


@pytest.mark.parametrize("text", ["novalue", "=3", "a..b=1", ".a=1", "a.=1", "a b=1"])
def test_malformed_overrides_are_usage_errors(tmp_path, host, text):
    recipe = write(tmp_path / "r.yaml", "policy: {model_name: m}\n")
    with pytest.raises(UsageError, match="malformed override"):
        load_config(recipe, [text], host)
