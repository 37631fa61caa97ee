"""The ``llm_as_a_judge`` environment (SkyRL's LLM-as-a-judge example, written here) played through
the skyrl_gym adapter as the SkyRL dialect's ``llm_as_a_judge`` entry point registers it, its judge a
small OpenAI-compatible chat-completions server in this process (the judge service is not what is
under test: the request the environment sends, how it reads the reply and what it checks are)."""

from __future__ import annotations

import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import skyrl_gym

from corerl.config.dialects.skyrl import entry_points
from corerl.sdk import ConfigError, EnvironmentContext, EpisodeView
from corerl.testing import select_for, write_recipe
from corerl_skyrl_gym.environment import SkyRLGymEnvironment
from corerl_skyrl_gym.llm_judge import ENTRY, LLMJudgeEnv, asker, verdict
from corerl_skyrl_gym.plugin import SkyRLGymSettings

KEY = "sk-test-judge"
REPO = Path(__file__).resolve().parents[3]
CORPUS = Path(os.environ.get("CORERL_SKYRL_CORPUS") or REPO.parent / "shared" / "skyrl")


class Judge:
    """A chat-completions endpoint at ``url`` (``.../v1``): it records each request and answers with
    ``reply(request)`` (default: ``### Final Score: 1`` when the model's answer ends with the
    reference's ``#### <number>``, else 0), or with HTTP ``status`` when that is set."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.reply = self.grade
        self.status = 200
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if judge.status != 200:
                    payload = {"error": {"message": "bad request", "type": "invalid_request_error"}}
                else:
                    payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": judge.reply(body)}}],
                               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(judge.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def grade(body: dict) -> str:
        message = body["messages"][0]["content"]
        truth = message.split("REFERENCE ANSWER:\n")[1].split("\n")[0]
        answer = message.split("MODEL'S ANSWER:\n")[1].rsplit("\n\nYour grade:")[0]
        right = answer.strip().splitlines()[-1].strip() == f"#### {truth}"
        return f"The reference says {truth}.\n### Final Score: {1 if right else 0}"


@pytest.fixture
def judge():
    made = Judge()
    yield made
    made.server.shutdown()
    made.server.server_close()


@pytest.fixture
def deregister():
    """llm_as_a_judge taken off skyrl-gym's registry after the test (validation registers it)."""
    yield
    if "llm_as_a_judge" in skyrl_gym.registry:
        skyrl_gym.envs.registration.deregister("llm_as_a_judge")


@pytest.fixture
def environment(judge, monkeypatch, deregister):
    """The adapter with llm_as_a_judge registered as the entry point registers it, judged by ``judge``."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    (target, entry), = entry_points.by_id("llm_as_a_judge").implies
    assert (target, entry) == ("env.skyrl_gym.register.llm_as_a_judge", ENTRY)
    settings = SkyRLGymSettings(env_class="llm_as_a_judge", register={"llm_as_a_judge": entry},
                                env_config={"model": "judge-model", "base_url": judge.url})
    return SkyRLGymEnvironment(EnvironmentContext(settings, seed=0))


def judge_row(truth="72"):
    """A row as the example's gsm8k_dataset_judge.py lays it out."""
    return {"data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many "
                                                   "in all? Let's think step by step and output the final answer "
                                                   "after \"####\"."}],
            "env_class": "llm_as_a_judge", "reward_spec": {"method": "rule", "ground_truth": truth},
            "extra_info": {"split": "train", "index": 0}}


def step(environment, answer, row=None):
    return environment.step(EpisodeView(row=row or judge_row(), turn=1, responses=(answer,)))


def test_the_judge_scores_a_right_answer_one_and_a_wrong_one_zero_in_one_turn(environment, judge):
    right = step(environment, "48 + 24 = 72\n#### 72")
    wrong = step(environment, "48 + 48 = 96\n#### 96")
    assert (right.reward, right.done, right.observation) == (1.0, True, None)
    assert (wrong.reward, wrong.done) == (0.0, True)
    request = judge.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == f"Bearer {KEY}"
    assert request["model"] == "judge-model" and len(request["messages"]) == 1
    message = request["messages"][0]["content"]
    assert request["messages"][0]["role"] == "user" and "#### 72" in message and "### Final Score: 1" in message


