"""The multi-turn rollout stage against scripted environments, with the real hf generation
engine on a tiny model: masks, token-exactness, limits, faults, and a one-turn environment
reproducing the single-turn path."""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest

from corerl.environments.contract import EnvironmentContext, EpisodeView, Turn
from corerl.environments.encoding import ObservationEncoder
from corerl.environments.pool import InProcessPool
from corerl.environments.rollout import MultiTurnRollout, SingleTurnRollout
from corerl.environments.settings import ToolsSettings
from corerl.environments.tool_env import ToolsEnvironment
from corerl.environments.tools import ToolCall, execute, parse_hermes
from corerl.errors import RunError
from corerl.generation.contract import SamplingSettings
from corerl.models.tokenizer import load_tokenizer_folder
from corerl.testing.environment_conformance import EnvironmentConformance
from tests.environment_fixtures import hf_engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return hf_engine(tmp_path_factory.mktemp("model"))


class Recording:
    """The engine, called through; every sample it returned is kept (to compare ids exactly)."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.returned = engine, engine.tokenizer, []

    def generate(self, prompts, sampling, n=1):
        groups = self.engine.generate(prompts, sampling, n=n)
        self.returned.append(groups)
        return groups


class Scripted:
    """Answers each turn with ``observation`` until turn ``turns``, then done with reward 1 (0.25 per turn before)."""

    def __init__(self, turns=3, observation="w5 w6"):
        self.turns, self.observation = turns, observation

    def step(self, episode: EpisodeView) -> Turn:
        if episode.turn >= self.turns:
            return Turn(reward=1.0, done=True)
        return Turn(observation=self.observation, reward=0.25, state=(episode.state or 0) + 1)


SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=4, seed=3)


def _rollout(engine, environment, max_turns=None, share=1.0, timeout=30.0):
    tokenizer = engine.tokenizer
    return MultiTurnRollout(engine, InProcessPool(environment, timeout), ObservationEncoder(tokenizer), tokenizer,
                            "scripted", max_turns=max_turns, max_failure_share=share)


def _prompts(engine, count=2):
    ids = [engine.tokenizer.bos_token_id, *engine.tokenizer.encode("w0 3 :", add_special_tokens=False)]
    return [ids] * count, [{"answer": "3", "_corerl_origin": f"rows.jsonl line {i + 1}"} for i in range(count)]


def test_environment_tokens_are_masked_and_the_model_tokens_are_exactly_those_sampled(engine):
    recording = Recording(engine)
    rollout = _rollout(recording, Scripted(turns=3))
    prompts, rows = _prompts(engine)
    result = rollout.run(prompts, rows, SAMPLING, n=2, max_seq_length=200)
    observation = engine.tokenizer.encode("w5 w6", add_special_tokens=False)
    assert len(recording.returned) == 3  # one generate call per turn, all live episodes together
    turn_samples = [[s for g in groups for s in g] for groups in recording.returned]
    for index, sample in enumerate(s for group in result.groups for s in group):
        turns = [turn[index] for turn in turn_samples]
        expected_ids = [*turns[0].completion_ids, *observation, *turns[1].completion_ids, *observation,
                        *turns[2].completion_ids]
        assert list(sample.completion_ids) == expected_ids
        assert list(sample.completion_mask) == ([1] * len(turns[0].completion_ids) + [0] * len(observation)
                                                + [1] * len(turns[1].completion_ids) + [0] * len(observation)
                                                + [1] * len(turns[2].completion_ids))
        model_logprobs = [lp for lp, m in zip(sample.logprobs, sample.completion_mask, strict=True) if m]
        assert model_logprobs == [*turns[0].logprobs, *turns[1].logprobs, *turns[2].logprobs]
        # a later turn continues from the token ids, never from decoded text
        assert turns[1].prompt_ids == tuple(prompts[0]) + turns[0].completion_ids + tuple(observation)
    assert result.rewards == [[1.5, 1.5], [1.5, 1.5]]
    assert result.metrics["env/turns"] == 3.0 and result.metrics["env/stop/done"] == 1.0


def test_the_training_logprobs_of_a_multi_turn_batch_are_the_sampled_ones(engine, tmp_path):
    """The loss mask covers the model's tokens only, and the policy's logprobs of those tokens
    (a forward over the whole row, environment tokens in the context) equal the engine's."""
    import torch

    from corerl.algorithms.batches import samples_to_batch

    result = _rollout(engine, Scripted(turns=2)).run(*_prompts(engine), SAMPLING, n=2, max_seq_length=200)
    batch = samples_to_batch(result.groups, torch.zeros(4))
    model = engine.model
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logprobs = torch.zeros_like(batch["gen_logprobs"])
    logprobs[:, 1:] = logits[:, :-1].log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["loss_mask"].bool()
    assert int(mask.sum()) == sum(sum(s.completion_mask) for g in result.groups for s in g)
    assert torch.allclose(logprobs[mask], batch["gen_logprobs"][mask], atol=1e-4)


