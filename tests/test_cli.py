"""The acceptance items of the core, run through the real ``corerl`` command."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import EXAMPLES, clean_env, run_corerl
from tests.refusals import refused_in_one_line
from tests.test_plugin_loading import add_plugin, plugin_source

FIRST_PARTY = {"dtensor": "corerl-dtensor", "megatron": "corerl-megatron", "deepspeed": "corerl-deepspeed", "vllm": "corerl-vllm",
               "sglang": "corerl-sglang"}
MEGATRON = str(EXAMPLES / "grpo_megatron.yaml")
DTENSOR = str(EXAMPLES / "grpo_dtensor.yaml")
# the example recipes name a model on a cluster: the recipe alone is checked here
RECIPE_ONLY = "--recipe-only"


def _imports_torch(*argv: str, env=None) -> bool:
    code = textwrap.dedent(
        f"""
        import sys
        from corerl.cli import main
        try:
            main({list(argv)!r})
        except SystemExit:
            pass
        print("TORCH" if "torch" in sys.modules else "NO-TORCH")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env or clean_env(), timeout=60)
    assert proc.stdout.strip().splitlines()[-1] in ("TORCH", "NO-TORCH"), proc
    return proc.stdout.strip().splitlines()[-1] == "TORCH"


def test_plugins_json_lists_first_party_plugins_with_versions_and_no_errors():
    result = run_corerl("plugins", "--json")
    assert result.code == 0, result
    rows = {row["name"]: row for row in result.json()}
    for name, dist in FIRST_PARTY.items():
        row = rows[name]
        assert (row["distribution"], row["version"], row["error"], row["status"]) == (dist, "0.1.0", None, "loaded")
    assert rows["megatron"]["training_backends"] == ["megatron"]
    assert rows["megatron"]["generation_backends"] == ["megatron"]
    assert rows["vllm"]["generation_backends"] == ["vllm"]
    assert set(rows["dtensor"]) >= {"name", "distribution", "version", "training_backends", "generation_backends",
                                    "sequence_packers", "offload_policies", "error"}


def test_plugins_help_and_validate_do_not_import_torch():
    assert not _imports_torch("plugins", "--json")
    assert not _imports_torch("plugins")
    assert not _imports_torch("--help")
    assert not _imports_torch("validate", MEGATRON, "--json")  # its inputs checked too (missing here)


def test_plugins_table_is_human_readable():
    result = run_corerl("plugins")
    assert result.code == 0, result
    for name in FIRST_PARTY:
        assert name in result.out


def test_validate_both_enabled_selects_megatron_and_names_dtensor():
    result = run_corerl("validate", RECIPE_ONLY, DTENSOR, "policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=true", "--json")
    assert result.code == 0, result
    report = result.json()
    assert report["valid"] is True and report["errors"] == []
    assert report["training_backend"]["id"] == "megatron"
    assert "dtensor" in report["training_backend"]["reason"]
    assert report["generation_backend"]["id"] == "vllm"
    assert set(report) >= {"sequence_packer", "offload_policy"}


def test_validate_neither_enabled_selects_dtensor():
    result = run_corerl("validate", RECIPE_ONLY, str(EXAMPLES / "base.yaml"), "--json")
    assert result.code == 0, result
    assert result.json()["training_backend"]["id"] == "dtensor"


def test_validate_explicit_deepspeed_beats_enabled_megatron():
    result = run_corerl("validate", RECIPE_ONLY, MEGATRON, "policy.training_backend=deepspeed", "--json")
    assert result.code == 0, result
    report = result.json()
    assert report["training_backend"]["id"] == "deepspeed"
    assert any("megatron" in w for w in report["warnings"])


def test_validate_human_output_shows_the_choice_and_the_warning():
    result = run_corerl("validate", RECIPE_ONLY, DTENSOR, "policy.megatron_cfg.enabled=true")
    assert result.code == 0, result
    assert "megatron" in result.out and "passed over" in result.out


def test_third_party_distribution_with_priority_400_is_listed_and_selected(fake_site):
    add_plugin(fake_site, "rocket", plugin_source("rocket", priority=400))
    env = fake_site.env(clean_env(shared_ray=False))
    rows = {row["name"]: row for row in run_corerl("plugins", "--json", env=env).json()}
    assert rows["rocket"]["distribution"] == "corerl-rocket" and rows["rocket"]["training_backends"] == ["rocket"]
    result = run_corerl("validate", RECIPE_ONLY, MEGATRON, "policy.rocket_cfg.enabled=true", "--json", env=env)
    assert result.code == 0, result
    assert result.json()["training_backend"]["id"] == "rocket"
    assert "megatron" in result.json()["training_backend"]["reason"]
    not_enabled = run_corerl("validate", RECIPE_ONLY, MEGATRON, "--json", env=env)
    assert not_enabled.json()["training_backend"]["id"] == "megatron"


def test_broken_plugin_is_shown_and_only_hurts_configs_that_need_it(fake_site):
    add_plugin(fake_site, "broken", "import corerl_engine_that_is_not_installed\n")
    env = fake_site.env(clean_env(shared_ray=False))
    listing = run_corerl("plugins", "--json", env=env)
    assert listing.code == 0, listing
    broken = {row["name"]: row for row in listing.json()}["broken"]
    assert broken["error"] == "ModuleNotFoundError: No module named 'corerl_engine_that_is_not_installed'"
    table = run_corerl("plugins", env=env)
    assert table.code == 0 and "failed" in table.out

    unaffected = run_corerl("validate", RECIPE_ONLY, DTENSOR, env=env)
    assert unaffected.code == 0, unaffected

    needs_it = run_corerl("validate", RECIPE_ONLY, DTENSOR, "policy.training_backend=broken", env=env)
    refused_in_one_line(needs_it, "plugin 'broken'", "No module named 'corerl_engine_that_is_not_installed'",
                        key="policy.training_backend")


def test_run_with_overrides_and_no_config_applies_them_to_the_demo():
    refused_in_one_line(run_corerl("run", "policy.training_backend=nope"), "training backend 'nope' is not available",
                        key="policy.training_backend")


def test_debug_shows_the_traceback():
    result = run_corerl("validate", "missing.yaml", env=clean_env({"CORERL_DEBUG": "1"}))
    assert result.code != 0 and "Traceback" in result.err


def test_version():
    result = run_corerl("--version")
    assert result.code == 0 and result.out.strip() == "corerl 0.1.0"
