"""In-run recovery on DeepSpeed ZeRO-3 at world size 2: a run that loses a rank inside a step,
inside a save, during a refit and while a recovery loads its checkpoint recovers by itself and ends
with the uninterrupted run's metrics (:mod:`corerl.recovery`)."""

from __future__ import annotations

import pytest

from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

ARGS = ["sft.enabled=false", "algorithm.max_steps=4", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
        "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1", "cluster.gpus_per_node=2",
        "policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=3", "policy.generation.backend=hf"]
# each counted from the one before: inside GRPO step 2; inside step 2's save; the refit after
# step 3 (full_state_dict gathers the ZeRO-3 shards for hf generation); loading the checkpoint of
# that recovery; inside step 4
FAULTS = ["kill:deepspeed worker 1:train_step#2", "kill:deepspeed worker 0:save_checkpoint#1",
          "kill:deepspeed worker 1:full_state_dict#3", "kill:deepspeed worker 0:load_checkpoint#1",
          "kill:deepspeed worker 1:train_step#2"]


@pytest.mark.slow
def test_a_zero3_run_recovers_from_five_dead_ranks_and_ends_like_an_uninterrupted_one(tmp_path):
    recovered = run_with_faults(tmp_path, ARGS, FAULTS)
    assert_same_steps(recovered.want, recovered.got)
    assert faults_of(recovered) == [
        ("deepspeed worker rank 1", "died", "train_step"), ("deepspeed worker rank 0", "died", "save_checkpoint"),
        ("deepspeed worker rank 1", "died", "full_state_dict"), ("deepspeed worker rank 0", "died", "load_checkpoint"),
        ("deepspeed worker rank 1", "died", "train_step")]
