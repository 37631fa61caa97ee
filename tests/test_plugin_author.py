"""What an outside plugin author meets (issue 23): `corerl plugins` shows priorities and sections,
a closed pipe is not a bug, and a backend that cannot be imported leaves no run directory."""

from __future__ import annotations

import subprocess

from tests.conftest import CORERL, REPO, clean_env, run_corerl
from tests.refusals import refused_in_one_line
from tests.test_plugin_loading import add_plugin, plugin_source


def test_plugins_shows_each_component_s_priority_and_section(fake_site):
    add_plugin(fake_site, "rocket", plugin_source("rocket", priority=400))
    env = fake_site.env(clean_env(shared_ray=False))
    rows = {row["name"]: row for row in run_corerl("plugins", "--json", env=env).json()}
    assert {"kind": "training_backends", "id": "rocket", "priority": 400,
            "config_section": "policy.rocket_cfg"} in rows["rocket"]["components"]
    dtensor = next(c for c in rows["dtensor"]["components"] if c["kind"] == "training_backends")
    assert (dtensor["priority"], dtensor["config_section"]) == (100, "policy.dtensor_cfg")
    table = run_corerl("plugins", env=env).out
    assert "rocket (priority 400, policy.rocket_cfg)" in table and "dtensor (priority 100, policy.dtensor_cfg)" in table


def test_a_closed_pipe_ends_the_listing_quietly():
    proc = subprocess.run(f"'{CORERL}' plugins --json | head -n 1", shell=True, capture_output=True, text=True,
                          env=clean_env(), cwd=REPO, timeout=120)
    assert proc.stdout.strip() == "[" and proc.stderr == "", proc.stderr


def test_a_backend_that_cannot_be_imported_fails_the_run_before_its_directory_is_made(fake_site, tmp_path):
    source = plugin_source("ghost").replace('factory="os:getcwd"', 'factory="corerl_ghost_engine_missing:Backend"')
    add_plugin(fake_site, "ghost", source)
    result = run_corerl("run", "policy.training_backend=ghost", f"run.output_dir={tmp_path}", "run.name=never",
                        env=fake_site.env(clean_env(shared_ray=False)))
    assert result.code != 0 and "corerl_ghost_engine_missing" in result.err, result
    (line,) = result.err.strip().splitlines()
    assert "internal error" not in line
    assert not (tmp_path / "never").exists()


def test_the_section_of_a_plugin_that_failed_or_is_disabled_names_the_plugin(fake_site):
    add_plugin(fake_site, "rocket", "import corerl_rocket_engine_not_installed\n" + plugin_source("rocket", priority=400))
    env = fake_site.env(clean_env(shared_ray=False))
    enabled = run_corerl("validate", "core/src/corerl/recipes/demo.yaml", "policy.rocket_cfg.enabled=true", env=env)
    line = refused_in_one_line(enabled, "policy.rocket_cfg.enabled", "plugin 'rocket'",
                               "corerl_rocket_engine_not_installed", key="policy.rocket_cfg.enabled")
    assert "unknown key" not in line
    off = run_corerl("validate", "core/src/corerl/recipes/demo.yaml", "policy.rocket_cfg.enabled=false", env=env)
    assert off.code == 0, off  # the section of a plugin that is not used is accepted

    add_plugin(fake_site, "comet", plugin_source("comet"))
    disabled = {**env, "CORERL_DISABLE_PLUGINS": "comet"}
    assert run_corerl("validate", "core/src/corerl/recipes/demo.yaml", "policy.comet_cfg.enabled=false",
                      env=disabled).code == 0
    named = run_corerl("validate", "core/src/corerl/recipes/demo.yaml", "policy.comet_cfg.enabled=true", env=disabled)
    refused_in_one_line(named, "plugin 'comet' is disabled", "CORERL_DISABLE_PLUGINS", key="policy.comet_cfg.enabled")
