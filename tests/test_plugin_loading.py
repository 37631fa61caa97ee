"""Discovery through real entry points, safe loading and the CORERL_* variables."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap

from corerl.plugin_manager import PluginHost
from tests.conftest import REPO, clean_env, run_corerl
from tests.refusals import refused_in_one_line

FIRST_PARTY = {"dtensor", "megatron", "deepspeed", "vllm", "sglang"}


def plugin_source(backend_id: str, priority: int = 400, section: str | None = None) -> str:
    section = section or f"policy.{backend_id}_cfg"
    return textwrap.dedent(
        f"""
        import attrs
        from corerl import TrainingBackend, hookimpl
        from corerl.config.fields import setting

        @attrs.define(kw_only=True)
        class Settings:
            enabled: bool = setting(False)

        @hookimpl
        def corerl_register_training_backends(register):
            register(TrainingBackend(id={backend_id!r}, priority={priority}, factory="os:getcwd",
                                     config_section={section!r}, config_schema=Settings))
        """
    )


def add_plugin(site, name: str, source: str, dist: str | None = None) -> None:
    module = f"{name}_plugin"
    site.add_distribution(
        dist or f"corerl-{name}",
        "2.0.1",
        entry_points={"corerl.plugins": {name: f"{module}"}},
        files={f"{module}.py": source},
    )


def test_entry_point_plugins_are_discovered_with_distribution_and_version(fake_site):
    add_plugin(fake_site, "turbo", plugin_source("turbo"))
    host = PluginHost(env={})
    info = host.plugins["turbo"]
    assert (info.distribution, info.version, info.status, info.error) == ("corerl-turbo", "2.0.1", "loaded", None)
    assert host.training_backends.get("turbo").plugin == "turbo"
    assert FIRST_PARTY <= set(host.plugins)


def test_a_plugin_whose_import_raises_is_recorded_and_the_rest_still_load(fake_site):
    add_plugin(fake_site, "broken", "raise RuntimeError('the GPU driver exploded')\n")
    host = PluginHost(env={})
    broken = host.plugins["broken"]
    assert broken.status == "failed"
    assert broken.error == "RuntimeError: the GPU driver exploded"
    assert {"dtensor", "megatron", "deepspeed"} <= set(host.training_backends.ids())


def test_a_plugin_with_a_misspelled_hook_is_recorded_as_failed(fake_site):
    source = "from corerl import hookimpl\n\n@hookimpl\ndef corerl_register_training_backend(register):\n    pass\n"
    add_plugin(fake_site, "typo", source)
    host = PluginHost(env={})
    assert host.plugins["typo"].status == "failed"
    assert "corerl_register_training_backend" in host.plugins["typo"].error


def test_a_plugin_whose_hook_raises_is_recorded_as_failed(fake_site):
    source = "from corerl import hookimpl\n\n@hookimpl\ndef corerl_register_training_backends(register):\n    raise KeyError('oops')\n"
    add_plugin(fake_site, "raiser", source)
    host = PluginHost(env={})
    assert host.plugins["raiser"].status == "failed"
    assert "corerl_register_training_backends raised KeyError" in host.plugins["raiser"].error
    assert "dtensor" in host.training_backends


def test_two_plugins_registering_one_id_clash_and_both_are_named(fake_site):
    add_plugin(fake_site, "first", plugin_source("samename"))
    add_plugin(fake_site, "second", plugin_source("samename"))
    host = PluginHost(env={})
    registry = host.training_backends
    assert registry.conflicts == {"samename": ["first", "second"]}
    assert "'first'" in host.plugins["second"].error and "'second'" in host.plugins["second"].error


def test_disabled_plugins_are_never_imported(fake_site, tmp_path):
    marker = tmp_path / "imported"
    add_plugin(fake_site, "noisy", f"open({str(marker)!r}, 'w').close()\n")
    host = PluginHost(env={"CORERL_DISABLE_PLUGINS": "noisy, megatron"})
    assert host.plugins["noisy"].status == "disabled"
    assert host.plugins["megatron"].status == "disabled"
    assert "megatron" not in host.training_backends
    assert not marker.exists()
    assert "noisy_plugin" not in sys.modules
    PluginHost(env={})
    assert marker.exists()  # the same plugin, not blocked, is imported


def test_disabling_a_plugin_by_distribution_name(fake_site):
    add_plugin(fake_site, "turbo", plugin_source("turbo"))
    host = PluginHost(env={"CORERL_DISABLE_PLUGINS": "corerl-turbo"})
    assert host.plugins["turbo"].status == "disabled"


def test_load_plugins_loads_only_those_and_empty_means_only_the_core():
    only = PluginHost(env={"CORERL_LOAD_PLUGINS": "dtensor"})
    assert only.training_backends.ids() == ["dtensor"]
    assert {p.name for p in only.plugins.values() if p.status == "loaded"} == {"corerl", "dtensor"}
    none = PluginHost(env={"CORERL_LOAD_PLUGINS": ""})
    assert none.training_backends.ids() == []
    assert none.generation_backends.ids() == ["hf", "remote"]  # the core's own: hf and external servers' client
    assert all(p.status == "disabled" for name, p in none.plugins.items() if name != "corerl")


def test_trace_prints_each_hook_call_with_its_implementations():
    stream = io.StringIO()
    host = PluginHost(env={"CORERL_LOAD_PLUGINS": "megatron"}, trace_stream=stream)
    host.registries()
    trace = stream.getvalue()
    assert "import plugin 'megatron' from corerl_megatron.plugin" in trace
    assert "plugin 'dtensor' disabled" in trace
    assert "call corerl_register_training_backends(register) -> megatron" in trace
    assert "call corerl_register_generation_backends(register) -> corerl" in trace


def test_trace_env_var_writes_to_stderr():
    code = "from corerl.plugin_manager import PluginHost; PluginHost().registries()"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env=clean_env({"CORERL_TRACE_PLUGINS": "1"}), timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "corerl trace: call corerl_register_training_backends(register) -> " in proc.stderr


HEAVY = ("torch", "vllm", "megatron", "deepspeed", "transformers")


def test_loading_every_plugin_imports_no_heavy_engine():
    # torch is installed in this environment, so its absence from sys.modules means something.
    code = textwrap.dedent(
        f"""
        import importlib.util, json, sys
        assert importlib.util.find_spec("torch") is not None, "torch must be installed for this test to mean anything"
        from corerl.plugin_manager import PluginHost
        from corerl.config import load_config
        from corerl.config.selection import select
        host = PluginHost()
        rows = host.describe()
        config = load_config({str(__import__('tests.conftest').conftest.EXAMPLES / 'grpo_megatron.yaml')!r}, [], host)
        select(config, host)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"heavy": heavy, "loaded": sorted(r["name"] for r in rows if r["status"] == "loaded")}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json

    result = json.loads(proc.stdout)
    assert result["heavy"] == []
    assert FIRST_PARTY <= set(result["loaded"])


def test_core_imports_no_plugin_package():
    core = REPO / "core" / "src" / "corerl"
    plugin_import = re.compile(r"^\s*(from|import)\s+corerl_(dtensor|megatron|deepspeed|vllm)\b", re.MULTILINE)
    found = [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for path in sorted(core.rglob("*.py"))
             for m in plugin_import.finditer(path.read_text())]
    assert found == []


def test_a_first_party_command_of_a_missing_plugin_says_how_to_install_it():
    result = run_corerl("convert", "hf-to-megatron", "somewhere", env=clean_env({"CORERL_DISABLE_PLUGINS": "megatron"}))
    refused_in_one_line(result, "corerl convert is a command of the megatron plugin, which is not loaded here",
                        "pip install ./plugins/megatron", "corerl plugins")