def test_a_one_turn_environment_gives_the_single_turn_path_sample_for_sample(engine):
    from corerl.tasks import decode_completion
    from corerl.tasks.rewards import exact_answer

    def reward(sample, row):
        return exact_answer(decode_completion(engine.tokenizer, sample), row)

    class OneTurn:
        def step(self, episode):
            return Turn(reward=exact_answer(episode.response, episode.row), done=True)

    prompts, rows = _prompts(engine, 3)
    single = SingleTurnRollout(engine, reward).run(prompts, rows, SAMPLING, 4, 64)
    multi = _rollout(engine, OneTurn()).run(prompts, rows, SAMPLING, 4, 64)
    assert multi.rewards == single.rewards
    for one, other in zip(multi.groups, single.groups, strict=True):
        for a, b in zip(one, other, strict=True):
            assert (a.prompt_ids, a.completion_ids, a.logprobs) == (b.prompt_ids, b.completion_ids, b.logprobs)
            assert set(a.completion_mask) <= {1}


def test_turn_and_token_limits_end_episodes_with_their_reason(engine):
    prompts, rows = _prompts(engine)
    capped = _rollout(engine, Scripted(turns=10), max_turns=2).run(prompts, rows, SAMPLING, 2, 200)
    assert capped.metrics["env/stop/max_turns"] == 1.0 and capped.metrics["env/turns"] == 2.0
    assert capped.rewards == [[0.5, 0.5], [0.5, 0.5]]  # the reward of the turns played
    short = _rollout(engine, Scripted(turns=10)).run(prompts, rows, SAMPLING, 2, 16)
    assert short.metrics["env/stop/max_tokens"] == 1.0
    assert all(len(s.prompt_ids) + len(s.completion_ids) <= 16 for g in short.groups for s in g)


class Paced(Scripted):
    """Scripted; with ``hold_slow``, the first step of each row whose ``slow`` is set does not
    return until every other episode has returned its last step (turn 3), or, should those wait
    for it, until the hang guard lets it go. It notes the order in which the steps returned."""

    def __init__(self, hold_slow=False, hang_guard_s=20.0):
        super().__init__(turns=3)
        self.hold_slow, self.hang_guard_s, self.returned = hold_slow, hang_guard_s, []
        self.fast_finished = 0
        self.released: asyncio.Event | None = None

    async def step(self, episode: EpisodeView) -> Turn:
        if self.released is None:
            self.released = asyncio.Event()  # on the pool's loop, where every step runs
        slow = episode.row["slow"]
        if slow and self.hold_slow and episode.turn == 1:
            try:  # a guard against a hang only: the order below decides the test
                await asyncio.wait_for(self.released.wait(), self.hang_guard_s)
            except TimeoutError:
                pass
        self.returned.append((slow, episode.row["id"], episode.turn))
        if not slow and episode.turn == 3:
            self.fast_finished += 1
            if self.fast_finished == 3:
                self.released.set()
        return super().step(episode)


def test_episodes_never_wait_for_each_other_and_sample_the_same_whoever_shares_their_round(engine):
    prompts, _ = _prompts(engine, 4)
    rows = [{"slow": i == 0, "id": i} for i in range(4)]
    # the slow episode's first step is held until the three others have ended: by the order of the
    # returns, not by clocks (a rollout that plays in lockstep would hold them behind it)
    paced = Paced(hold_slow=True)
    result = _rollout(engine, paced).run(prompts, rows, SAMPLING, 1, 200)
    order = [(slow, turn) for slow, _, turn in paced.returned]
    assert order.index((True, 1)) == len([o for o in order if not o[0]]) == 9, order  # all 9 fast steps first
    assert result.metrics["time/generation_rounds"] >= 4  # the slow episode's turns went on alone
    assert result.rewards == [[1.5]] * 4
    # the same episodes with every step at one pace play in lockstep (3 rounds), and sample the same tokens
    even = _rollout(engine, Paced()).run(prompts, rows, SAMPLING, 1, 200)
    assert even.metrics["time/generation_rounds"] == 3.0
    for paced_group, even_group in zip(result.groups, even.groups, strict=True):
        assert paced_group[0].completion_ids == even_group[0].completion_ids
        assert paced_group[0].logprobs == pytest.approx(even_group[0].logprobs, abs=1e-5)


class Faulty:
    """Raises on row 1, hangs on row 2 (async), answers nonsense on row 3, plays fair on row 0."""

    async def step(self, episode):
        kind = episode.row["kind"]
        if kind == "raise":
            raise ValueError("the sandbox is gone")
        if kind == "hang":
            await asyncio.sleep(30)
        if kind == "nonsense":
            return {"reward": 1}
        return Turn(reward=1.0, done=True)


