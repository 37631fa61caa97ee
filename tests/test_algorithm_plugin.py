"""A third-party algorithm (REINFORCE with a running-mean baseline, tests/data/reinforce) installs
by entry point and trains with ``algorithm.name=reinforce``, without a line of core changing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corerl.config import config_from_mapping
from corerl.config.selection import select
from corerl.errors import ConfigError, ConfigErrors
from corerl.plugin_manager import PluginHost
from corerl.reporting.console import make_console
from corerl.run.loop import execute
from tests.conftest import EXAMPLES, clean_env, run_corerl

SOURCE = Path(__file__).parent / "data" / "reinforce" / "corerl_reinforce.py"


def _install(site) -> None:
    site.add_distribution("corerl-reinforce", "0.3.0", entry_points={"corerl.plugins": {"reinforce": "corerl_reinforce"}},
                          files={"corerl_reinforce.py": SOURCE.read_text()})


def _recipe(tmp_path: Path, **algorithm) -> dict:
    return {"cluster": {"gpus_per_node": 1},
            "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                       "max_seq_length": 64, "optimizer": {"lr": 1e-3}},
            "algorithm": {"name": "reinforce", "batch_size": 16, "num_generations_per_prompt": 1, "max_steps": 8,
                          **algorithm},
            "data": {"task": "digit_echo"},
            "run": {"output_dir": str(tmp_path), "name": "reinforce", "tensorboard": False},
            "checkpointing": {"enabled": True, "save_period": 4}}


def test_hook_corerl_register_algorithms(fake_site, tmp_path):
    """A third-party algorithm is discovered by entry point, validated by its own schema and check,
    and trains in-process through the run loop."""
    _install(fake_site)
    host = PluginHost(env={})
    registration = host.algorithms.get("reinforce")
    assert registration.plugin == "reinforce" and registration.config_section == "algorithm.reinforce"
    (row,) = [r for r in host.describe() if r["name"] == "reinforce"]
    assert row["algorithms"] == ["reinforce"] and row["distribution"] == "corerl-reinforce"

    with pytest.raises(ConfigErrors) as refused:  # its section is validated by its own schema
        config_from_mapping({**_recipe(tmp_path), "algorithm": {"reinforce": {"baseline_momentum": 2.0}}}, host)
    assert [e.key for e in refused.value.errors] == ["algorithm.reinforce.baseline_momentum"]
    wrong = config_from_mapping(_recipe(tmp_path, num_generations_per_prompt=2), host)
    with pytest.raises(ConfigError, match="REINFORCE samples one completion per prompt"):  # and its own check
        select(wrong, host)

    config = config_from_mapping({**_recipe(tmp_path), "algorithm": {**_recipe(tmp_path)["algorithm"],
                                                                     "reinforce": {"baseline_momentum": 0.5}}}, host)
    assert config.section("algorithm.reinforce").baseline_momentum == 0.5
    result = execute(config, select(config, host), host, make_console())
    summary = result.summary
    assert summary["algorithm"] == "reinforce" and summary["reinforce_steps"] == 8 and summary["grpo_steps"] == 0
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["reinforce"] * 8 and rows[-1]["baseline"] != 0.0
    assert (result.run_dir / "checkpoints" / "step_000008" / "reinforce.json").exists()  # the state it owns
    assert (result.run_dir / "final" / "config.json").exists() and (result.run_dir / "curves.png").exists()


def test_the_cli_lists_and_runs_a_third_party_algorithm(fake_site, tmp_path):
    _install(fake_site)
    env = fake_site.env(clean_env(shared_ray=False))
    listed = run_corerl("plugins", env=env)
    assert "algorithms: reinforce" in listed.out, listed
    result = run_corerl("run", "algorithm.name=reinforce", "algorithm.num_generations_per_prompt=1",
                        "algorithm.max_steps=3", "policy.generation.backend=hf", f"run.output_dir={tmp_path}",
                        "run.name=cli", env=env)
    assert result.code == 0, result
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["reinforce_steps"] == 3
    unknown = run_corerl("validate", str(EXAMPLES / "demo.yaml"), "algorithm.name=reinfroce", env=env)
    assert unknown.code == 2 and "algorithm.name" in unknown.err and "reinforce" in unknown.err, unknown
