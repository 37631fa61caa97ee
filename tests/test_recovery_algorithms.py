"""In-run recovery of PPO (its critic a worker group of its own) and of an asynchronous GRPO run
(training beside a dedicated generation worker, staleness 0 so that it is deterministic), both on
dtensor at world size 2: five dead ranks each, and the run ends with the uninterrupted run's
metrics (:mod:`corerl.recovery`). They take the place of the tests that killed a PPO run's driver
once and an asynchronous run's driver at four points: those resumed through the same checkpoints,
which these reach from more points; the driver-kill paths keep the kill harness
(``tests/test_kill_harness.py``) and the asynchronous buffer test (``tests/test_async_runs.py``)."""

from __future__ import annotations

import pytest

from corerl.models.value_model import is_value_model
from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

pytestmark = pytest.mark.slow

COMMON = ["sft.enabled=false", "algorithm.max_steps=3", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
          "checkpointing.enabled=true", "checkpointing.save_period=1", "checkpointing.keep_last=1",
          "cluster.gpus_per_node=2", "policy.generation.backend=hf", "run.tensorboard=false"]

# each counted from the one before: the critic's values in PPO step 2; inside the critic's save
# after step 2; the critic loading that recovery's checkpoint; the policy's logprobs in step 2;
# inside the critic's training in step 3
PPO_FAULTS = ["kill:critic worker 1:values#2", "kill:critic worker 1:save_checkpoint#1",
              "kill:critic worker 0:load_checkpoint#1", "kill:training worker 0:logprobs#1",
              "kill:critic worker 1:train_step#2"]


def test_a_ppo_run_recovers_with_its_critic_and_ends_like_an_uninterrupted_one(tmp_path):
    recovered = run_with_faults(tmp_path, [*COMMON, "algorithm.name=ppo"], PPO_FAULTS)
    assert_same_steps(recovered.want, recovered.got, tolerance=1e-5)
    assert faults_of(recovered) == [
        ("critic worker rank 1", "died", "values"), ("critic worker rank 1", "died", "save_checkpoint"),
        ("critic worker rank 0", "died", "load_checkpoint"), ("training worker rank 0", "died", "logprobs"),
        ("critic worker rank 1", "died", "train_step")]
    assert is_value_model(tmp_path / "recovered" / "final_critic")


ASYNC = ["algorithm.async.enabled=true", "algorithm.async.max_staleness=0", "policy.generation.colocated.enabled=false",
         "policy.generation.colocated.resources.gpus_per_node=1"]
# inside GRPO step 2; the refit to the generation worker after step 2; inside step 2's save;
# loading that recovery's checkpoint; inside step 3 (generation of the next batch running ahead)
ASYNC_FAULTS = ["kill:training worker 1:train_step#2", "kill:training worker 0:full_state_dict#2",
                "kill:training worker 1:save_checkpoint#1", "kill:training worker 0:load_checkpoint#1",
                "kill:training worker 1:train_step#2"]


def test_an_asynchronous_run_recovers_and_ends_like_an_uninterrupted_one(tmp_path):
    recovered = run_with_faults(tmp_path, [*COMMON, *ASYNC], ASYNC_FAULTS)
    assert_same_steps(recovered.want, recovered.got)
    assert faults_of(recovered) == [
        ("training worker rank 1", "died", "train_step"), ("training worker rank 0", "died", "full_state_dict"),
        ("training worker rank 1", "died", "save_checkpoint"), ("training worker rank 0", "died", "load_checkpoint"),
        ("training worker rank 1", "died", "train_step")]