def test_environment_faults_stay_inside_their_episode(engine):
    prompts, _ = _prompts(engine, 4)
    rows = [{"kind": k} for k in ("fair", "raise", "hang", "nonsense")]
    # the hanging row's step would return a fair Turn after 30 s: its reward 0 and the timeout count
    # say the 0.5 s timeout cut it off (no clock is read)
    result = _rollout(engine, Faulty(), timeout=0.5).run(prompts, rows, SAMPLING, 1, 64)
    assert result.rewards == [[1.0], [0.0], [0.0], [0.0]]
    assert result.metrics["env/failures"] == 3.0 and result.metrics["env/timeouts"] == 1.0
    assert result.metrics["env/stop/env_error"] == result.metrics["env/stop/env_malformed"] == 0.25


def test_too_many_failures_stop_the_run_in_one_line_naming_the_environment_and_row(engine):
    prompts, _ = _prompts(engine, 2)
    rows = [{"kind": "raise", "_corerl_origin": "rows.jsonl line 7"}, {"kind": "fair"}]
    with pytest.raises(RunError) as caught:
        _rollout(engine, Faulty(), share=0.25).run(prompts, rows, SAMPLING, 1, 64)
    text = str(caught.value)
    assert "\n" not in text.strip()
    assert "environment 'scripted'" in text and "rows.jsonl line 7" in text and "the sandbox is gone" in text
    assert caught.value.key == "env.scripted"


def test_the_hermes_parser_reads_calls_and_says_what_is_wrong_with_bad_ones():
    text = ('I will look. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call><tool_call>{oops</tool_call>')
    calls = parse_hermes(text)
    assert calls[:2] == [ToolCall(name="add", arguments={"a": 1, "b": 2}), ToolCall(name="add", arguments={"a": 3, "b": 4})]
    assert calls[2].error and "not JSON" in calls[2].error
    assert parse_hermes("no calls here") == []

    def add(a: int, b: int) -> int:
        return a + b

    assert execute(calls[0], {"add": add}).content == "3"
    assert execute(ToolCall(name="add", arguments={"a": 1}), {"add": add}).failed
    assert "no tool named 'sub'" in execute(ToolCall(name="sub"), {"add": add}).content


def test_the_tools_environment_executes_calls_with_the_row_and_scores_the_answer():
    from corerl.plugin_manager import PluginHost

    host = PluginHost(discover=False, env={})
    context = EnvironmentContext(ToolsSettings(tools=["lookup"]), 0, tools={t.id: t for t in host.tools},
                                 tool_parsers={p.id: p for p in host.tool_parsers})
    environment = ToolsEnvironment(context)
    row = {"value": 4, "answer": "4"}
    call = '<tool_call> {"name": "lookup", "arguments": {}} </tool_call>'
    turn = environment.step(EpisodeView(row=row, turn=1, responses=(call,)))
    assert turn.observation == [{"role": "tool", "content": "4"}] and not turn.done and turn.tool_calls == 1
    bad = environment.step(EpisodeView(row=row, turn=1, responses=('<tool_call> {"name": "peek"} </tool_call>',)))
    assert bad.tool_failures == 1 and "no tool named 'peek'" in bad.observation[0]["content"]
    final = environment.step(EpisodeView(row=row, turn=2, responses=(call, "4")))
    assert final.done and final.reward == 1.0


def _lookup_tools(**settings):
    """The tools environment offering the built-in ``lookup`` tool, with ``settings`` (latencies)."""
    from corerl.plugin_manager import PluginHost

    host = PluginHost(discover=False, env={})
    return ToolsEnvironment(EnvironmentContext(ToolsSettings(tools=["lookup"], **settings), 0,
                                               tools={t.id: t for t in host.tools},
                                               tool_parsers={p.id: p for p in host.tool_parsers}))


def test_tool_call_latency_delays_each_turn_with_calls_and_the_episodes_wait_together():
    """``env.tools.call_latency_s``: a turn with calls answers that late, a final answer at once;
    96 episodes (three times the in-process pool's threads) wait together, not in waves."""
    environment = _lookup_tools(call_latency_s=0.3)
    assert inspect.iscoroutinefunction(environment.step)
    pool = InProcessPool(environment, timeout_s=30)
    call = LOOKUP_CALL
    try:
        start = time.perf_counter()
        answers = pool.answer([EpisodeView(row={"value": i % 10, "answer": str(i % 10)}, turn=1, responses=(call,))
                               for i in range(96)])
        took = time.perf_counter() - start
        assert [a.turn.observation for a in answers] == [[{"role": "tool", "content": str(i % 10)}] for i in range(96)]
        assert 0.3 <= took < 0.6  # one latency for all (in waves of the pool's 32 threads: 0.9 s or more)
        start = time.perf_counter()
        final = pool.answer([EpisodeView(row={"value": 4, "answer": "4"}, turn=2, responses=(call, "4"))])[0].turn
        assert final.done and final.reward == 1.0 and time.perf_counter() - start < 0.3
    finally:
        pool.shutdown()
    assert not inspect.iscoroutinefunction(_lookup_tools().step)  # no latency: the plain step, as before


