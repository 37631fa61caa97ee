"""Outside plugins written to earlier plugin contracts keep working (issue 73): frozen copies under
tests/compat/contract_<version>/, one per plugin kind that has a template or a conformance suite,
each a package with its own tests, as its author wrote them. They are pip-installed beside the
project as a user would install them (one pip call) and their own tests run from their own
folders in one pytest process, outside the repository (no repository conftest or pythonpath).

A change to corerl that breaks one fails here. The only other outcome allowed is the plugin
being refused at load, in one line naming the contract version it states (a major version
corerl no longer offers): then its tests are not run, by design.

- contract_2_5/training_backend: templates/plugin at contract 2.5 (59a7a4e), word for word;
- contract_2_5/generation_backend: a plain transformers engine written to "The generation-backend
  contract" of docs/plugins.md at 2.5, tested by the generation conformance suite as its
  docstring said;
- contract_2_5/environment: docs/plugins.md's "Writing an environment" at 2.5 (corerl_guess);
- contract_2_5/algorithm: the REINFORCE algorithm docs/plugins.md named at 2.5.

The environment's and algorithm's tests register the installed dtensor plugin on ``corerl_host``
in their ``host`` fixture, as a plugin that trains with it had to until contract 2.10 (one with
``load_plugin``, one with ``register``).

:data:`KNOWN_BREAKS` lists the breaks found and not yet fixed, each naming its fix: those tests
must fail (a break fixed, or a new one, fails this test until the list says so)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from tests.conftest import REPO, clean_env, install_copies

COMPAT = REPO / "tests" / "compat"
#: each frozen plugin: its folder under tests/compat, the plugin (entry-point) name, its module
PLUGINS = {
    "contract_2_5/training_backend": ("example", "corerl_example"),
    "contract_2_5/generation_backend": ("plain", "corerl_plain_gen"),
    "contract_2_5/environment": ("guess", "corerl_guess"),
    "contract_2_5/algorithm": ("reinforce", "corerl_reinforce"),
}
#: folder -> {test name: why it fails and where the fix belongs}: breaks found by this suite
KNOWN_BREAKS: dict[str, dict[str, str]] = {}
REFUSAL = re.compile(r"^plugin '(?P<name>[\w-]+)' implements plugin contract (?P<stated>\d+\.\d+), and this corerl "
                     r"offers \d+\.\d+ [^\n]*$")
LOADED_BY = """
import json, sys
from corerl.plugin_manager import PluginHost
host = PluginHost(env={})
rows = {name: {"status": info.status, "error": info.error, "contract": info.contract,
               "file": getattr(sys.modules.get(module), "__file__", None)}
        for name, module in json.loads(sys.argv[1]).items() for info in [host.plugins.get(name)] if info}
print(json.dumps(rows))
"""


def test_plugins_written_to_earlier_contracts_pass_their_own_tests_or_are_refused_in_one_line(tmp_path):
    start = time.monotonic()
    folders = {folder.replace("/", "-"): COMPAT / folder for folder in PLUGINS}
    copies, target = install_copies(folders, tmp_path)
    env = clean_env({"PYTHONPATH": str(target)})
    installed = time.monotonic()

    # each loads from the install folder (not from the copies or the repository), or is refused
    modules = {name: module for name, module in PLUGINS.values()}
    loaded = subprocess.run([sys.executable, "-c", LOADED_BY, json.dumps(modules)], capture_output=True, text=True,
                            env=env, cwd=copies, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    rows = json.loads(loaded.stdout.splitlines()[-1])
    assert set(rows) == set(modules), rows
    to_run = []
    for folder, (name, _) in PLUGINS.items():
        row = rows[name]
        if row["status"] == "failed" and row["error"] and REFUSAL.match(row["error"]):
            # refused by design: one line naming the contract version the plugin states
            assert REFUSAL.match(row["error"])["stated"] == row["contract"], row
            continue
        assert (row["status"], row["error"]) == ("loaded", None), f"{folder}: {row}"
        assert row["file"] and row["file"].startswith(str(target)), f"{folder} is not the installed copy: {row}"
        to_run.append(folder.replace("/", "-"))

    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-v",
                           *(f"{folder}/tests" for folder in to_run)],
                          capture_output=True, text=True, env=env, cwd=copies, timeout=600)
    ran = time.monotonic()
    print(f"compat: install {installed - start:.1f} s, load check and tests {ran - installed:.1f} s, "
          f"{len(to_run)} of {len(PLUGINS)} plugins' tests run")
    assert proc.returncode in (0, 1), proc.stdout[-6000:] + proc.stderr[-2000:]  # 1: some tests failed
    outcomes: dict[str, dict[str, str]] = {}  # test file -> test -> PASSED / FAILED / SKIPPED / ERROR
    for line in proc.stdout.splitlines():
        found = re.match(r"^\S*?([\w.]+\.py)::(\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", line)
        if found:
            outcomes.setdefault(found[1], {})[found[2].split("::")[-1]] = found[3]
    for folder in to_run:  # every package's own tests ran, and passed (but for its known breaks)
        files = sorted(path.name for path in (copies / folder / "tests").glob("test_*.py"))
        results = {test: outcome for name in files for test, outcome in outcomes.get(name, {}).items()}
        broken = {test for test, outcome in results.items() if outcome not in ("PASSED", "SKIPPED")}
        known = KNOWN_BREAKS.get(folder.replace("-", "/"), {})
        assert files and "PASSED" in results.values(), (folder, files, results)
        assert not broken - set(known), (f"{folder}: {sorted(broken - set(known))} failed", proc.stdout[-6000:])
        assert not set(known) - broken, (f"{folder}: {sorted(set(known) - broken)} passes now: remove it from "
                                         "KNOWN_BREAKS in tests/test_compat_plugins.py")
