"""The algorithm, environment and generation templates (templates/algorithm, templates/environment,
templates/generation): their packages found by real entry-point discovery, and their own tests,
conformance suites included, run here in this process (tests/test_template.py installs the
templates with pip and runs their tests from a copy outside the repository, in the slow tier)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib

import pytest

from corerl.plugin_manager import PluginHost
from corerl.sdk import CONTRACT_VERSION
from tests.conftest import REPO

TEMPLATES = REPO / "templates"
#: template folder -> (its test file, the kind it registers, the id)
PACKAGES = {"algorithm": ("test_example_algorithm.py", "algorithms", "example_reinforce"),
            "environment": ("test_example_environment.py", "environments", "digit_guess"),
            "generation": ("test_example_generation.py", "generation_backends", "example_sampler")}


def _template_tests(template: str):
    """The template's test module, its package importable as installed (as the root pyproject's
    pythonpath makes templates/plugin's)."""
    source = str(TEMPLATES / template / "src")
    if source not in sys.path:
        sys.path.insert(0, source)
    test_file = TEMPLATES / template / "tests" / PACKAGES[template][0]
    spec = importlib.util.spec_from_file_location(f"template_{template}_tests", test_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# the templates' own tests, collected here as pytest collects them in the template's folder
for _template in PACKAGES:
    globals().update({name: value for name, value in vars(_template_tests(_template)).items()
                      if name.startswith(("test_", "Test"))})


@pytest.mark.parametrize("template", sorted(PACKAGES))
def test_the_template_package_is_discovered_by_its_entry_point_and_states_the_contract(fake_site, template):
    project = tomllib.loads((TEMPLATES / template / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["corerl.plugins"]
    (plugin_name, target), = points.items()
    source = TEMPLATES / template / "src"
    files = {str(path.relative_to(source)): path.read_text() for path in source.rglob("*.py")}
    fake_site.add_distribution(project["name"], project["version"], entry_points={"corerl.plugins": points},
                               files=files)
    package = target.split(".")[0]
    # imported from the template's folder above (the template's own tests, collected here, hold its
    # classes): set aside, so the package imports from the fake install, and put back after
    folder_modules = {m: sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == package}
    try:
        host = PluginHost(env={})
        info = host.plugins[plugin_name]
        assert (info.status, info.error, info.notice, info.contract) == ("loaded", None, None, CONTRACT_VERSION)
        _, kind, component = PACKAGES[template]
        registration = getattr(host, kind).get(component)
        assert registration is not None and registration.plugin == plugin_name
        assert registration.load().__module__.startswith(target.split(".")[0])
        assert sys.modules[target].__file__.startswith(str(fake_site.path))  # the installed copy, not the folder
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]
        sys.modules.update(folder_modules)
