"""The skyrl_gym environment: SkyRL's skyrl-gym environments (0.4.0) played through corerl's
contract as they are. skyrl-gym's own gsm8k and gsm8k_multi_turn run here offline; environments
registered in a test go through skyrl-gym's own registration API (what the adapter reads)."""

from __future__ import annotations

import json
import pickle

import pytest
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv

import corerl_skyrl_gym.plugin
from corerl.sdk import ConfigError, ConfigErrors, EnvironmentContext, EpisodeView
from corerl.testing import select_for, write_recipe
from corerl.testing.environment_conformance import EnvironmentConformance
from corerl_skyrl_gym.environment import Live, SkyRLGymEnvironment
from corerl_skyrl_gym.plugin import SkyRLGymSettings

RECIPE = {"policy": {"model_name": "builtin:tiny-qwen2"}, "data": {"env_name": "skyrl_gym"},
          "algorithm": {"max_rollout_turns": 4}}


def gsm8k_row(answer="42", env_class="gsm8k", **columns):
    """A row as SkyRL's gsm8k_dataset.py writes it (prompt messages, env_class, reward_spec, extra_info)."""
    return {"prompt": [{"role": "user", "content": "What is 40 + 2? Let's think step by step and output the final "
                                                     "answer after \"####\"."}],
            "env_class": env_class, "reward_spec": {"method": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": 0}, **columns}


def adapter(**settings):
    return SkyRLGymEnvironment(EnvironmentContext(SkyRLGymSettings(**settings), seed=0))


def play(environment, row, responses):
    """The episode's turns, each answered with the state of the one before."""
    turns, state = [], None
    for number in range(1, len(responses) + 1):
        turn = environment.step(EpisodeView(row=row, turn=number, responses=tuple(responses[:number]), state=state))
        turns.append(turn)
        state = turn.state
    return turns


@pytest.fixture
def registered():
    """skyrl-gym environments registered for one test (with skyrl_gym.register), removed after it."""
    ids = []

    def register(env_id, entry_point):
        skyrl_gym.register(id=env_id, entry_point=entry_point)
        ids.append(env_id)

    yield register
    for env_id in ids:
        skyrl_gym.envs.registration.deregister(env_id)


class Recorder(BaseTextEnv):
    """Keeps what make() gave it; done on its first turn."""

    made: list = []

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        Recorder.made.append((env_config, extras))

    def step(self, action):
        return {"observations": [], "reward": 0.5, "done": True, "metadata": {}}


class Rewriter(BaseTextEnv):
    """An init() that adds a message to the conversation (which corerl rendered already)."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()

    def init(self, prompt):
        return [*prompt, {"role": "user", "content": "and one more thing"}], {}

    def step(self, action):
        return {"observations": [], "reward": 0.0, "done": True, "metadata": {}}


def test_the_plugin_registers_the_environment_and_validates_its_section(corerl_host, tmp_path):
    if corerl_host.environments.get("skyrl_gym") is None:  # first-party: loaded when installed
        corerl_host.register(corerl_skyrl_gym.plugin, name="skyrl_gym")
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    config, selection = select_for(corerl_host, recipe, ["env.skyrl_gym.env_class=gsm8k_multi_turn",
                                                         "env.skyrl_gym.env_config.extra=1"])
    assert selection.environment.id == "skyrl_gym"
    section = config.section("env.skyrl_gym")
    assert (section.env_class, section.env_config, section.max_turns) == ("gsm8k_multi_turn", {"extra": 1}, None)
    with pytest.raises(ConfigErrors) as wrong:
        select_for(corerl_host, recipe, ["env.skyrl_gym.env_class=gsm8kk"])
    (error,) = wrong.value.errors
    assert error.key == "env.skyrl_gym.env_class" and "skyrl-gym has no environment 'gsm8kk'" in error.message
    assert "did you mean 'gsm8k'?" in error.hint


def test_gsm8k_scores_the_rows_answer_and_ends_after_one_turn():
    environment = adapter()
    (right,) = play(environment, gsm8k_row("42"), ["40 + 2 = 42\n#### 42"])
    (wrong,) = play(environment, gsm8k_row("42"), ["40 + 2 = 41\n#### 41"])
    (unformatted,) = play(environment, gsm8k_row("42"), ["the answer is 42"])
    assert [(t.reward, t.done) for t in (right, wrong, unformatted)] == [(1.0, True), (0.0, True), (0.0, True)]
    (other_row,) = play(environment, gsm8k_row("41"), ["40 + 2 = 41\n#### 41"])
    assert other_row.reward == 1.0  # the ground truth is the row's reward_spec, not the adapter's


def test_gsm8k_multi_turn_answers_each_turn_with_its_reward_and_a_user_message():
    environment = adapter()
    row = gsm8k_row("42", "gsm8k_multi_turn", extra_info={"max_turns": 3})
    first, second, third = play(environment, row, ["#### 41", "no number", "#### 42"])
    assert first.reward == pytest.approx(0.2 / 3) and not first.done  # its format score per turn (0.2 / max_turns)
    assert first.observation[0]["role"] == "user" and "#### ANSWER" in first.observation[0]["content"]
    assert (second.reward, second.done) == (0.0, False)
    assert second.observation == [{"role": "user", "content": "Now provide only the final numeric answer in the "
                                                              "exact format: '#### ANSWER'."}]  # its last turn
    assert (third.reward, third.done, third.observation) == (1.0, True, None)
    # the turn limit is the env's own (extra_info.max_turns), or env.skyrl_gym.max_turns given as extras['max_turns']
    assert [t.done for t in play(adapter(max_turns=2), row, ["#### 41", "#### 40"])] == [False, True]


def test_a_state_that_crossed_a_process_replays_the_episode_and_answers_the_same():
    environment = adapter()
    row = gsm8k_row("42", "gsm8k_multi_turn", extra_info={"max_turns": 4})
    responses = ("#### 41", "#### 40", "#### 39")
    live = play(environment, row, list(responses))
    first = environment.step(EpisodeView(row=row, turn=1, responses=responses[:1]))
    carried = pickle.loads(pickle.dumps(first.state))  # as a Ray actor's answer travels: the env object stays behind
    assert isinstance(carried, Live) and carried.env is None and carried.turns == 1
    second = environment.step(EpisodeView(row=row, turn=2, responses=responses[:2], state=carried))
    third = environment.step(EpisodeView(row=row, turn=3, responses=responses, state=second.state))
    assert [(t.reward, t.done, t.observation) for t in (first, second, third)] == [
        (t.reward, t.done, t.observation) for t in live]


def test_the_row_reaches_the_environment_as_skyrl_builds_its_extras(registered):
    registered("corerl_test_recorder", Recorder)
    Recorder.made.clear()
    environment = adapter(env_class="gsm8k", env_config={"db_path": "/data"}, max_turns=3)
    row = gsm8k_row("7", "corerl_test_recorder", db_id="shop", data="spider")
    (turn,) = play(environment, row, ["anything"])
    assert (turn.reward, turn.done) == (0.5, True)
    ((env_config, extras),) = Recorder.made
    # every column but prompt and env_class (the row's own env_class wins over env.skyrl_gym.env_class), and max_turns
    assert extras == {"reward_spec": {"method": "rule", "ground_truth": "7"}, "extra_info": {"split": "train", "index": 0},
                      "db_id": "shop", "data": "spider", "max_turns": 3}
    assert env_config.db_path == "/data"  # read by attribute, as SkyRL's environments read it


def test_what_corerl_cannot_play_ends_the_episode_in_one_line(registered):
    registered("corerl_test_rewriter", Rewriter)
    with pytest.raises(ValueError, match="changes the conversation in init") as rewrites:
        adapter(env_class="corerl_test_rewriter").step(EpisodeView(row=gsm8k_row(env_class=None), turn=1,
                                                                   responses=("x",)))
    assert "\n" not in str(rewrites.value)
    row = gsm8k_row()
    del row["reward_spec"]
    with pytest.raises(ValueError, match="refuses the row: reward_spec field is required"):
        adapter().step(EpisodeView(row=row, turn=1, responses=("#### 42",)))


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["env.skyrl_gym.env_class=searchcode"], "env.skyrl_gym.env_class", "'searchcode' runs the model's <python> tool "
                                                                         "calls in a plain Python process"),
    (["env.skyrl_gym.register.mine=nowhere_at_all:Env"], "env.skyrl_gym.register.mine", "cannot import 'nowhere_at_all'"),
], ids=["searchcode-unsandboxed", "register-import"])
def test_validation_refuses_an_environment_whose_needs_are_missing(corerl_host, tmp_path, overrides, key, says):
    recipe = write_recipe(tmp_path / "recipe.yaml", RECIPE)
    with pytest.raises(ConfigErrors) as refused:
        select_for(corerl_host, recipe, overrides)
    (error,) = refused.value.errors
    assert error.key == key and says in error.message and "\n" not in error.one_line()


MACHINE_NEEDS = [
    (["env.skyrl_gym.env_class=text2sql", "env.skyrl_gym.env_config.db_path=/nowhere"],
     "env.skyrl_gym.env_config.db_path", "'text2sql' needs its SQLite databases, and db_path /nowhere is not a folder"),
    (["env.skyrl_gym.env_class=search", "env.skyrl_gym.env_config.search_url=http://127.0.0.1:9/retrieve"],
     "env.skyrl_gym.env_config.search_url", "'search' needs a retrieval server, and http://127.0.0.1:9/retrieve does not"),
]


@pytest.mark.parametrize(("overrides", "key", "says"), MACHINE_NEEDS, ids=["text2sql-databases", "search-server"])
def test_what_an_environment_needs_from_the_machine_is_a_run_input(corerl_host, tmp_path, overrides, key, says):
    """A database folder or a server is checked with the run's model and data files (the
    registration's check_inputs): the recipe selects, the inputs check refuses in one line."""
    from corerl.run.inputs import check_run_inputs

    recipe = write_recipe(tmp_path / "recipe.yaml", {**RECIPE, "run": {"output_dir": str(tmp_path / "runs")}})
    config, selection = select_for(corerl_host, recipe, overrides)
    with pytest.raises(ConfigError) as refused:  # one error is raised as it is
        check_run_inputs(config, selection, corerl_host)
    error = refused.value
    assert error.key == key and says in error.message and "\n" not in error.one_line()


def test_validate_refuses_a_missing_database_and_recipe_only_judges_the_recipe_alone(capsys, tmp_path):
    from corerl import cli

    recipe = write_recipe(tmp_path / "recipe.yaml", {**RECIPE, "run": {"output_dir": str(tmp_path / "runs")}})
    overrides = MACHINE_NEEDS[0][0]
    assert cli.main(["validate", str(recipe), *overrides]) == 2
    assert "db_path /nowhere is not a folder" in capsys.readouterr().err
    assert cli.main(["validate", "--recipe-only", str(recipe), *overrides]) == 0
    database = tmp_path / "databases"
    database.mkdir()
    assert cli.main(["validate", str(recipe), "env.skyrl_gym.env_class=text2sql",
                     f"env.skyrl_gym.env_config.db_path={database}"]) == 0


def test_validation_reads_the_environment_classes_the_data_files_name(corerl_host, tmp_path):
    from corerl.run.inputs import check_run_inputs

    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [gsm8k_row(), {**gsm8k_row(), "env_class": "text2sql"}]
    pq.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "train.parquet")
    recipe = write_recipe(tmp_path / "recipe.yaml", {**RECIPE, "run": {"output_dir": str(tmp_path / "runs")}, "data": {
        "env_name": "skyrl_gym", "task": "dataset", "train_files": str(tmp_path / "train.parquet"),
        "answer_key": "reward_spec.ground_truth"}})
    config, selection = select_for(corerl_host, recipe, ["env.skyrl_gym.env_config.db_path=/nowhere"])
    with pytest.raises(ConfigError) as refused:
        check_run_inputs(config, selection, corerl_host)
    assert refused.value.key == "env.skyrl_gym.env_config.db_path"
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:1]))
    config, selection = select_for(corerl_host, recipe, [f"data.train_files={tmp_path / 'gsm8k.jsonl'}"])
    check_run_inputs(config, selection, corerl_host)  # gsm8k rows alone: nothing missing