def test_check_latency_delays_each_final_answer_and_leaves_tool_turns_alone():
    """``env.tools.check_latency_s``: a final answer's reward comes that late (the episodes wait
    together), a turn with calls answers at once when ``call_latency_s`` is 0."""
    environment = _lookup_tools(check_latency_s=0.3)
    assert inspect.iscoroutinefunction(environment.step)
    pool = InProcessPool(environment, timeout_s=30)
    call = LOOKUP_CALL
    try:
        start = time.perf_counter()
        finals = pool.answer([EpisodeView(row={"value": i % 10, "answer": "4"}, turn=2, responses=(call, "4"))
                              for i in range(64)])
        took = time.perf_counter() - start
        assert [(a.turn.done, a.turn.reward) for a in finals] == [(True, 1.0)] * 64
        assert 0.3 <= took < 0.6  # one latency for all
        start = time.perf_counter()
        turn = pool.answer([EpisodeView(row={"value": 7, "answer": "7"}, turn=1, responses=(call,))])[0].turn
        assert turn.observation == [{"role": "tool", "content": "7"}] and time.perf_counter() - start < 0.3
    finally:
        pool.shutdown()


def test_chat_messages_continue_the_conversation_as_the_template_renders_it(tmp_path):
    from corerl.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(128)
    tokenizer.chat_template = ("{% for m in messages %}<bos> {{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
                               "{% if add_generation_prompt %}<bos> assistant : {% endif %}")
    encoder = ObservationEncoder(tokenizer)
    whole = tokenizer.apply_chat_template([{"role": "user", "content": "3"}, {"role": "assistant", "content": "4"},
                                           {"role": "tool", "content": "7"}], tokenize=False, add_generation_prompt=True)
    upto_answer = whole[: whole.index("4 <eos>") + len("4 <eos>")]
    continuation = whole[len(upto_answer):]
    assert encoder.text_of([{"role": "tool", "content": "7"}]) == continuation == " <bos> tool : 7 <eos> <bos> assistant : "
    # a turn cut by length gets the template's end of turn first
    assert encoder.text_of([{"role": "tool", "content": "7"}], ended_with_stop=False) == " <eos>" + continuation
    assert encoder.encode([{"role": "tool", "content": "7"}]) == tokenizer.encode(continuation, add_special_tokens=False)
    plain = ObservationEncoder(load_tokenizer_folder_for_test(tmp_path))
    assert plain.text_of([{"role": "tool", "content": "7"}]) == "<tool_response> 7 </tool_response>"


def load_tokenizer_folder_for_test(tmp_path):
    from corerl.models.tiny import build_tokenizer

    build_tokenizer(128).save_pretrained(tmp_path / "tok")
    tokenizer = load_tokenizer_folder(tmp_path / "tok")
    assert tokenizer.tokenize("<tool_call> w1 7 :") == ["<tool_call>", "w1", "7", ":"]  # the words, as saved
    return tokenizer


def _recipe(tmp_path, **changes):
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 16},
                   "max_seq_length": 64},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 1,
                      "max_rollout_turns": 3},
        "data": {"task": "tool_lookup", "env_name": "tools"},
        "env": {"tools": {"tools": ["lookup"]}},
        "run": {"output_dir": str(tmp_path), "name": "env", "tensorboard": False},
    }
    for path, value in changes.items():
        node = recipe
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return recipe


def _refusal(tmp_path, **changes):
    from corerl.config import config_from_mapping
    from corerl.config.selection import select
    from corerl.errors import ConfigError, ConfigErrors
    from corerl.plugin_manager import PluginHost

    host = PluginHost(env={})
    with pytest.raises((ConfigErrors, ConfigError)) as caught:
        select(config_from_mapping(_recipe(tmp_path, **changes), host), host)
    errors = getattr(caught.value, "errors", [caught.value])
    return [(e.key, e.message) for e in errors]


