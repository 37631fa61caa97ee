"""NeMo RL's own recipes run as they are, with only what a laptop needs overridden: the built-in
tiny model (and its tokenizer), a local data file, small batch and step counts, the cluster size,
float32, a learning rate for a model trained from scratch, and the megatron fusions that need a
GPU switched off. Each trains on 2 CPU cores and its held-out figure improves (slow tier).

The recipes are read from NeMo RL's examples/configs: ``CORERL_NEMO_RL_CONFIGS``, else the copy
beside this checkout (``../shared/nemo-rl``); where neither is present these tests skip.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_corerl
from tests.test_nemo_rl_dialect import CORPUS

pytestmark = pytest.mark.skipif(not CORPUS.is_dir(), reason=f"NeMo RL's recipes are not at {CORPUS}")

TINY = ["policy.model_name=builtin:tiny-qwen2", "policy.tokenizer.name=builtin:tiny-qwen2",
        "policy.precision=float32", "cluster.gpus_per_node=1", "cluster.num_nodes=1"]
# GRPO on the math environment: the answer is the prompt's digit (math-verify checks it)
GRPO = ["data.default.prompt_file=null", "env.math.num_workers=0", "grpo.max_val_samples=20",
        "grpo.num_prompts_per_step=16", "grpo.num_generations_per_prompt=8", "grpo.max_num_steps=60",
        "grpo.max_num_epochs=10",  # the recipe's 1 epoch of these 100 rows would end the run at 7 steps
        "policy.train_global_batch_size=128", "policy.train_micro_batch_size=128",
        "policy.max_total_sequence_length=10", "policy.generation.max_new_tokens=10",
        "policy.generation.vllm_cfg.max_model_len=10", "data.max_input_seq_length=10"]
MEGATRON_ON_CPU = ["policy.megatron_cfg.optimizer.use_distributed_optimizer=false",
                   "policy.megatron_cfg.apply_rope_fusion=false", "policy.megatron_cfg.bias_activation_fusion=false",
                   "policy.megatron_cfg.scheduler.lr_warmup_iters=0"]


def _digits(path: Path) -> Path:
    """Rows ``w0 <d> :`` whose answer is the digit, in NeMo RL's input/output columns."""
    rows = [{"input": f"w0 {d} :", "output": str(d)} for d in list(range(10)) * 12]
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pairs(path: Path) -> Path:
    """Preference pairs: the prompt's digit twice is chosen over another digit twice."""
    rng = random.Random(0)
    rows = []
    for d in list(range(10)) * 12:
        wrong = (d + 1 + rng.randrange(9)) % 10
        rows.append({"prompt": f"w0 {d} :", "chosen": f"{d} {d}", "rejected": f"{wrong} {wrong}"})
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(tmp_path: Path, recipe: str, *overrides: str) -> dict:
    # the recipe's W&B logging (wandb_enabled) acts: offline, as on a laptop without a W&B login
    result = run_corerl("run", str(CORPUS / recipe), *TINY, *overrides, f"run.output_dir={tmp_path}", "run.name=run",
                        env=clean_env({"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}))
    assert result.code == 0, result
    assert "running (nemo-rl dialect)" in result.out
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def test_grpo_math_1b_runs_and_its_held_out_reward_rises(tmp_path):
    # 40 steps: +65 points measured alone (68 s)
    summary = _run(tmp_path, "grpo_math_1B.yaml", f"data.train.data_path={_digits(tmp_path / 'train.jsonl')}", *GRPO,
                   "grpo.max_num_steps=40", "policy.optimizer.kwargs.lr=3e-3")
    assert (summary["algorithm"], summary["environment"], summary["generation_backend"]) == ("grpo", "math", "vllm")
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.3, summary


def test_sft_runs_and_its_held_out_reward_rises(tmp_path):
    summary = _run(tmp_path, "sft.yaml", f"data.train.data_path={_digits(tmp_path / 'train.jsonl')}",
                   "sft.max_num_steps=60", "sft.max_num_epochs=20", "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16",
                   "policy.max_total_sequence_length=16", "policy.optimizer.kwargs.lr=3e-3")
    assert summary["algorithm"] == "sft" and summary["steps"] == 60
    assert len(list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))) == 1  # sft.yaml: wandb_enabled
    assert summary["held_out_reward_after"] >= summary["held_out_reward_before"] + 0.5, summary


def test_dpo_runs_and_its_held_out_preference_accuracy_rises(tmp_path):
    summary = _run(tmp_path, "dpo.yaml", f"data.train.data_path={_pairs(tmp_path / 'pairs.jsonl')}",
                   "dpo.max_num_steps=40", "dpo.max_num_epochs=20", "policy.train_global_batch_size=16", "policy.train_micro_batch_size=16",
                   "policy.max_total_sequence_length=16", "policy.optimizer.kwargs.lr=3e-3")
    assert summary["algorithm"] == "dpo" and summary["dpo_steps"] == 40
    before, after = summary["held_out_preference_accuracy_before"], summary["held_out_preference_accuracy_after"]
    assert after >= before + 0.3, summary


def test_a_megatron_grpo_recipe_runs_with_its_optimizer_keys_in_force(tmp_path):
    """A recipes/llm megatron recipe trains a few GRPO steps on megatron, with the learning rate
    and constant schedule of its megatron_cfg (not dtensor's optimizer section). That GRPO learns
    through NeMo RL's keys is grpo_math_1B's test above; that a megatron step is plain PyTorch's,
    its conformance classes (docs/migrating-from-nemo-rl.md gives the 60-step figure, measured)."""
    summary = _run(tmp_path, "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-megatron.yaml",
                   f"data.train.data_path={_digits(tmp_path / 'train.jsonl')}", *GRPO, *MEGATRON_ON_CPU,
                   "policy.megatron_cfg.optimizer.lr=3e-3", "grpo.max_num_steps=4", "grpo.val_period=0")
    assert (summary["training_backend"], summary["algorithm"], summary["steps"]) == ("megatron", "grpo", 4), summary
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows if r["phase"] == "grpo"] == [3e-3] * 4, rows


def test_an_fsdp2_grpo_recipe_runs_through_its_defaults_chain(tmp_path):
    """A recipes/llm child recipe (defaults: grpo_math_1B.yaml) runs its steps on dtensor; that
    GRPO learns on dtensor through NeMo RL's keys is grpo_math_1B's test above."""
    summary = _run(tmp_path, "recipes/llm/grpo-llama3.2-1b-instruct-1n8g-fsdp2tp1.v3.yaml",
                   f"data.train.data_path={_digits(tmp_path / 'train.jsonl')}", *GRPO, "policy.optimizer.kwargs.lr=3e-3",
                   "grpo.max_num_steps=3", "grpo.val_period=0")
    assert (summary["training_backend"], summary["algorithm"], summary["steps"]) == ("dtensor", "grpo", 3), summary
