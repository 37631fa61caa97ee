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
    """The run with the 'full' offload policy logs what the same run without offload logs (to a
    GPU's reduction-order noise), and the backend's offload frees the GPU memory of its state and
    brings it back unchanged (:func:`corerl.testing.offload_check.check_offload_keeps_state`)."""
    import math

    from corerl.config import load_config
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe
    from corerl.testing.conformance import conformance_batch, conformance_loss
    from corerl.testing.offload_check import check_offload_keeps_state

    rows = {}
    for policy in ("full", "none"):
        result = run_corerl("run", str(EXAMPLES / "ppo_demo.yaml"), f"policy.training_backend={backend}", *SHORT,
                            f"policy.offload.policy={policy}", f"run.output_dir={tmp_path}", f"run.name={policy}")
        assert result.code == 0, result
        summary = json.loads((tmp_path / policy / "summary.json").read_text())
        assert summary["critic_backend"] == backend and summary["ppo_steps"] == 5
        if ray_ranks:  # the policy, the reference and the critic: three groups, one GPU
            assert result.out.count(f"{backend}: 1 rank(s) on 1 Ray node(s)") == 3, result
        lines = (tmp_path / policy / "metrics.jsonl").read_text().splitlines()
        rows[policy] = [row for row in map(json.loads, lines) if row["phase"] == "ppo"]
    assert len(rows["full"]) == len(rows["none"]) == 5, rows
    compared = 0
    for ours, theirs in zip(rows["full"], rows["none"], strict=True):
        for key, value in theirs.items():
            if key.startswith(("time/", "refit/", "memory")) or isinstance(value, bool) \
                    or not isinstance(value, (int, float)):
                continue
            assert math.isclose(ours[key], value, rel_tol=1e-3, abs_tol=1e-5), (ours["step"], key, ours[key], value)
            compared += 1
    assert compared >= 5 * 3, rows  # loss, reward, kl at least: the comparison saw the run's figures

    # the backend in this process, on the GPU: offload frees its state's memory, reload brings it back
    model = str(build_tiny_model(tmp_path / "model", hidden_size=128, num_layers=2))
    recipe = write_recipe(tmp_path / "offload.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 4,
                   "training_backend": backend, "optimizer": {"name": "adamw", "lr": 1e-4}},
    })
    host = PluginHost()
    engine = host.training_backends.get(backend).create(config=load_config(recipe, ["cluster.gpus_per_node=1"], host))
    try:
        engine.load_hf(model)
        assert all(device.startswith("cuda") for device in engine.worker_devices()), engine.worker_devices()
        batch = conformance_batch(rows=8, length=32, vocab=128)
        engine.train_step(batch, conformance_loss)  # the optimizer holds its moments
        check_offload_keeps_state(engine, batch, tolerance=1e-5)
    finally:
        engine.shutdown()


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