class TestGsm8kConformance(EnvironmentConformance):
    """corerl's environment conformance suite on skyrl-gym's gsm8k: one turn, the row's answer scored."""

    environment_id = "skyrl_gym"
    plugin = corerl_skyrl_gym.plugin
    rows = [gsm8k_row("42"), gsm8k_row("7")]
    responses = ["so #### 42"]
    failing_rows = [{"prompt": [{"role": "user", "content": "no reward_spec"}], "env_class": "gsm8k"}]


class TestGsm8kMultiTurnConformance(EnvironmentConformance):
    """The suite on gsm8k_multi_turn: a wrong answer, a message asking again, then the right one."""

    environment_id = "skyrl_gym"
    plugin = corerl_skyrl_gym.plugin
    settings = {"env_class": "gsm8k_multi_turn"}
    rows = [gsm8k_row("42", None, extra_info={"max_turns": 3}), gsm8k_row("5", None, extra_info={"max_turns": 3})]
    failing_rows = [{"prompt": [], "extra_info": {}}]

    @classmethod
    def respond(cls, row, turn):
        return "#### 1" if turn == 1 else f"#### {row['reward_spec']['ground_truth']}"

    def test_turns_and_rewards_are_the_environments(self, played):
        for episode in played[0]:
            assert [(t.reward, t.done) for t in episode.turns()] == [(pytest.approx(0.2 / 3), False), (1.0, True)]