def test_the_reply_is_read_as_skyrl_reads_it():
    assert verdict("reasoning...\n### Final Score: 1") == 1.0
    assert verdict("### Final Score:0.0") == 0.0 and verdict("### Final Score: 1.0 then text") == 1.0
    assert verdict("### Final Score: 0\n### Final Score: 1") == 0.0  # the first verdict counts
    assert verdict(" 1\n") == 1.0 and verdict("0") == 0.0  # a bare 0 or 1
    assert verdict("Final Score: 1") is None and verdict("score 1") is None and verdict("### Final Score: 2") is None


@pytest.mark.parametrize("reply", ["I think it is right.", ""], ids=["no-verdict", "empty"])
def test_a_reply_without_a_verdict_scores_zero_with_a_one_line_warning(environment, judge, caplog, reply):
    judge.reply = lambda body: reply
    with caplog.at_level(logging.WARNING, logger="corerl_skyrl_gym.llm_judge"):
        turn = step(environment, "#### 72")
    assert (turn.reward, turn.done) == (0.0, True)
    (record,) = caplog.records
    assert "no '### Final Score: 0|1' line, reward 0" in record.getMessage() and "\n" not in record.getMessage()


def test_a_failed_request_scores_zero_with_a_one_line_warning(environment, judge, caplog):
    judge.status = 400
    with caplog.at_level(logging.WARNING, logger="corerl_skyrl_gym.llm_judge"):
        turn = step(environment, "#### 72")
    assert (turn.reward, turn.done) == (0.0, True)
    (record,) = caplog.records
    assert "the judge (judge-model at http://127.0.0.1:" in record.getMessage() and "gave no reply, reward 0" in \
        record.getMessage() and "\n" not in record.getMessage()


def test_without_the_openai_client_urllib_asks_the_same_endpoint(judge):
    ask = asker(judge.url, KEY, use_openai=False)
    assert ask("judge-model", "REFERENCE ANSWER:\n5\n\nMODEL'S ANSWER:\n#### 5\n\nYour grade:").endswith("Score: 1")
    assert judge.requests[0]["path"] == "/v1/chat/completions" and judge.requests[0]["auth"] == f"Bearer {KEY}"
    assert judge.requests[0]["model"] == "judge-model"


