"""The third-party templates (a training backend, an algorithm, an environment, a generation
backend) install with pip and plug in through their entry points; each runs its own tests,
conformance suites included, from a copy outside the repository."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO, clean_env, install_copies, run_corerl

TEMPLATES = ("plugin", "algorithm", "environment", "generation")
#: the generation template's tests run outside in part (all of them run in process: test_templates_in_process.py)
GENERATION_OUTSIDE = ("test_registers_the_generation_backend", "test_a_recipe_naming_it_selects_it",
                      "TestExampleSamplerConformance::test_greedy_matches_transformers",
                      "TestExampleSamplerConformance::test_samples_follow_the_stated_distribution")


@pytest.fixture(scope="module")
def installed_templates(tmp_path_factory):
    """The templates copied outside the repository and pip-installed (one pip call, shared by this
    module's tests) into a folder of their own, as an outside author's packages would be
    (conftest.install_copies). The copies' folder and the install folder."""
    return install_copies({t: REPO / "templates" / t for t in TEMPLATES}, tmp_path_factory.mktemp("templates"))


def test_template_package_installs_and_is_listed_and_selected(installed_templates):
    _, target = installed_templates
    env = clean_env({"PYTHONPATH": str(target)})
    rows = {row["name"]: row for row in run_corerl("plugins", "--json", env=env).json()}
    example = rows["example"]
    assert (example["distribution"], example["version"], example["error"]) == ("corerl-example-backend", "0.1.0", None)
    assert example["training_backends"] == ["example"]

    tiny = "policy.model_name=builtin:tiny-qwen2"  # validation looks for the model, and nothing is downloaded
    selected = run_corerl("validate", str(EXAMPLES / "base.yaml"), tiny, "policy.example_cfg.enabled=true", "--json",
                          env=env)
    assert selected.code == 0, selected
    assert selected.json()["training_backend"]["id"] == "example"

    rejected = run_corerl("validate", str(EXAMPLES / "base.yaml"), tiny, "policy.example_cfg.shards=3", env=env)
    assert rejected.code == 2
    assert "policy.example_cfg.shards: must divide the world size (2), got 3" in rejected.err

    # the algorithm and the environment templates: listed, and chosen by a recipe's keys
    assert rows["example_algorithm"]["algorithms"] == ["example_reinforce"]
    assert rows["example_environment"]["environments"] == ["digit_guess"]
    assert rows["example_generation"]["generation_backends"] == ["example_sampler"]
    assert all(rows[name]["error"] is None and rows[name]["contract"] for name in ("example_algorithm",
                                                                                   "example_environment",
                                                                                   "example_generation"))
    chosen = run_corerl("validate", str(EXAMPLES / "demo.yaml"), "algorithm.name=example_reinforce",
                        "data.env_name=digit_guess", "algorithm.max_rollout_turns=3", "--json", env=env)
    assert chosen.code == 0, chosen
    assert (chosen.json()["algorithm"]["id"], chosen.json()["environment"]["id"]) == ("example_reinforce", "digit_guess")


def test_an_outside_package_written_against_the_sdk_passes_the_conformance_suite(installed_templates):
    # The templates import corerl only through corerl.sdk (test_template_uses_the_sdk.py); here
    # copies of them, installed outside the repository, run their own tests (the conformance
    # suites among them) from their own folders, as their authors would: no repository conftest,
    # no repository pythonpath. One pytest process for all, each template's folder its root.
    copies, target = installed_templates
    env = clean_env({"PYTHONPATH": str(target)})
    where = subprocess.run([sys.executable, "-c", "import corerl_example, corerl_example_algorithm, "
                            "corerl_example_generation as g, corerl_example_environment as e; "
                            "print(corerl_example.__file__, e.__file__, g.__file__)"],
                           capture_output=True, text=True, env=env, cwd=copies, timeout=120)
    assert all(path.startswith(str(target)) for path in where.stdout.split()) and where.stdout.strip(), where
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
                           *(f"{t}/tests" for t in TEMPLATES if t != "generation"),
                           *(f"generation/tests/test_example_generation.py::{test}" for test in GENERATION_OUTSIDE)],
                          capture_output=True, text=True, env=env, cwd=copies, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

    def passed(test_file):  # node ids are relative to a root pytest picks among the folders
        return {line.split("::")[-1].split()[0] for line in proc.stdout.splitlines()
                if line.split("::")[0].endswith(test_file) and " PASSED" in line}

    for check in ("test_logprobs_match_transformers", "test_train_step_matches_plain_pytorch",
                  "test_save_load_continue_equals_uninterrupted", "test_adam_state_survives_save_and_load",
                  "test_bfloat16_logprobs_are_close_to_float32", "test_enabling_the_section_selects_the_backend"):
        assert check in passed("test_example_conformance.py"), proc.stdout
    for check in ("test_the_run_object_follows_the_contract", "test_one_step_returns_numbers_with_a_loss",
                  "test_the_step_counter_is_left_to_the_run_loop", "test_save_load_continue_equals_uninterrupted"):
        assert check in passed("test_example_algorithm.py"), proc.stdout
    # named by node id from outside the root pytest picked, their lines show the test's name alone
    for check in GENERATION_OUTSIDE:
        assert any(f"::{check.split('::')[-1]} PASSED" in line for line in proc.stdout.splitlines()), proc.stdout
    for check in ("test_episodes_end", "test_state_is_kept_per_episode", "test_errors_are_reported_as_the_episodes_faults",
                  "test_timeouts_are_reported_without_waiting_for_the_step"):
        assert check in passed("test_example_environment.py"), proc.stdout
