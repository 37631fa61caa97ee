"""In-run recovery of PPO on DeepSpeed ZeRO-3 at world size 2, its critic a ZeRO-3 worker group of
its own: a run that loses a rank of either group inside a step, inside a save, during a refit and
while a recovery loads its checkpoint recovers by itself and ends with the uninterrupted run's
metrics (:mod:`corerl.recovery`). One run checks both the ZeRO-3 backend and PPO's critic: it took
the place of one test for each."""

from __future__ import annotations

import pytest

from corerl.models.value_model import is_value_model
from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

ARGS = ["sft.enabled=false", "algorithm.name=ppo", "algorithm.max_steps=3", "algorithm.batch_size=4",
        "algorithm.num_generations_per_prompt=4", "checkpointing.enabled=true", "checkpointing.save_period=1",
        "checkpointing.keep_last=1", "cluster.gpus_per_node=2", "policy.deepspeed_cfg.enabled=true",
        "policy.deepspeed_cfg.zero_stage=3", "policy.generation.backend=hf", "run.tensorboard=false"]
# each counted from the one before: the critic's values in PPO step 2; inside the policy's save
# after step 2; the refit after step 2 (full_state_dict gathers the ZeRO-3 shards for hf
# generation); the critic loading that recovery's checkpoint; inside the critic's training in step 3
FAULTS = ["kill:deepspeed critic worker 1:values#2", "kill:deepspeed worker 0:save_checkpoint#1",
          "kill:deepspeed worker 1:full_state_dict#2", "kill:deepspeed critic worker 0:load_checkpoint#1",
          "kill:deepspeed critic worker 1:train_step#2"]


@pytest.mark.slow
def test_a_zero3_ppo_run_recovers_from_five_dead_ranks_and_ends_like_an_uninterrupted_one(tmp_path):
    recovered = run_with_faults(tmp_path, ARGS, FAULTS)
    assert_same_steps(recovered.want, recovered.got, tolerance=1e-5)
    assert faults_of(recovered) == [
        ("deepspeed critic worker rank 1", "died", "values"), ("deepspeed worker rank 0", "died", "save_checkpoint"),
        ("deepspeed worker rank 1", "died", "full_state_dict"),
        ("deepspeed critic worker rank 0", "died", "load_checkpoint"),
        ("deepspeed critic worker rank 1", "died", "train_step")]
    assert is_value_model(tmp_path / "recovered" / "final_critic")