def test_the_model_and_endpoint_default_as_skyrls(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    env = LLMJudgeEnv(extras={"reward_spec": {"ground_truth": "1"}})
    assert (env.model, env.base_url) == ("gpt-4o-mini", "https://api.openai.com/v1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.local/v1")
    assert LLMJudgeEnv(extras={"reward_spec": {"ground_truth": "1"}}).base_url == "http://judge.local/v1"


def test_a_missing_key_or_truth_ends_the_episode_in_one_line(environment, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY is not set") as missing:
        step(environment, "#### 72")
    assert "\n" not in str(missing.value)
    with pytest.raises(ValueError, match="reward_spec.ground_truth"):
        LLMJudgeEnv(extras={"reward_spec": {"method": "rule"}})


RECIPE = {"policy": {"model_name": "builtin:tiny-qwen2"}, "data": {"env_name": "skyrl_gym"}}


def judge_inputs_check(corerl_host, tmp_path, base_url):
    from corerl.run.inputs import check_run_inputs

    recipe = write_recipe(tmp_path / "recipe.yaml", {**RECIPE, "run": {"output_dir": str(tmp_path / "runs")}})
    config, selection = select_for(corerl_host, recipe, [
        "env.skyrl_gym.env_class=llm_as_a_judge", f"env.skyrl_gym.register.llm_as_a_judge={ENTRY}",
        f"env.skyrl_gym.env_config.base_url={base_url}"])  # selects: the judge is a run input
    check_run_inputs(config, selection, corerl_host)


def test_a_missing_key_or_a_silent_endpoint_is_refused_with_the_run_inputs(corerl_host, tmp_path, monkeypatch, judge,
                                                                             deregister):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError) as no_key:
        judge_inputs_check(corerl_host, tmp_path, judge.url)
    assert no_key.value.key == "env.skyrl_gym.env_class" and "OPENAI_API_KEY is not set" in no_key.value.message
    assert "\n" not in no_key.value.one_line()
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with pytest.raises(ConfigError) as silent:
        judge_inputs_check(corerl_host, tmp_path, "http://127.0.0.1:9/v1")
    assert silent.value.key == "env.skyrl_gym.env_config.base_url"
    assert "its endpoint http://127.0.0.1:9/v1 does not answer" in silent.value.message
    assert "\n" not in silent.value.one_line()
    judge_inputs_check(corerl_host, tmp_path, judge.url)  # the key set, the endpoint answering: nothing missing


SCRIPT = """\
DATA_DIR=/nowhere
uv run --isolated --extra fsdp --env-file .env.llm_judge -m examples.train.llm_as_a_judge.main_llm_judge \\
  data.train_data="['$DATA_DIR/train.parquet']" \\
  trainer.algorithm.advantage_estimator=grpo \\
  trainer.policy.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
  environment.env_class=llm_as_a_judge \\
  environment.skyrl_gym.llm_as_a_judge.model=judge-model \\
  environment.skyrl_gym.llm_as_a_judge.base_url=http://127.0.0.1:9/v1
"""


def test_the_entry_points_script_validates_with_recipe_only_and_is_refused_without_the_key(capsys, tmp_path,
                                                                                            monkeypatch, deregister):
    from corerl import cli

    script = tmp_path / "run_judge.sh"
    script.write_text(SCRIPT)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli.main(["validate", "--recipe-only", "--explain", str(script)]) == 0
    out = capsys.readouterr().out
    assert "environment.skyrl_gym.llm_as_a_judge.model -> env.skyrl_gym.env_config.model" in out
    assert "environment.skyrl_gym.llm_as_a_judge.base_url -> env.skyrl_gym.env_config.base_url" in out
    assert cli.main(["validate", str(script)]) == 2
    assert "'llm_as_a_judge' asks a judge model (judge-model at http://127.0.0.1:9/v1), and OPENAI_API_KEY is not " \
           "set" in capsys.readouterr().err


@pytest.mark.skipif(not (CORPUS / "examples").is_dir(), reason=f"SkyRL's corpus is not at {CORPUS}")
def test_skyrls_llm_as_a_judge_script_validates_with_recipe_only(monkeypatch, deregister):
    from corerl import cli

    monkeypatch.setenv("DATA_DIR", "/tmp")
    monkeypatch.setenv("NUM_GPUS", "1")
    script = CORPUS / "examples" / "train" / "llm_as_a_judge" / "run_llm_judge.sh"
    assert cli.main(["validate", "--recipe-only", str(script)]) == 0


def test_one_grpo_step_is_scored_by_the_judge_on_a_tiny_model(tmp_path, judge, monkeypatch, deregister):
    """End to end in this process: rows laid out as the example's, the tiny policy's answers judged
    through the adapter (registered as the entry point registers it), one GRPO step trained on the
    judge's rewards (its judge: every answer right)."""
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    judge.reply = lambda body: "### Final Score: 1"
    rows = [{**judge_row(str(i % 10)), "prompt": [{"role": "user", "content": f"w{i} w{i + 1} {i % 10} :"}],
             "answer": str(i % 10)} for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (target, entry), = entry_points.by_id("llm_as_a_judge").implies
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 6},
                   "max_seq_length": 256},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 1},
        "data": {"task": "dataset", "train_files": str(data), "held_out_size": 2, "env_name": "skyrl_gym"},
        "env": {"skyrl_gym": {"env_class": "llm_as_a_judge", "register": {"llm_as_a_judge": entry},
                              "env_config": {"model": "judge-model", "base_url": judge.url}}},
        "run": {"output_dir": str(tmp_path), "name": "judge", "tensorboard": False},
    }
    host = PluginHost(env={})
    config = config_from_mapping(recipe, host)
    with started_algorithm(config, host) as (context, algorithm):
        algorithm.begin()
        metrics = algorithm.step()
    assert metrics["optimizer_step"] == 1.0 and metrics["env/turns"] == 1.0
    assert metrics.get("env/failures", 0.0) == 0.0
    # the tiny model never writes '#### N' (gsm8k's rule would score 0): the rewards are the judge's
    assert metrics["reward/mean"] == 1.0
    assert len(judge.requests) >= 4 and {r["model"] for r in judge.requests} == {"judge-model"}
    assert all(r["messages"][0]["content"].split("REFERENCE ANSWER:\n")[1][0] in "0123456789" for r in judge.requests)