def test_validation_refuses_what_an_environment_run_could_not_do(tmp_path):
    assert _refusal(tmp_path, **{"algorithm.name": "dpo", "data.task": "digit_preference"}) == [
        ("data.env_name", "algorithm 'dpo' plays no environment episodes, and data.env_name names 'tools'")]
    [(key, message)] = _refusal(tmp_path, **{"env.tools.tools": ["lookup", "peek"]})
    assert key == "env.tools.tools[1]" and "no tool 'peek' is registered" in message
    [(key, message)] = _refusal(tmp_path, **{"data.env_name": "chess"})
    assert key == "data.env_name" and "environment 'chess' is not available" in message
    [(key, message)] = _refusal(tmp_path, **{"env.tools.num_wrkers": 2})
    assert key == "env.tools.num_wrkers" and message == "unknown key"
    [(key, _)] = _refusal(tmp_path, **{"env.math.math_verify_impl": "sympy"})
    assert key == "env.math.math_verify_impl"
    [(key, message)] = _refusal(tmp_path, **{"data.env_name": "openai_agent"})
    assert key == "env.openai_agent.agent" and "got None" in message
    [(key, message)] = _refusal(tmp_path, **{"data.env_name": "openai_agent", "env.openai_agent.agent": "os:system"})
    assert key == "env.openai_agent.agent" and "os" in message
    [(key, message)] = _refusal(tmp_path, **{"data.env_name": "openai_agent", "env.openai_agent.agent": "nowhere:play"})
    assert key == "env.openai_agent.agent" and "cannot import agent module 'nowhere'" in message


@pytest.mark.parametrize("model", ["builtin:tiny-qwen2", "builtin:tiny-moe"], ids=["dense", "moe"])
def test_one_grpo_step_plays_tool_episodes_in_process(tmp_path, model):
    """Multi-turn tool episodes, on a dense policy and on a mixture of experts."""
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    host = PluginHost(env={})
    config = config_from_mapping(_recipe(tmp_path, **{"policy.model_name": model}), host)
    with started_algorithm(config, host) as (context, algorithm):
        assert 0.0 <= algorithm.held_out()["reward"] <= 1.0
        algorithm.begin()
        metrics = algorithm.step()
    assert metrics["optimizer_step"] == 1.0
    assert 1.0 <= metrics["env/turns"] <= 3.0
    assert sum(metrics[f"env/stop/{r}"] for r in ("done", "max_turns", "max_tokens")) == pytest.approx(1.0)


def test_the_math_environment_verifies_answers_with_math_verify():
    from corerl.environments.math_env import MathEnvironment
    from corerl.environments.settings import MathSettings

    environment = MathEnvironment(EnvironmentContext(MathSettings(), 0))
    assert environment.step(EpisodeView(row={"answer": "\\frac{1}{2}"}, turn=1, responses=("so \\boxed{0.5}",))).reward == 1.0
    assert environment.step(EpisodeView(row={"answer": "7"}, turn=1, responses=("I think 8",))).reward == 0.0
    turn = environment.step(EpisodeView(row={"answer": "12"}, turn=1, responses=("3 * 4 = 12",)))
    assert turn.done and turn.reward == 1.0


def test_the_math_environment_reads_a_dotted_answer_key_in_a_struct_column():
    """SkyRL's rows keep the gold answer at reward_spec.ground_truth (data.answer_key)."""
    import types

    from corerl.environments.math_env import MathEnvironment
    from corerl.environments.settings import MathSettings

    data = types.SimpleNamespace(answer_key="reward_spec.ground_truth")
    environment = MathEnvironment(EnvironmentContext(MathSettings(), 0, data=data))
    row = {"reward_spec": {"method": "rule", "ground_truth": "44"}, "answer": "0"}
    assert environment.step(EpisodeView(row=row, turn=1, responses=("8 + 36 = 44",))).reward == 1.0
    assert environment.step(EpisodeView(row=row, turn=1, responses=("it is 0",))).reward == 0.0


