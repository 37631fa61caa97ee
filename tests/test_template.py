"""The third-party template installs with pip and plugs in through its entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import EXAMPLES, REPO, clean_env, run_corerl


def test_template_package_installs_and_is_listed_and_selected(tmp_path):
    # Build from a copy: setuptools writes *.egg-info into the source tree, which would make the
    # template look installed to every later test in this session.
    source = shutil.copytree(REPO / "templates" / "plugin", tmp_path / "template")
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    env = clean_env({"PYTHONPATH": str(target)})
    rows = {row["name"]: row for row in run_corerl("plugins", "--json", env=env).json()}
    example = rows["example"]
    assert (example["distribution"], example["version"], example["error"]) == ("corerl-example-backend", "0.1.0", None)
    assert example["training_backends"] == ["example"]

    selected = run_corerl("validate", str(EXAMPLES / "base.yaml"), "policy.example_cfg.enabled=true", "--json", env=env)
    assert selected.code == 0, selected
    assert selected.json()["training_backend"]["id"] == "example"

    rejected = run_corerl("validate", str(EXAMPLES / "base.yaml"), "policy.example_cfg.shards=3", env=env)
    assert rejected.code == 2
    assert "policy.example_cfg.shards: must divide the world size (2), got 3" in rejected.err