@pytest.mark.parametrize(("env_class", "turns"), [("gsm8k", 1.0), ("gsm8k_multi_turn", 2.0)])
def test_one_grpo_step_plays_skyrl_gym_episodes_on_a_tiny_model(tmp_path, env_class, turns):
    """End to end in this process: SkyRL-layout rows (chat-message prompts, env_class, reward_spec,
    extra_info) read by the dataset task, the tiny policy's turns answered by skyrl-gym's environment
    through the adapter, one GRPO step trained. The tiny model never writes '#### N', so gsm8k_multi_turn
    ends where the environment says (extra_info.max_turns 2, before corerl's limit of 3)."""
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    rows = [{"prompt": [{"role": "user", "content": f"w{i} w{i + 1} {i % 10} :"}], "env_class": env_class,
             "reward_spec": {"method": "rule", "ground_truth": str(i % 10)}, "answer": str(i % 10),
             "extra_info": {"split": "train", "index": i, "max_turns": 2}} for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 6},
                   "max_seq_length": 256},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 1,
                      "max_rollout_turns": 3},
        "data": {"task": "dataset", "train_files": str(data), "held_out_size": 2, "env_name": "skyrl_gym"},
        "env": {"skyrl_gym": {"env_class": "gsm8k"}},
        "run": {"output_dir": str(tmp_path), "name": "skyrl", "tensorboard": False},
    }
    host = PluginHost(env={})
    config = config_from_mapping(recipe, host)
    with started_algorithm(config, host) as (context, algorithm):
        algorithm.begin()
        metrics = algorithm.step()
    assert metrics["optimizer_step"] == 1.0
    assert metrics["env/turns"] == turns and metrics["env/stop/done"] == 1.0
    assert metrics.get("env/failures", 0.0) == 0.0


