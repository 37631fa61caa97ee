"""In-run recovery on megatron at tensor-parallel size 2, generating on its own ranks: a run that
loses a rank during generation, inside a save, inside a step and while a recovery loads its
checkpoint recovers by itself and ends with the uninterrupted run's metrics (:mod:`corerl.run.recovery`).
Both runs enable dtensor too: the uninterrupted one also shows that megatron's priority wins and
says why (it took the place of a run of its own for that)."""

from __future__ import annotations

import json

import pytest

from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

ARGS = ["sft.enabled=false", "algorithm.max_steps=4", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
        "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1", "cluster.gpus_per_node=2",
        "policy.megatron_cfg.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.dtensor_cfg.enabled=true", "policy.generation.backend=megatron"]
# each counted from the one before: generating GRPO step 2; inside step 2's save; inside step 3's
# training; loading the checkpoint of that recovery; generating step 4
FAULTS = ["kill:megatron worker 1:generate#2", "kill:megatron worker 0:save_checkpoint#1",
          "kill:megatron worker 1:train_step#2", "kill:megatron worker 0:load_checkpoint#1",
          "kill:megatron worker 1:generate#2"]


@pytest.mark.slow
def test_a_megatron_tp2_run_recovers_from_five_dead_ranks_and_ends_like_an_uninterrupted_one(tmp_path):
    converted = tmp_path / "converted"
    recovered = run_with_faults(tmp_path, ARGS, FAULTS, variables={"CORERL_MEGATRON_CHECKPOINT_DIR": str(converted)})
    assert_same_steps(recovered.want, recovered.got)
    assert faults_of(recovered) == [
        ("megatron worker rank 1", "died", "generate"), ("megatron worker rank 0", "died", "save_checkpoint"),
        ("megatron worker rank 1", "died", "train_step"), ("megatron worker rank 0", "died", "load_checkpoint"),
        ("megatron worker rank 1", "died", "generate")]

    # megatron and dtensor both enabled: megatron runs, and the run says why
    out = recovered.straight_out
    assert "'megatron' has the highest priority (300) over 'dtensor' (100, also enabled)" in out
    assert "training backend 'dtensor' passed over" in out
    assert "generation samples with the megatron training model itself" in out
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["training_backend"] == "megatron" and summary["generation_backend"] == "megatron"
    assert (tmp_path / "straight" / "final" / "config.json").exists()
    assert any(converted.iterdir())  # the conversion went where CORERL_MEGATRON_CHECKPOINT_DIR says
