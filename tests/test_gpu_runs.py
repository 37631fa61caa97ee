"""The gpu tier's end-to-end runs: GRPO with a KL penalty, and PPO with a critic, on one GPU for
each training backend (the policy's ranks, the frozen reference's and the critic's share the GPU
through one Ray bundle), and a bf16 run. Skipped without a GPU."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES, run_corerl

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SHORT = ["policy.generation.backend=hf", "sft.max_steps=5", "algorithm.max_steps=5", "algorithm.kl_penalty=0.05",
         "checkpointing.enabled=false"]


@pytest.mark.parametrize("backend, ray_ranks", [
    ("dtensor", False), ("deepspeed", True), ("megatron", True),
])
def test_grpo_with_a_kl_reference_shares_one_gpu(backend, ray_ranks, tmp_path):
    result = run_corerl("run", f"policy.training_backend={backend}", *SHORT, f"run.output_dir={tmp_path}",
                        "run.name=gpu")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert summary["training_backend"] == backend and summary["grpo_steps"] == 5
    rows = [json.loads(line) for line in (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["kl"] >= 0 for r in rows if r["phase"] == "grpo")  # the reference took part
    if ray_ranks:  # the policy and the reference: two groups, one GPU
        assert result.out.count(f"{backend}: 1 rank(s) on 1 Ray node(s)") == 2, result


def test_a_bf16_run_on_the_gpu(tmp_path):
    result = run_corerl("run", "policy.precision=bfloat16", *SHORT, f"run.output_dir={tmp_path}", "run.name=bf16")
    assert result.code == 0, result
    assert json.loads((tmp_path / "bf16" / "summary.json").read_text())["grpo_steps"] == 5


@pytest.mark.parametrize("backend, ray_ranks", [
    ("dtensor", False), ("deepspeed", True), ("megatron", True),
])
def test_ppo_with_a_critic_shares_one_gpu_and_offloads_it_while_generating(backend, ray_ranks, tmp_path):
    result = run_corerl("run", str(EXAMPLES / "ppo_demo.yaml"), f"policy.training_backend={backend}", *SHORT,
                        "policy.offload.policy=full", f"run.output_dir={tmp_path}", "run.name=ppo")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "ppo" / "summary.json").read_text())
    assert summary["critic_backend"] == backend and summary["ppo_steps"] == 5
    if ray_ranks:  # the policy, the reference and the critic: three groups, one GPU
        assert result.out.count(f"{backend}: 1 rank(s) on 1 Ray node(s)") == 3, result


ASYNC = ["policy.generation.backend=hf", "algorithm.async.enabled=true", "policy.generation.colocated.enabled=false",
         "sft.max_steps=5", "algorithm.max_steps=3", "checkpointing.enabled=false"]


def test_asynchronous_grpo_runs_three_steps_beside_its_generation_worker(tmp_path):
    """Training (world size 1, in the driver) and the dedicated generation worker share one GPU."""
    result = run_corerl("run", *ASYNC, "policy.generation.colocated.resources.gpus_per_node=1",
                        f"run.output_dir={tmp_path}", "run.name=async")
    assert result.code == 0, result
    assert "on a dedicated worker" in result.out and "a GPU" in result.out, result
    rows = [json.loads(line) for line in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["phase"] == "grpo"]) == 3


@pytest.mark.parametrize("recipe, name", [("grpo_lora_demo.yaml", "lora"), ("grpo_tools_demo.yaml", "tools")])
def test_one_step_of_the_lora_and_tool_demos_on_the_gpu(recipe, name, tmp_path):
    result = run_corerl("run", str(EXAMPLES / recipe), "policy.generation.backend=hf", "sft.max_steps=2",
                        "algorithm.max_steps=1", "checkpointing.enabled=false", f"run.output_dir={tmp_path}",
                        f"run.name={name}")
    assert result.code == 0, result
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["grpo_steps"] == 1, summary
