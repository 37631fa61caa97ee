"""A run keeps the recipe it started with; a resume that changes anything but the documented
resumable keys is refused in one line listing the differences."""

from __future__ import annotations

from corerl.config import config_from_mapping
from corerl.run.record import RESUMABLE_KEYS, effective_values, resumable
from tests.conftest import run_corerl
from tests.refusals import refused_in_one_line

SFT = ["algorithm.name=sft", "algorithm.batch_size=8", "checkpointing.save_period=2", "run.tensorboard=false",
       "policy.generation.backend=hf"]


def test_a_resume_with_other_settings_is_refused_and_one_changing_only_resumable_keys_goes_on(tmp_path):
    args = [*SFT, f"run.output_dir={tmp_path}", "run.name=r"]
    first = run_corerl("run", *args, "algorithm.max_steps=2")
    assert first.code == 0, first
    recorded = tmp_path / "r" / "recipe.yaml"
    assert run_corerl("validate", str(recorded)).code == 0  # the record is a recipe

    changed = run_corerl("run", *args, "algorithm.max_steps=4", "policy.optimizer.lr=1e-3", "data.held_out_size=3")
    line = refused_in_one_line(changed, key="run.name")
    assert line.startswith(f"corerl: error: run.name: resuming {tmp_path / 'r'} with a recipe that differs from the "
                           "one it started with: data.held_out_size None -> 3; policy.optimizer.lr 0.003 -> 0.001; ")
    assert f"corerl run {recorded} run.name=r" in line

    # where metrics go may change: a logger switched on for the resume
    more = run_corerl("run", *args, "algorithm.max_steps=4", "checkpointing.keep_last=2", "logger.mlflow.enabled=true")
    assert more.code == 0 and "resuming from step 2" in more.out, more
    assert (tmp_path / "r" / "mlflow.db").exists()


def test_settings_are_compared_with_their_defaults_filled_in(corerl_host):
    given = {"cluster": {"gpus_per_node": 1}, "policy": {"model_name": "builtin:tiny-qwen2"}}
    spelled_out = {**given, "policy": {**given["policy"], "max_seq_length": effective_values(
        config_from_mapping(given, corerl_host))["policy.max_seq_length"]}}
    assert effective_values(config_from_mapping(given, corerl_host)) == \
        effective_values(config_from_mapping(spelled_out, corerl_host))
    assert "algorithm.max_steps" in RESUMABLE_KEYS and "policy.optimizer.lr" not in RESUMABLE_KEYS
    assert resumable("logger.wandb.project") and resumable("run.name") and not resumable("loggers.x")
    assert resumable("eval.every_n_steps") and resumable("checkpointing.keep_top_k") and not resumable("evaluation.x")
