"""The gpu tier's end-to-end runs, each beside its CPU twin where a CPU can run it: GRPO with a KL
penalty on each training backend (on one GPU the policy's ranks and the frozen reference's share it
through one Ray bundle), a bf16 run against the same run in float32, and one step of the LoRA demo.
The GPU cases (``gpu`` mark) are skipped, with the reason, where torch sees no GPU; the CPU cases
run in the slow tier (a machine with a GPU hides it from them). GPU-only, with no CPU twin here:
PPO with a critic and the 'full' offload policy (it checks the GPU memory its offload frees), the
asynchronous run (it checks its generation worker holds the GPU; its CPU twin is
tests/test_async_runs.py::test_staleness_0_in_order_trains_exactly_the_steps_of_a_synchronous_run[hf],
the same flags) and the tool demo (run whole on the CPU by
tests/test_environment_runs.py::test_the_tool_demo_learns_that_the_tool_pays)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, CliResult, RunsBeside, clean_env, run_corerl

pytestmark = pytest.mark.slow

SHORT = ["policy.generation.backend=hf", "sft.max_steps=5", "algorithm.max_steps=5", "algorithm.kl_penalty=0.05",
         "checkpointing.enabled=false"]
#: the runs with a CPU twin: few steps (on 2 CPU cores a run is mostly its start-up)
FEW = ["policy.generation.backend=hf", "sft.max_steps=2", "algorithm.max_steps=3", "checkpointing.enabled=false"]
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]


def _hidden_gpu(device: str) -> dict[str, str] | None:
    """The extra environment of a run on ``device``: a CPU run on a machine with a GPU does not see it."""
    import torch

    return {"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" and torch.cuda.is_available() else None


def _run(device: str, *args: str) -> CliResult:
    """``corerl run *args`` on ``device``."""
    extra = _hidden_gpu(device)
    return run_corerl("run", *args, env=clean_env(extra) if extra else None)


def _rows(run_dir: Path, phase: str) -> list[dict]:
    return [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if row["phase"] == phase]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend, ray_ranks", [
    ("dtensor", False), ("deepspeed", True), ("megatron", True),
])
def test_grpo_with_a_kl_reference(backend, ray_ranks, device, tmp_path):
    """The frozen reference is the policy as GRPO starts: the first step's KL is 0 and every later
    one is not (a reference that took no part, or one other than the starting policy, fails)."""
    result = _run(device, f"policy.training_backend={backend}", *FEW, "algorithm.kl_penalty=0.05",
                  f"run.output_dir={tmp_path}", "run.name=kl")
    assert result.code == 0, result
    summary = json.loads((tmp_path / "kl" / "summary.json").read_text())
    assert summary["training_backend"] == backend and summary["grpo_steps"] == 3
    kl = [row["kl"] for row in _rows(tmp_path / "kl", "grpo")]
    assert len(kl) == 3 and kl[0] <= 1e-7 and all(k > max(1e-7, 10 * kl[0]) for k in kl[1:]), kl
    if ray_ranks:  # the policy and the reference: two groups (on a GPU: sharing it)
        assert result.out.count(f"{backend}: 1 rank(s) on 1 Ray node(s)") == 2, result
        where = "a GPU share each" if device == "gpu" else "CPU"
        log = (tmp_path / "kl" / "run.log").read_text()
        assert log.count(f"1 {backend} workers on 1 Ray node(s), {where}") == 2, log


@pytest.mark.parametrize("device", DEVICES)
def test_a_bf16_run_is_not_the_float32_run(device, tmp_path, runs_beside: RunsBeside):
    """The same run in bfloat16 and in float32, from the same weights and seed: the SFT steps' loss
    and gradient norm differ by at least 1e-3 relative somewhere (a backend that ignored
    ``policy.precision`` would log the float32 figures; on 2 CPU cores the largest difference is
    about 5e-3), and the first step's loss by under 1 %."""
    args = [*FEW, "algorithm.max_steps=1", f"run.output_dir={tmp_path}"]  # the SFT steps are compared
    float32 = runs_beside.start("run", *args, "run.name=float32", extra_env=_hidden_gpu(device))
    bf16 = _run(device, *args, "policy.precision=bfloat16", "run.name=bf16")
    assert bf16.code == 0, bf16
    assert float32.result().code == 0
    for name in ("bf16", "float32"):
        assert json.loads((tmp_path / name / "summary.json").read_text())["grpo_steps"] == 1
    ours, theirs = _rows(tmp_path / "bf16", "sft"), _rows(tmp_path / "float32", "sft")
    assert len(ours) == len(theirs) == 2
    differences = [abs(a[key] - b[key]) / abs(b[key]) for a, b in zip(ours, theirs, strict=True)
                   for key in ("loss", "grad_norm")]
    assert max(differences) >= 1e-3, differences
    assert differences[0] < 1e-2, differences


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_asynchronous_grpo_runs_three_steps_beside_its_generation_worker(tmp_path):
    """Training (world size 1, in the driver) and the dedicated generation worker share one GPU."""
    result = run_corerl("run", *ASYNC, "policy.generation.colocated.resources.gpus_per_node=1",
                        f"run.output_dir={tmp_path}", "run.name=async")
    assert result.code == 0, result
    assert "on a dedicated worker" in result.out and "a GPU" in result.out, result
    assert len(_rows(tmp_path / "async", "grpo")) == 3


@pytest.mark.gpu
def test_asynchronous_grpo_updates_a_vllm_engine_split_over_two_gpus_while_it_generates(tmp_path):
    """The dedicated worker's vLLM engine split over two GPUs (tensor parallel): its actor hosts the
    engine, vLLM's Ray executor puts one worker in each of generation's two bundles, and the weights
    reach both between two engine steps (in_flight=continue)."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs; torch sees {torch.cuda.device_count()}")
    result = run_corerl("run", "policy.generation.backend=vllm", *ASYNC[1:], "algorithm.async.in_flight=continue",
                        "policy.generation.vllm_cfg.tensor_parallel_size=2",
                        "policy.generation.colocated.resources.gpus_per_node=2",
                        f"run.output_dir={tmp_path}", "run.name=split")
    assert result.code == 0, result
    rows = _rows(tmp_path / "split", "grpo")
    assert len(rows) == 3 and max(age for r in rows for age in r["async/staleness"]) <= 1


@pytest.mark.parametrize("recipe, name, device", [
    ("grpo_lora_demo.yaml", "lora", "cpu"),
    pytest.param("grpo_lora_demo.yaml", "lora", "gpu", marks=pytest.mark.gpu),
    pytest.param("grpo_tools_demo.yaml", "tools", "gpu", marks=pytest.mark.gpu),
])
def test_one_step_of_the_lora_and_tool_demos(recipe, name, device, tmp_path):
    result = _run(device, str(EXAMPLES / recipe), "policy.generation.backend=hf", "sft.max_steps=2",
                  "algorithm.max_steps=1", "checkpointing.enabled=false", f"run.output_dir={tmp_path}",
                  f"run.name={name}")
    assert result.code == 0, result
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["grpo_steps"] == 1, summary
    if name == "lora":  # final/ is the adapter GRPO trained, not a whole model
        adapter = json.loads((tmp_path / name / "final" / "adapter_config.json").read_text())
        assert adapter["r"] == 8 and not (tmp_path / name / "final" / "model.safetensors").exists()
