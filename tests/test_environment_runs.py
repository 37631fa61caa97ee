"""Environments in whole runs: the tool demo learns to use its tool (and cannot succeed without
it), a third-party environment installs by entry point and trains, environment actors survive
a killed process and a hung step, and a run killed in the middle of a rollout resumes."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
from ray._common.utils import get_default_ray_temp_dir  # where Ray keeps session folders

from corerl.environments.contract import EpisodeView
from tests.conftest import CORERL, EXAMPLES, REPO, clean_env, run_corerl, wait_for_marker
from tests.test_resume import _rows, _same_metrics

DEMO = str(EXAMPLES / "grpo_tools_demo.yaml")
GUESS = REPO / "tests" / "data" / "guess" / "corerl_guess.py"


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_the_tool_demo_learns_that_the_tool_pays(tmp_path):
    result = run_corerl("run", DEMO, f"run.output_dir={tmp_path}", "run.name=tools")
    assert result.code == 0, result
    summary = _summary(tmp_path / "tools")
    assert summary["environment"] == "tools" and summary["sft_steps"] == 100 and summary["grpo_steps"] == 80
    gain = summary["held_out_reward_after"] - summary["held_out_reward_after_sft"]
    assert gain >= 0.3, summary
    assert re.search(r"held-out reward: 0\.000 before, \d\.\d{3} after SFT, \d\.\d{3} at the end", result.out)
    rows = [json.loads(line) for line in (tmp_path / "tools" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["phase"] == "grpo"][-10:]
    assert min(r["env/tool_calls_per_episode"] for r in last) >= 0.9  # calling the tool became the rule
    assert min(r["env/turns"] for r in last) >= 1.9


def test_without_the_tool_success_stays_at_chance(tmp_path):
    """The same run with no tool to call, at half its length (50 SFT and 40 GRPO steps): the prompt
    says nothing of the digit, so no policy does better than always saying the held-out episodes'
    most common digit."""
    from corerl.models.tiny import build_tokenizer
    from corerl.tasks import TaskContext
    from corerl.tasks.tool_lookup import ToolLookup

    result = run_corerl("run", DEMO, "env.tools.tools=[]", "sft.max_steps=50", "algorithm.max_steps=40",
                        f"run.output_dir={tmp_path}", "run.name=no_tool")
    assert result.code == 0, result
    summary = _summary(tmp_path / "no_tool")
    values = ToolLookup(TaskContext(build_tokenizer(128), 7, None)).held_out_values
    chance = max(values.count(v) for v in set(values)) / len(values)
    assert summary["held_out_reward_after"] <= chance, (summary, values)
    rows = [json.loads(line) for line in (tmp_path / "no_tool" / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["phase"] == "grpo"]
    assert sum(r["env/tool_failures"] for r in grpo) > 0  # it called, and was told there is no such tool
    assert sum(r["reward/mean"] for r in grpo[-20:]) / 20 <= 0.25  # training success at chance (0.1) too


def test_a_third_party_environment_installs_by_entry_point_and_trains(fake_site, tmp_path):
    fake_site.add_distribution("corerl-guess", "0.1.0", entry_points={"corerl.plugins": {"guess": "corerl_guess"}},
                               files={"corerl_guess.py": GUESS.read_text()})
    env = fake_site.env(clean_env(shared_ray=False))
    rng = random.Random(0)
    data = tmp_path / "numbers.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"w2 {d} ?", "answer": str(d)}) + "\n"
                            for d in (rng.randrange(10) for _ in range(40))))
    listed = run_corerl("plugins", env=env)
    assert "environments: guess (env.guess)" in listed.out, listed
    result = run_corerl("run", "data.task=dataset", f"data.train_files={data}", "data.env_name=guess",
                        "env.guess.hints=false", "algorithm.max_rollout_turns=3", "algorithm.max_steps=3",
                        "sft.enabled=false", "policy.generation.backend=hf", "policy.generation.max_new_tokens=3",
                        f"run.output_dir={tmp_path}", "run.name=guess", env=env)
    assert result.code == 0, result
    assert _summary(tmp_path / "guess")["environment"] == "guess"
    rows = [json.loads(line) for line in (tmp_path / "guess" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(1.0 <= r["env/turns"] <= 3.0 for r in rows)
    assert any(r["env/stop/max_turns"] > 0 for r in rows)  # a random policy guesses wrong and runs out of turns
    bad = run_corerl("validate", "--dialect", "corerl", str(EXAMPLES / "demo.yaml"), "data.env_name=guess",
                     "env.guess.hints=maybe", env=env)
    assert bad.code == 2 and "env.guess.hints" in bad.err, bad


def test_environment_actors_survive_a_killed_process_and_a_hung_step():
    from corerl.environments.contract import EnvironmentContext, EnvironmentSettings
    from corerl.environments.pool import RayPool
    from corerl.registry import Environment

    registration = Environment(id="crashy", factory="tests.environment_fixtures:Crashy")
    context = EnvironmentContext(EnvironmentSettings(num_workers=2, timeout_s=3.0), 0)
    pool = RayPool(registration, context, 2)
    try:
        def views(*kinds):
            return [EpisodeView(row={"kind": k}, turn=1, responses=("x",)) for k in kinds]

        first = pool.answer(views("ok", "ok"))
        pids = {a.turn.state["pid"] for a in first}
        assert len(pids) == 2 and pids != {os.getpid()}  # two actors, neither the driver
        died = pool.answer(views("die", "ok"))
        assert died[0].fault == "env_error" and "died" in died[0].cause and died[1].turn is not None
        hung = pool.answer(views("ok", "hang"))
        assert hung[0].turn is not None and hung[1].fault == "env_timeout"
        again = pool.answer(views("ok", "ok", "ok", "ok"))  # the dead actor was restarted by Ray
        assert all(a.turn is not None for a in again)
        assert len({a.turn.state["pid"] for a in again} - pids) >= 1
    finally:
        pool.shutdown()


def test_a_run_sigkilled_mid_rollout_resumes_like_any_other(tmp_path):
    """With the environment in 2 Ray workers, which die with the run: the in-process environment
    resumes through the same checkpoint, and its own run (75 s) left the slow tier."""
    common = ["sft.max_steps=2", "algorithm.max_steps=6", "checkpointing.enabled=true",
              "checkpointing.save_period=2", "algorithm.batch_size=4", "env.tools.num_workers=2"]
    straight = run_corerl("run", DEMO, f"run.output_dir={tmp_path}", "run.name=straight", *common)
    assert straight.code == 0, straight
    # rollouts: 1 held-out before, 2 after SFT, then GRPO steps 1, 2, 3, ...: the run stops after
    # the first turn of GRPO step 3's rollout (checkpoints at global steps 2 and 4 exist) and is killed
    markers = tmp_path / "markers"
    proc = subprocess.Popen([str(CORERL), "run", DEMO, f"run.output_dir={tmp_path}", "run.name=killed", *common],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True,
                            env=clean_env({"CORERL_PROGRESS_MARKERS": str(markers),
                                           "CORERL_TEST_HOLD_AT": "rollout:5:turn:1"}))
    wait_for_marker(markers, "rollout:5:turn:1", proc, seconds=240)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    resumed = run_corerl("run", DEMO, f"run.output_dir={tmp_path}", "run.name=killed", *common)
    assert resumed.code == 0, resumed
    assert "resuming from step 4" in resumed.out
    _same_metrics(_rows(tmp_path / "straight"), _rows(tmp_path / "killed"))
    # the killed run's local Ray session folder (named by its pid) was removed by the resumed run
    assert not list(Path(get_default_ray_temp_dir()).glob(f"session_*_{proc.pid}"))


MEGATRON = """defaults: {demo}
cluster:
  gpus_per_node: 2
