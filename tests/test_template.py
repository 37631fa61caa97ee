"""The third-party template installs with pip and plugs in through its entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import EXAMPLES, REPO, clean_env, run_corerl


def _install_a_copy(tmp_path):
    """The template copied outside the repository and pip-installed into a folder of its own, as
    an outside author's package would be. Built from a copy: setuptools writes *.egg-info into
    the source tree, which would make the template look installed to every later test here."""
    source = shutil.copytree(REPO / "templates" / "plugin", tmp_path / "template")
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return source, target


def test_template_package_installs_and_is_listed_and_selected(tmp_path):
    _, target = _install_a_copy(tmp_path)
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


def test_an_outside_package_written_against_the_sdk_passes_the_conformance_suite(tmp_path):
    # The template imports corerl only through corerl.sdk (test_template_uses_the_sdk.py); here a
    # copy of it, installed outside the repository, runs its own tests (the conformance suite
    # among them) from its own folder, as its author would: no repository conftest, no
    # repository pythonpath.
    source, target = _install_a_copy(tmp_path)
    env = clean_env({"PYTHONPATH": str(target)})
    where = subprocess.run([sys.executable, "-c", "import corerl_example; print(corerl_example.__file__)"],
                           capture_output=True, text=True, env=env, cwd=source, timeout=120)
    assert where.stdout.strip().startswith(str(target)), where
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "tests"],
                          capture_output=True, text=True, env=env, cwd=source, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = {line.split("::")[-1].split()[0] for line in proc.stdout.splitlines()
              if line.startswith("tests/test_example_conformance.py::") and " PASSED" in line}
    for check in ("test_logprobs_match_transformers", "test_train_step_matches_plain_pytorch",
                  "test_save_load_continue_equals_uninterrupted", "test_adam_state_survives_save_and_load",
                  "test_bfloat16_logprobs_are_close_to_float32", "test_enabling_the_section_selects_the_backend"):
        assert check in passed, proc.stdout
