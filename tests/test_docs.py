"""The hook reference, the README and CI stay in step with the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from corerl import hookspecs
from tests.conftest import REPO, clean_env

HOOKS = sorted(
    name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if getattr(fn, "corerl_spec", None) is not None
)


def test_there_are_hook_specs():
    assert HOOKS == [
        "corerl_register_algorithms",
        "corerl_register_commands",
        "corerl_register_dialect_sections",
        "corerl_register_environments",
        "corerl_register_generation_backends",
        "corerl_register_loggers",
        "corerl_register_memory_models",
        "corerl_register_offload_policies",
        "corerl_register_presets",
        "corerl_register_rewards",
        "corerl_register_sandboxes",
        "corerl_register_sequence_packers",
        "corerl_register_tasks",
        "corerl_register_tool_parsers",
        "corerl_register_tools",
        "corerl_register_training_backends",
    ]


def test_every_hook_spec_has_a_docstring_and_a_section_in_the_reference():
    reference = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^### (\w+)$", reference, flags=re.MULTILINE))
    for name in HOOKS:
        assert (getattr(hookspecs, name).__doc__ or "").strip(), f"{name} has no docstring"
        assert name in headings, f"docs/plugins.md has no '### {name}' section"
    assert headings <= set(HOOKS) | {"Hook reference"}, "docs/plugins.md documents a hook that does not exist"


def test_every_hook_spec_is_collected_into_a_registry():
    """A hook spec that no row of the component-kinds table names would be specified and never
    called: what plugins registered through it would vanish."""
    from corerl.component_kinds import KINDS
    from corerl.plugin_manager import PluginHost

    assert sorted(kind.hook for kind in KINDS) == HOOKS
    host = PluginHost(discover=False, env={})
    assert set(host.registries()) == {kind.registry for kind in KINDS}


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", readme, flags=re.DOTALL)
    assert block and readme.index("```bash") < readme.index("\n## "), "README must open with its commands"
    return [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    demo, test = _readme_commands()
    assert demo == "bash scripts/demo.sh" and test == "bash scripts/test.sh"
    ci = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith("set ") and not line.startswith("cd ")]
    assert ci == [f"exec {test}"]


def test_the_nemo_rl_migration_guide_ends_with_the_dialect_table_as_the_code_has_it():
    from corerl.config.dialects.nemo_rl import RULES, markdown_table

    guide = (REPO / "docs" / "migrating-from-nemo-rl.md").read_text()
    missing = [key for key in RULES if f"| `{key}` |" not in guide]
    assert missing == [], f"keys of corerl.config.dialects.nemo_rl.RULES missing from the guide: {missing}"
    assert guide.endswith(markdown_table()), (
        "the guide's table differs from RULES: regenerate it with corerl.config.dialects.nemo_rl.markdown_table()")


def test_the_skyrl_migration_guide_ends_with_the_dialect_table_as_the_code_has_it():
    from corerl.config.dialects.skyrl.keys import RULES, SFT_RULES
    from corerl.config.dialects.skyrl.lookup import markdown_table

    guide = (REPO / "docs" / "migrating-from-skyrl.md").read_text()
    missing = [key for key in RULES if f"| `{key}` |" not in guide] + [
        key for key in SFT_RULES if f"| `{key}` (SFT) |" not in guide]
    assert missing == [], f"keys of the SkyRL dialect's table missing from the guide: {missing}"
    assert guide.endswith(markdown_table(_installed())), (
        "the guide's table differs from the rules: run .venv/bin/python scripts/generate_docs.py")


def test_every_public_plugin_api_name_is_documented_and_imports_no_engine():
    import subprocess
    import sys

    import corerl.sdk

    reference = (REPO / "docs" / "plugins.md").read_text()
    undocumented = [name for name in corerl.sdk.__all__ if f"`{name}`" not in reference]
    assert not undocumented, f"docs/plugins.md does not name {undocumented}"
    assert all(hasattr(corerl.sdk, name) for name in corerl.sdk.__all__)
    probe = "import sys, corerl.sdk; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


def test_the_environment_guide_example_is_the_package_a_test_installs_and_trains():
    guide = (REPO / "docs" / "plugins.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n# corerl_guess/plugin.py\n(.*?)```", guide, flags=re.DOTALL)
    assert block is not None, "docs/plugins.md lost the environment example"
    assert block.group(1) == (REPO / "tests" / "data" / "guess" / "corerl_guess.py").read_text(encoding="utf-8")


def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate_docs", REPO / "scripts" / "generate_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed() -> Any:
    from corerl.plugin_manager import PluginHost

    return PluginHost(env={})  # every installed plugin, whatever CORERL_* says


def test_the_generated_pages_are_current():
    """The configuration reference, the support matrix and the benchmarks page are what
    scripts/generate_docs.py makes of the schemas, the support checks and bench/results now."""
    for path, text in _generator().pages(_installed()).items():
        assert path.exists() and path.read_text() == text, (
            f"{path.relative_to(REPO)} is stale: run .venv/bin/python scripts/generate_docs.py")


def test_every_configuration_key_has_a_type_a_default_and_a_meaning():
    keys = _generator().configuration_keys(_installed())
    assert len(keys) > 200 and len({k.path for k in keys}) == len(keys)
    assert [k.path for k in keys if not k.meaning] == []
    by_path = {k.path: k for k in keys}
    assert by_path["logger.wandb.mode"].owner == "core" and "'offline'" in by_path["logger.wandb.mode"].allowed
    assert by_path["policy.megatron_cfg.tensor_model_parallel_size"].owner == "plugin `megatron`"
    assert by_path["policy.model_name"].default == "required"


def test_the_documentation_site_builds_with_strict(tmp_path):
    """MkDocs with --strict: a broken link or anchor, a page missing from the navigation or an API
    reference that cannot be rendered fails."""
    import subprocess
    import sys

    mkdocs = Path(sys.executable).with_name("mkdocs")
    built = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                           capture_output=True, text=True, env={**clean_env(), "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert built.returncode == 0, built.stderr
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "from_pretrained" in api and "ExperimentLogger" in api
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


def test_the_readme_is_short_and_links_into_the_site():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 120
    for page in ("docs/getting-started.md", "docs/reference/configuration.md", "docs/plugins.md"):
        assert f"({page})" in readme, page