policy:
  megatron_cfg:
    enabled: true
    tensor_model_parallel_size: 2
    optimizer: {{optimizer: adam, lr: 1.0e-3, weight_decay: 0.0, clip_grad: 1.0}}
    scheduler: {{lr_decay_style: constant}}
  generation:
    backend: megatron
"""


@pytest.mark.parametrize("engine", ["vllm", "megatron", "packing"])
def test_episodes_run_on_every_generation_backend_and_with_packing(tmp_path, engine):
    """Three GRPO steps of the tool demo: vLLM and megatron continue each episode from its token
    ids, and the training backend's logprobs of the sampled tokens (padded, packed, or megatron's
    own) equal the generation's, so nothing was re-tokenized."""
    recipe, extra = DEMO, []
    if engine == "vllm":
        extra = ["policy.generation.backend=vllm"]
    elif engine == "megatron":
        recipe = str(tmp_path / "megatron.yaml")
        (tmp_path / "megatron.yaml").write_text(MEGATRON.format(demo=DEMO))
    else:
        extra = ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=256",
                 "policy.sequence_packing.logprob_mb_tokens=256", "algorithm.optimization_passes=2"]
    result = run_corerl("run", recipe, "algorithm.max_steps=3", f"run.output_dir={tmp_path}", "run.name=run", *extra)
    assert result.code == 0, result
    summary = _summary(tmp_path / "run")
    assert summary["generation_backend"] == {"vllm": "vllm", "megatron": "megatron", "packing": "hf"}[engine]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["phase"] == "grpo"]
    assert max(r["env/turns"] for r in grpo) > 1.2 and sum(r["env/tool_calls"] for r in grpo) > 0
    assert max(r["logprob_mismatch/rms"] for r in grpo) < 1e-3


def test_a_run_whose_episodes_hang_ends_on_its_error_leaving_the_hung_threads(tmp_path):
    """Every episode's harness waits for ever: the run fails past its failure budget, each episode
    cut off by env.openai_agent.timeout_s, and the process ends after its error line, which it can
    only do by abandoning the hung threads (they are daemons): waiting for them would never end."""
    from corerl.testing import write_recipe
    from tests.test_agent_endpoint import TEMPLATE

    recipe = write_recipe(tmp_path / "hang.yaml", {
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 4},
                   "max_seq_length": 64, "chat_template": TEMPLATE},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 2},
        "data": {"task": "tool_lookup", "env_name": "openai_agent"},
        "env": {"openai_agent": {"agent": "tests.agent_harness:sleeping_agent", "timeout_s": 2, "max_failure_share": 0.5}},
        "sft": {"enabled": False},
        "run": {"output_dir": str(tmp_path), "name": "hang", "tensorboard": False},
    })
    proc = subprocess.Popen([str(CORERL), "run", str(recipe)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=clean_env({"PYTHONPATH": str(REPO)}))
    try:
        # a guard against a hang only: a run that waited for its harnesses would never end
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    errors = [line for line in stderr.splitlines() if line.startswith("corerl:")]
    assert proc.returncode == 1 and errors, stderr[-3000:]
    assert "first: env_timeout on " in errors[0] and "the agent took longer than 2 s" in errors[0], errors
