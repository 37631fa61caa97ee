"""In-run recovery of PPO on DeepSpeed ZeRO-3 at world size 2, its critic a ZeRO-3 worker group of
its own: a run that loses a rank of either group inside a step, inside a save, during a refit and
while a recovery loads its checkpoint recovers by itself and ends with the uninterrupted run's
metrics (:mod:`corerl.run.recovery`). One run checks both the ZeRO-3 backend and PPO's critic: it took
the place of one test for each. The uninterrupted run is started by ``scripts/launch_zero3.sh``
(the ZeRO-3 preset on the demo recipe), so it checks the launcher too: it took the place of a run
of its own for that."""

from __future__ import annotations

import json

import pytest

from corerl.models.value_model import is_value_model
from tests.conftest import EXAMPLES, REPO
from tests.recovery_runs import assert_same_steps, faults_of, run_with_faults

# what the zero3 preset sets (corerl_deepspeed/presets/zero3.yaml): the launcher's run gives them by it
ZERO3 = ["policy.training_backend=deepspeed", "policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=3"]
ARGS = ["sft.enabled=false", "algorithm.name=ppo", "algorithm.max_steps=3", "algorithm.batch_size=4",
        "algorithm.num_generations_per_prompt=4", "checkpointing.enabled=true", "checkpointing.save_period=1",
        "checkpointing.keep_last=1", "cluster.gpus_per_node=2", "policy.generation.backend=hf", "run.tensorboard=false"]
# each counted from the one before: the critic's values in PPO step 2; inside the policy's save
# after step 2; the refit after step 2 (full_state_dict gathers the ZeRO-3 shards for hf
# generation); the critic loading that recovery's checkpoint; inside the critic's training in step 3
FAULTS = ["kill:deepspeed critic worker 1:values#2", "kill:deepspeed worker 0:save_checkpoint#1",
          "kill:deepspeed worker 1:full_state_dict#2", "kill:deepspeed critic worker 0:load_checkpoint#1",
          "kill:deepspeed critic worker 1:train_step#2"]


@pytest.mark.slow
def test_a_zero3_ppo_run_recovers_from_five_dead_ranks_and_ends_like_an_uninterrupted_one(tmp_path):
    launcher = [str(REPO / "scripts" / "launch_zero3.sh"), str(EXAMPLES / "demo.yaml"), *ARGS]
    recovered = run_with_faults(tmp_path, [*ARGS, *ZERO3], FAULTS, straight=launcher)
    assert_same_steps(recovered.want, recovered.got, tolerance=1e-5)
    assert faults_of(recovered) == [
        ("deepspeed critic worker rank 1", "died", "values"), ("deepspeed worker rank 0", "died", "save_checkpoint"),
        ("deepspeed worker rank 1", "died", "full_state_dict"),
        ("deepspeed critic worker rank 0", "died", "load_checkpoint"),
        ("deepspeed critic worker rank 1", "died", "train_step")]
    assert is_value_model(tmp_path / "recovered" / "final_critic")

    # the launcher's run: ZeRO-3 by its preset, DeepSpeed's notices off the terminal, full weights gathered
    assert "policy.training_backend names 'deepspeed'" in recovered.straight_out
    assert "Setting accelerator to CPU" not in recovered.straight_out
    summary = json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert summary["training_backend"] == "deepspeed" and summary["steps"] == 3
    assert (tmp_path / "straight" / "final" / "model.safetensors").exists()  # ZeRO-3 shards gathered