class Lookup(BaseTextEnv):
    """A tool environment in SkyRL-SQL's manner: each turn not done is answered with the tool's result as
    user messages (two on the second turn), done on the third; words the tiny tokenizer knows."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.turns = 0

    def step(self, action):
        self.turns += 1
        if self.turns >= 3:
            return {"observations": [], "reward": 1.0, "done": True, "metadata": {}}
        said = [" w5 w6 "] if self.turns == 1 else [" w7", " w8 "]
        return {"observations": [{"role": "user", "content": text} for text in said], "reward": 0.0, "done": False,
                "metadata": {}}


def test_without_the_conversation_format_observations_are_the_messages_text():
    """SkyRL's use_conversation_multi_turn=false: the observation is the messages' contents, joined as they are."""
    row = gsm8k_row("42", "gsm8k_multi_turn", extra_info={"max_turns": 3})
    messages = play(adapter(), row, ["#### 41", "no number"])
    text = play(adapter(conversation_format=False), row, ["#### 41", "no number"])
    assert [t.observation for t in text] == [m.observation[0]["content"] for m in messages]
    assert [(t.reward, t.done) for t in text] == [(m.reward, m.done) for m in messages]
    assert isinstance(text[0].observation, str) and "#### ANSWER" in text[0].observation


class Scripted:
    """The generation engine (not under test): each episode's turns are the words of ``turns``; a turn that ends
    at a stop string (SkyRL-SQL's </sql>) has no stop token after it, the last one has."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(self, prompts, sampling, n=1):
        from corerl.generation.contract import Sample

        words = self.turns[self.calls]
        self.calls += 1
        ids = tuple(self.tokenizer.encode(words, add_special_tokens=False))
        if self.calls == len(self.turns):
            ids += (self.tokenizer.eos_token_id,)
        return [[Sample(prompt_ids=tuple(p), completion_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason="stop")
                 for _ in range(n)] for p in prompts]


@pytest.mark.parametrize("conversation_format", [True, False])
def test_the_rollout_appends_text_observations_inside_the_response_and_masks_them(registered, conversation_format):
    """The episode's layout with and without the conversation format: the model's tokens as sampled (mask 1),
    the environment's between them (mask 0): the contents' own tokens without it (SkyRL's layout with
    use_conversation_multi_turn=false, where turns end at stop strings), the chat template's user turn around
    them with it."""
    from corerl.environments.encoding import ObservationEncoder
    from corerl.environments.pool import InProcessPool
    from corerl.environments.rollout import MultiTurnRollout
    from corerl.generation.contract import SamplingSettings
    from corerl.models.tiny import build_tokenizer

    registered("corerl_test_lookup", Lookup)
    tokenizer = build_tokenizer(128)
    tokenizer.chat_template = ("{% for m in messages %}<bos> {{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
                               "{% if add_generation_prompt %}<bos> assistant : {% endif %}")
    turns = ["w1 <sql> 3 </sql>", "w2 <sql> 4 </sql>", "<solution> 7 </solution>"]
    environment = adapter(env_class="corerl_test_lookup", conversation_format=conversation_format)
    rollout = MultiTurnRollout(Scripted(tokenizer, turns), InProcessPool(environment, 30), ObservationEncoder(tokenizer),
                               tokenizer, "skyrl_gym", max_turns=4)
    prompt = tokenizer.encode("w0 3 :", add_special_tokens=False)
    result = rollout.run([prompt], [gsm8k_row("7", None)], SamplingSettings(max_new_tokens=8), n=1,
                         max_seq_length=200)
    ((sample,),) = result.groups
    assert result.rewards == [[1.0]]
    said = [" w5 w6 ", " w7 w8 "] if not conversation_format else [
        " <bos> user :  w5 w6  <eos> <bos> assistant : ", " <bos> user :  w7 <eos> <bos> user :  w8  <eos> <bos> "
                                                         "assistant : "]
    model = [tokenizer.encode(t, add_special_tokens=False) for t in turns]
    model[-1].append(tokenizer.eos_token_id)
    environment_ids = [tokenizer.encode(text, add_special_tokens=False) for text in said]
    expected = [*model[0], *environment_ids[0], *model[1], *environment_ids[1], *model[2]]
    assert list(sample.completion_ids) == expected
    assert list(sample.completion_mask) == ([1] * len(model[0]) + [0] * len(environment_ids[0]) + [1] * len(model[1])
                                            + [0] * len(environment_ids[1]) + [1] * len(model[2]))
    between = tokenizer.decode(list(sample.completion_ids[len(model[0]):len(model[0]) + len(environment_ids[0])]))
    # without the conversation format, no template marker between the model's turns: one assistant message
    assert between == ("w5 w6" if not conversation_format else "<bos> <unk> : w5 w6 <eos> <bos> <unk> :")
