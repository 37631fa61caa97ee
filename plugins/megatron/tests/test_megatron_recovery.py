"""In-run recovery on megatron at tensor-parallel size 2, generating on its own ranks: a run that
loses a rank during generation, inside a save, inside a step and while a recovery loads its
checkpoint recovers by itself and ends with the uninterrupted run's metrics (:mod:`corerl.recovery`)."""

from __future__ import annotations

import pytest

from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

ARGS = ["sft.enabled=false", "algorithm.max_steps=4", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
        "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1", "cluster.gpus_per_node=2",
        "policy.megatron_cfg.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=2",
        "policy.generation.backend=megatron"]
# each counted from the one before: generating GRPO step 2; inside step 2's save; inside step 3's
# training; loading the checkpoint of that recovery; generating step 4
FAULTS = ["kill:megatron worker 1:generate#2", "kill:megatron worker 0:save_checkpoint#1",
          "kill:megatron worker 1:train_step#2", "kill:megatron worker 0:load_checkpoint#1",
          "kill:megatron worker 1:generate#2"]


@pytest.mark.slow
def test_a_megatron_tp2_run_recovers_from_five_dead_ranks_and_ends_like_an_uninterrupted_one(tmp_path):
    recovered = run_with_faults(tmp_path, ARGS, FAULTS)
    assert_same_steps(recovered.want, recovered.got)
    assert faults_of(recovered) == [
        ("megatron worker rank 1", "died", "generate"), ("megatron worker rank 0", "died", "save_checkpoint"),
        ("megatron worker rank 1", "died", "train_step"), ("megatron worker rank 0", "died", "load_checkpoint"),
        ("megatron worker rank 1", "died", "generate")]