def test_nemo_rl_environment_keys_act_in_the_built_config(tmp_path):
    from corerl.config import load_config
    from corerl.errors import ConfigErrors
    from corerl.plugin_manager import PluginHost
    from tests.conftest import REPO

    host = PluginHost(env={})
    recipe = REPO / "tests" / "data" / "nemo_rl" / "base_grpo.yaml"
    config = load_config(recipe, ["grpo.max_rollout_turns=1", "env.math.num_workers=2",
                                  "env.math.math_verify_impl=hf_math_verify", "data.default.env_name=math"], host)
    assert config.dialect == "nemo-rl"
    assert config.core.data.env_name == "math" and config.core.algorithm.max_rollout_turns == 1
    assert config.section("env.math").num_workers == 2 and config.section("env.math").math_verify_impl == "hf_math_verify"
    fates = {f.key: f for f in config.fates}
    assert fates["data.default.env_name"].fate == "acts" and fates["grpo.max_rollout_turns"].fate == "acts"
    with pytest.raises(ConfigErrors) as gym:
        load_config(recipe, ["data.default.env_name=nemo_gym"], host)
    (error,) = gym.value.errors
    assert error.key == "data.default.env_name" and "NeMo Gym environments run as NeMo Gym's own" in error.message
    with pytest.raises(ConfigErrors) as section:
        load_config(recipe, ["env.nemo_gym.config_paths=[a.yaml]"], host)
    assert [e.key for e in section.value.errors] == ["env.nemo_gym.config_paths"]
    assert "no bridge to them yet" in section.value.errors[0].message
    gym_keys = ["config_paths=[a.yaml]", "port_range_low=1000", "port_range_high=2000", "uv_venv_dir=/tmp/gym"]
    with pytest.raises(ConfigErrors) as whole:  # a Gym section's dozens of keys: one line for the section
        load_config(recipe, [f"env.nemo_gym.{key}" for key in gym_keys], host)
    (error,) = whole.value.errors
    assert error.key == "env.nemo_gym" and "no bridge to them yet" in error.message, error
    assert "(4 keys under it: config_paths, port_range_low, port_range_high, ...)" in error.message, error
    assert error.keys == [f"env.nemo_gym.{key.split('=')[0]}" for key in gym_keys]  # all of them, for tools
    assert error.one_line().startswith("env.nemo_gym: NeMo Gym") and "; remove the section" in error.one_line()
    with pytest.raises(ConfigErrors) as turns:  # several turns with nothing to answer them
        load_config(recipe, ["grpo.max_rollout_turns=4"], host)
    assert [e.key for e in turns.value.errors] == ["algorithm.max_rollout_turns"]


def test_one_ppo_step_plays_tool_episodes(tmp_path):
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    host = PluginHost(env={})
    config = config_from_mapping(_recipe(tmp_path, **{"algorithm.name": "ppo"}), host)
    with started_algorithm(config, host) as (context, algorithm):
        algorithm.begin()
        metrics = algorithm.step()
    assert metrics["optimizer_step"] == 1.0 and "critic/value_loss" in metrics
    assert 1.0 <= metrics["env/turns"] <= 3.0 and metrics["env/episodes"] == 4.0


def test_grpo_with_a_one_turn_environment_trains_exactly_as_the_single_turn_path(tmp_path):
    """Three GRPO steps from the same weights, once scored by the reward function and once by a
    one-turn environment computing the same reward: every metric (timings and the environment's
    own aside) is equal."""
    from corerl.algorithms.grpo import GRPO
    from corerl.config import load_config
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe

    model = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, vocab_size=128))
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": model, "train_micro_batch_size": 16, "max_seq_length": 32,
                   "optimizer": {"lr": 3e-3}, "generation": {"backend": "hf", "max_new_tokens": 6}},
        "algorithm": {"batch_size": 4, "num_generations_per_prompt": 4, "seed": 3}})
    host = PluginHost(env={})
    config = load_config(recipe, [], host)

    def target_share(text):
        words = text.split()
        return sum(w == "7" for w in words) / max(1, len(words))

    class OneTurn:
        def step(self, episode):
            return Turn(reward=target_share(episode.response), done=True)

    def run(with_environment):
        training = host.training_backends.get("dtensor").create(config=config)
        generation = host.generation_backends.get("hf").create(config=config)
        training.load_hf(model)
        generation.load_hf(model)
        tokenizer = generation.tokenizer

        def reward(sample, item):
            return target_share(tokenizer.decode(list(sample.completion_ids), skip_special_tokens=True))

        rollout = None
        if with_environment:
            rollout = MultiTurnRollout(generation, InProcessPool(OneTurn(), 30), ObservationEncoder(tokenizer), tokenizer,
                                       "one_turn")
        loop = GRPO(config, training, generation, reward, rollout=rollout)
        prompts = [[2, *tokenizer.encode(f"w0 {d} :", add_special_tokens=False)] for d in (1, 2, 3, 4)]
        try:
            return [{k: v for k, v in loop.step(prompts, [None] * 4).items()
                     if not k.startswith(("time/", "refit/", "env/", "encoding/"))} for _ in range(3)]
        finally:
            training.shutdown()
            generation.shutdown()

    single, multi = run(False), run(True)
    assert single == multi
    assert single[-1]["optimizer_step"] == 3.0 and single[0]["reward/mean"] != single[-1]["reward/mean"]


def test_a_step_past_its_timeout_is_a_fault_and_its_thread_cannot_keep_the_process_alive():
    """The in-process pool abandons a hung step on a daemon thread: the interpreter does not wait
    for it at exit (a ThreadPoolExecutor's worker would be joined, keeping a failed run alive)."""
    import threading

    from corerl.environments.contract import EnvironmentSettings
    from tests.environment_fixtures import Crashy

    pool = InProcessPool(Crashy(EnvironmentContext(EnvironmentSettings(timeout_s=0.2), 0)), timeout_s=0.2)
    answers = pool.answer([EpisodeView(row={"kind": "hang"}, turn=1, responses=("x",)),
                           EpisodeView(row={"kind": "ok"}, turn=1, responses=("x",))])
    assert answers[0].fault == "env_timeout" and answers[1].turn is not None
    hung = [t for t in threading.enumerate() if t.name == "corerl-env" and t.is_alive()]
    assert hung and all(t.daemon for t in hung)
    pool.shutdown()


def test_the_daemon_executor_runs_every_call_on_at_most_its_threads():
    import threading

    from corerl.environments.daemon_threads import DaemonThreadExecutor

    executor = DaemonThreadExecutor(3, "corerl-test")
    release = threading.Event()
    blocked = [executor.submit(release.wait, 5) for _ in range(3)]  # three workers busy
    queued = [executor.submit(lambda i=i: i * i) for i in range(20)]  # wait for a free worker
    assert len(executor.threads) == 3 and not any(f.done() for f in queued)
    release.set()
    assert [f.result(timeout=5) for f in queued] == [i * i for i in range(20)] and all(f.result() for f in blocked)
    assert len(executor.threads) == 3 and all(t.daemon for t in executor.threads)
    failing = executor.submit(int, "not a number")
    assert isinstance(failing.exception(timeout=5), ValueError)
    executor.shutdown(cancel_futures=True)


# -- the environment conformance suite (corerl.testing.environment_conformance) on the core's
# environments, and what it catches ----------------------------------------------------------

LOOKUP_CALL = '<tool_call> {"name": "lookup", "arguments": {}} </tool_call>'


class TestToolsEnvironmentConformance(EnvironmentConformance):
    """``tools``: the model calls ``lookup``, reads the digit and answers it."""

    environment_id = "tools"
    settings = {"tools": ["lookup"]}
    recipe = {"data": {"task": "tool_lookup"}}
    rows = [{"value": 4, "answer": "4"}, {"value": 7, "answer": "7"}, {"value": 1, "answer": "1"}]
    failing_rows = [{"value": 2}]  # no answer to score the final turn against

    @classmethod
    def respond(cls, row, turn):
        return LOOKUP_CALL if turn == 1 else str(row.get("value"))


class TestSlowToolsEnvironmentConformance(TestToolsEnvironmentConformance):
    """``tools`` with ``call_latency_s``: its step is a coroutine, and conforms as the plain one does."""

    settings = {"tools": ["lookup"], "call_latency_s": 0.05}


class TestMathEnvironmentConformance(EnvironmentConformance):
    environment_id = "math"
    rows = [{"answer": "\\frac{1}{2}"}, {"answer": "12"}]
    responses = ["so \\boxed{0.5}"]
    failing_rows = [{"question": "no answer column"}]


class Forgetful:
    """Remembers the episode's guesses on itself: wrong as soon as two episodes interleave."""

    def __init__(self, context):
        self.guesses = 0

    def step(self, episode):
        self.guesses += 1
        return Turn(reward=float(self.guesses >= 2), done=self.guesses >= 2, observation=" again")


class Wordy:
    def __init__(self, context):
        pass

    def step(self, episode):
        if "answer" not in episode.row:
            return Turn(reward=0.0, done=True)  # hides the bad row
        return Turn(reward="1", done=True)


class Endless:
    def __init__(self, context):
        pass

    def step(self, episode):
        return Turn(observation=[{"role": "tool"}], reward=0.0)


class Blocking:
    def __init__(self, context):
        pass

    async def step(self, episode):
        time.sleep(0.3)  # a blocking call inside async def: the loop cannot time it out
        return Turn(reward=1.0, done=True)


def _case(factory, **attributes):
    from corerl.registry import Environment
    from corerl.testing import plugin_from

    name = factory.__name__.lower()
    plugin = plugin_from(environments=[Environment(id=name, factory=factory)])
    return type("Case", (EnvironmentConformance,), {"environment_id": name, "plugin": plugin, **attributes})


def _failure(case, check, tmp_path):
    built = case._build(tmp_path)
    arguments = {"built": built, "played": case._play_both_ways(built)}
    method = getattr(case(), check)
    wanted = {name: arguments[name] for name in method.__code__.co_varnames[1:method.__code__.co_argcount]}
    with pytest.raises((AssertionError, pytest.fail.Exception)) as failed:
        method(**wanted)
    return str(failed.value).splitlines()[0]


@pytest.mark.parametrize("factory, attributes, check, says", [
    (Forgetful, {"rows": [{"answer": "1"}, {"answer": "2"}]}, "test_state_is_kept_per_episode",
     "went otherwise when other episodes' turns were answered in between"),
    (Wordy, {}, "test_rewards_are_numbers", "has reward '1' (str)"),
    (Wordy, {"failing_rows": [{}]}, "test_errors_are_reported_as_the_episodes_faults",
     "ended by done, with no error"),
    (Endless, {}, "test_episodes_end", "did not end within 4 turns"),
    (Endless, {}, "test_observations_encode", "is not a chat message"),
    (Blocking, {}, "test_timeouts_are_reported_without_waiting_for_the_step",
     "the async def step made blocking calls on the event loop (time.sleep): the timeout could not fire"),
])
def test_the_environment_suite_names_what_an_environment_gets_wrong(tmp_path, factory, attributes, check, says):
    line = _failure(_case(factory, **attributes), check, tmp_path)
    assert says in line, line


class Prompt:
    """Answers at once (a plain step)."""

    def __init__(self, context):
        pass

    def step(self, episode):
        return Turn(reward=1.0, done=True)


class PromptAsync:
    """Answers at once (an ``async def`` step that gives the loop back)."""

    def __init__(self, context):
        pass

    async def step(self, episode):
        await asyncio.sleep(0)
        return Turn(reward=1.0, done=True)


@pytest.mark.parametrize("factory", [Prompt, PromptAsync])
def test_the_environment_suite_sees_a_real_timeout_and_fails_a_pool_that_does_not_enforce_it(tmp_path, monkeypatch,
                                                                                               factory):
    """Check (f) holds each step past the timeout itself: a correct environment passes it, and the
    same environment fails it once the pool's timeout is taken away (the hang guard, shortened
    here, lets the held steps go: their Turns come back instead of env_timeout)."""
    import corerl.environments.pool as pool_module

    case = _case(factory, hang_guard_s=0.5)
    built = case._build(tmp_path)
    case().test_timeouts_are_reported_without_waiting_for_the_step(built)  # passes as it is

    async def unbounded(function, *args, executor, timeout_s):
        if inspect.iscoroutinefunction(function):
            return await function(*args)
        return await asyncio.get_running_loop().run_in_executor(executor, function, *args)

    monkeypatch.setattr(pool_module, "bounded_call", unbounded)
    with pytest.raises(AssertionError) as failed:
        case().test_timeouts_are_reported_without_waiting_for_the_step(built)
    assert "held past the 0.05 s timeout was answered Answer(turn=Turn(" in str(failed.value), failed.value
    assert "the timeout could not fire" in str(failed.value)


@pytest.mark.parametrize("response, gold, parts", [
    ("<think>2 and 2</think>\n<answer>4</answer>", "4", {"correctness": 1.0, "integer": 1.0, "format": 1.0}),
    ("<think>hm</think>\n<answer> 5 </answer>", "4", {"correctness": 0.0, "integer": 1.0, "format": 1.0}),
    ("<answer>four</answer>", "4", {"correctness": 0.0, "integer": 0.0, "format": 0.0}),
    ("<think>x</think>\n<answer>4</answer><answer>4</answer>", "4", {"correctness": 1.0, "integer": 1.0, "format": 0.0}),
    ("the answer is 4", "4", {"correctness": 0.0, "integer": 0.0, "format": 0.0}),
])
def test_math_multi_reward_names_three_parts_of_the_reward(response, gold, parts):
    """NeMo RL's math_multi_reward (GDPO's environment): correctness, an integer answer and the
    think/answer format, each 0 or 1, as the turn's reward_components; the reward is their sum."""
    from corerl.environments.contract import EnvironmentContext, EpisodeView
    from corerl.environments.math_multi_reward import MathMultiRewardEnvironment
    from corerl.plugin_manager import PluginHost

    assert "math_multi_reward" in PluginHost(env={}).environments
    environment = MathMultiRewardEnvironment(EnvironmentContext(None, 0))
    turn = environment.step(EpisodeView(row={"answer": gold}, turn=1, responses=(response,)))
    assert dict(turn.reward_components) == parts and turn.reward == sum(parts.values()) and turn.done


def test_a_rollouts_reward_parts_cover_every_named_part_and_a_failed_episode_scores_none():
    """``Rollout.components``: each episode's parts, a part an episode lacks as 0, and 0 for an
    episode a fault ended (its reward is 0 too); None where no episode names any."""
    from corerl.environments.rollout import PlayedEpisode, reward_components

    def episode(parts, stop="done"):
        played = PlayedEpisode(prompt=[1], row={}, where="row 0")
        played.components, played.stop = parts, stop
        return played

    groups = [[episode({"a": 1.0, "b": 2.0}), episode({"a": 0.5})], [episode({"b": 1.0}, stop="env_timeout")]]
    assert reward_components(groups) == [[{"a": 1.0, "b": 2.0}, {"a": 0.5, "b": 0.0}], [{"a": 0.0, "b": 0.0}]]
    assert reward_components([[episode(None), episode(None)]]) is None
