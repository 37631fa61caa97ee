"""Step-wise trajectories (``algorithm.step_wise_trajectories``, SkyRL's
``generator.step_wise_trajectories``): each turn of an episode trains as a row of its own, the
conversation as the chat template renders it at that turn followed by the turn's tokens, every row
with its episode's advantage; a template that does not render a conversation as an extension of
its start is played as it renders, where the one-sequence form refuses it."""

from __future__ import annotations

import pytest
import torch

from corerl.algorithms.batches import samples_to_batch, step_minibatches, step_rows
from corerl.algorithms.grpo_math import advantages_for
from corerl.environments.contract import EpisodeView, Turn
from corerl.environments.encoding import ObservationEncoder
from corerl.environments.pool import InProcessPool
from corerl.environments.rollout import MultiTurnRollout, StepWiseSample, step_wise
from corerl.errors import ConfigError, PluginError, RunError
from corerl.generation.contract import SamplingSettings
from tests.environment_fixtures import hf_engine

# roles as words the tiny vocabulary has: user "?", assistant "=", tool "+"
_MARKS = "{% set mark = {'user': '?', 'assistant': '=', 'tool': '+'} %}"
EXTENDING = (_MARKS + "{% for m in messages %}<bos> {{ mark[m['role']] }} {{ m['content'] }} <eos> {% endfor %}"
             "{% if add_generation_prompt %}<bos> = {% endif %}")
# like Qwen3's, which drops the <think> blocks of the turns before the latest user message: this one
# drops the whole content of those turns, so an earlier turn reads differently once a user speaks
DROPPING = (_MARKS + "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
            "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
            "{% for m in messages %}<bos> {{ mark[m['role']] }} "
            "{% if m['role'] == 'assistant' and loop.index0 < ns.last %}{% else %}{{ m['content'] }} {% endif %}"
            "<eos> {% endfor %}{% if add_generation_prompt %}<bos> = {% endif %}")
# and, like Qwen3's with thinking off, a generation prompt that ends with a cue ("." for its empty
# <think></think>) that an earlier turn, rendered later, does not keep
DROPPING_WITH_CUE = DROPPING.replace("{% if add_generation_prompt %}<bos> = {% endif %}",
                                     "{% if add_generation_prompt %}<bos> = . {% endif %}")

QUESTION = "w0 3 :"
OBSERVATION = [{"role": "user", "content": "w5 w6 ?"}]
SAMPLING = SamplingSettings(temperature=1.0, max_new_tokens=4, seed=3)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return hf_engine(tmp_path_factory.mktemp("model"))


class Recording:
    """The engine, called through: every prompt it was given and every sample it returned."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.prompts, self.returned = engine, engine.tokenizer, [], []

    def generate(self, prompts, sampling, n=1):
        groups = self.engine.generate(prompts, sampling, n=n)
        self.prompts.append([list(p) for p in prompts])
        self.returned.append(groups)
        return groups


class TwoTurns:
    """Turn 1: a user message back (reward 0.25); turn 2: done, rewarded by what the answer says."""

    def step(self, episode: EpisodeView) -> Turn:
        if episode.turn == 1:
            return Turn(observation=OBSERVATION, reward=0.25)
        return Turn(reward=judged(episode.response), done=True)


def judged(text):
    return sum(map(ord, text)) % 7 / 7


def _render(tokenizer, messages):
    return list(tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                                 add_special_tokens=False))


def _with_template(engine, template):
    engine.tokenizer.chat_template = template
    return engine


def _play(engine, template, step_wise_on, n=2, share=1.0):
    engine = _with_template(engine, template)
    tokenizer = engine.tokenizer
    recording = Recording(engine)
    rollout = MultiTurnRollout(recording, InProcessPool(TwoTurns(), 30), ObservationEncoder(tokenizer), tokenizer,
                               "two_turns", max_failure_share=share, step_wise=step_wise_on)
    prompt = _render(tokenizer, [{"role": "user", "content": QUESTION}])
    result = rollout.run([prompt, prompt], [{"row": 0}, {"row": 1}], SAMPLING, n=n, max_seq_length=200)
    return result, recording, prompt


@pytest.mark.parametrize("template", [DROPPING, DROPPING_WITH_CUE], ids=["dropping", "dropping_with_cue"])
def test_step_wise_rows_are_each_turns_rendered_conversation_and_sampled_tokens(engine, template):
    result, recording, prompt = _play(engine, template, True)
    tokenizer = engine.tokenizer
    assert len(recording.returned) == 2  # turn 1 for every episode, then turn 2 together
    first = [s for group in recording.returned[0] for s in group]
    second = [s for group in recording.returned[1] for s in group]
    episodes = [s for group in result.groups for s in group]
    dropped = 0
    for index, episode in enumerate(episodes):
        assert isinstance(episode, StepWiseSample) and len(episode.steps) == 2
        one, two = episode.steps
        # row 1: the task's prompt and the turn's tokens, exactly as sampled
        assert (one.prompt_ids, one.completion_ids, one.logprobs) == (tuple(prompt), first[index].completion_ids,
                                                                       first[index].logprobs)
        # row 2: the conversation as the template renders it now, rendered here independently ...
        said = tokenizer.decode(list(one.completion_ids), skip_special_tokens=True)
        expected = _render(tokenizer, [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": said},
                                       *OBSERVATION])
        assert list(two.prompt_ids) == expected
        # ... which is the prompt the model was given for turn 2, and its tokens are those sampled
        assert recording.prompts[1][index] == expected
        assert (two.completion_ids, two.logprobs) == (second[index].completion_ids, second[index].logprobs)
        assert two.completion_mask is None and set(one.completion_ids) <= set(range(tokenizer.vocab_size))
        # the episode's own sample is its last row
        assert (episode.prompt_ids, episode.completion_ids) == (two.prompt_ids, two.completion_ids)
        if said:  # the template dropped the earlier turn: no single sequence holds both rows
            dropped += 1
            assert list(two.prompt_ids[: len(prompt) + len(one.completion_ids)]) != [*prompt, *one.completion_ids]
    assert dropped  # the tiny model said something in at least one episode
    assert result.metrics["env/stop/done"] == 1.0
    assert result.rewards == [[0.25 + judged(tokenizer.decode(list(e.steps[1].completion_ids), skip_special_tokens=True))
                               for e in group] for group in result.groups]


def test_a_template_that_drops_earlier_turns_is_refused_as_one_sequence_and_plays_step_wise(engine):
    with pytest.raises(RunError, match="does not render a conversation as an extension of its start"):
        _play(engine, DROPPING, False, share=0.5)
    result, _, _ = _play(engine, DROPPING, True, share=0.5)
    assert result.metrics["env/failures"] == 0.0 and result.metrics["env/turns"] == 2.0


def test_every_row_of_an_episode_takes_the_advantage_of_the_episode_within_its_group(engine):
    result, _, _ = _play(engine, DROPPING, True, n=3)
    rewards = torch.tensor(result.rewards)
    advantages = advantages_for("grpo", rewards, scale_by_std=True, leave_one_out=False, minus_baseline=True,
                                normalise=True)
    assert advantages.shape == (2, 3)  # the group is the prompt's episodes, not its rows
    rows, row_advantages, counts = step_rows(result.groups, advantages)
    assert counts == [2] * 6 and [len(g) for g in rows] == [6, 6]
    batch = samples_to_batch(rows, row_advantages)
    flat = advantages.reshape(-1)
    for row in range(12):
        episode = row // 2
        tokens = batch["loss_mask"][row].bool()
        step = result.groups[episode // 3][episode % 3].steps[row % 2]
        assert int(tokens.sum()) == len(step.completion_ids)
        assert torch.all(batch["advantages"][row][tokens] == flat[episode])
    assert torch.any(flat != 0)
    # one optimizer step per 3 episodes: the rows of episodes 0-2, then 3-5
    parts = step_minibatches(batch, counts, 3)
    assert [int(p["input_ids"].shape[0]) for p in parts] == [6, 6]
    with pytest.raises(PluginError, match="4 episodes per optimizer step do not divide the step's 6 episodes"):
        step_minibatches(batch, counts, 4)


def test_with_a_template_that_extends_the_rows_are_the_one_sequence_cut_at_each_turn(engine):
    """Where the prefix holds, the step-wise rows sample the same tokens from the same contexts as
    the one sequence, so token_mean over the rows averages the very terms the one sequence does."""
    stepped, _, _ = _play(engine, EXTENDING, True)
    whole, _, _ = _play(engine, EXTENDING, False)
    assert stepped.rewards == whole.rewards
    for rows_episode, episode in zip([s for g in stepped.groups for s in g], [s for g in whole.groups for s in g],
                                     strict=True):
        sequence = [*episode.prompt_ids, *episode.completion_ids]
        for row in rows_episode.steps:
            start = len(row.prompt_ids)
            assert sequence[: start + len(row.completion_ids)] == [*row.prompt_ids, *row.completion_ids]
    advantages = torch.tensor([[1.0, -1.0], [0.5, -0.5]])
    rows, row_advantages, _ = step_rows(stepped.groups, advantages)
    one, other = samples_to_batch(rows, row_advantages), samples_to_batch(whole.groups, advantages)

    def token_mean(batch):
        mask = batch["loss_mask"].bool()
        return float((batch["gen_logprobs"] * batch["advantages"])[mask].sum() / mask.sum())

    assert int(one["loss_mask"].sum()) == int(other["loss_mask"].sum())
    assert token_mean(one) == pytest.approx(token_mean(other), abs=1e-6)


def test_an_episode_left_out_by_overlong_filtering_leaves_all_its_rows_out(engine):
    import attrs

    result, _, _ = _play(engine, DROPPING, True)
    first = result.groups[0][0]
    masked = attrs.evolve(first, completion_mask=(0,) * len(first.completion_ids))
    rows, _, counts = step_rows([[masked, *result.groups[0][1:]]], torch.zeros(2))
    assert counts == [2, 2]
    assert all(sum(r.completion_mask) == 0 for r in rows[0][:2]) and rows[0][2].completion_mask is None


def test_one_grpo_step_trains_on_step_wise_rows(engine, tmp_path):
    from corerl.algorithms.grpo import GRPO
    from corerl.config import load_config
    from corerl.models.tiny import build_tiny_model
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe

    model = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, vocab_size=128))
    recipe = write_recipe(tmp_path / "r.yaml", {
        "policy": {"model_name": model, "train_micro_batch_size": 8, "max_seq_length": 64,
                   "optimizer": {"lr": 3e-3}, "generation": {"backend": "hf", "max_new_tokens": 4}},
        "algorithm": {"batch_size": 2, "num_generations_per_prompt": 2, "seed": 3, "optimizer_batch_size": 2,
                      "step_wise_trajectories": True}})
    host = PluginHost(env={})
    config = load_config(recipe, [], host)
    training = host.training_backends.get("dtensor").create(config=config)
    generation = host.generation_backends.get("hf").create(config=config)
    try:
        training.load_hf(model)
        generation.load_hf(model)
        tokenizer = generation.tokenizer
        tokenizer.chat_template = DROPPING
        rollout = MultiTurnRollout(generation, InProcessPool(TwoTurns(), 30), ObservationEncoder(tokenizer),
                                   tokenizer, "two_turns", max_failure_share=0.0)
        loop = GRPO(config, training, generation, lambda sample, item: 0.0, rollout=step_wise(rollout),
                    optimizer_batch_size=config.core.algorithm.optimizer_batch_size)
        seen = []
        train_step = training.train_step
        training.train_step = lambda batch, loss: seen.append(batch) or train_step(batch, loss)
        prompt = _render(tokenizer, [{"role": "user", "content": QUESTION}])
        metrics = loop.step([prompt, prompt], [{"row": 0}, {"row": 1}])
    finally:
        training.shutdown()
        generation.shutdown()
    # 4 episodes of 2 turns: 8 rows, cut into 2 optimizer steps of 2 episodes each
    assert metrics["step_wise/rows"] == 8.0 and metrics["optimizer_step"] == 2.0
    assert [int(b["input_ids"].shape[0]) for b in seen] == [4, 4]
    assert metrics["env/failures"] == 0.0 and metrics["generated_tokens"] > 0 and metrics["grad_norm"] > 0
    # the two turns of an episode share its advantage, and an episode's reward varies within its group
    for batch in seen:
        per_row = batch["advantages"][:, 0]
        assert torch.equal(per_row[0::2], per_row[1::2])


def test_step_wise_is_refused_where_it_would_not_act(tmp_path):
    from corerl.algorithms.step_wise import check_step_wise
    from corerl.config import config_from_mapping
    from corerl.environments.agent import AgentRollout
    from corerl.plugin_manager import PluginHost

    host = PluginHost(discover=False, env={})

    def config(**algorithm):
        return config_from_mapping({"policy": {"model_name": "builtin:tiny-qwen2"},
                                    "algorithm": {"step_wise_trajectories": True, **algorithm}}, host)

    check_step_wise(config())
    with pytest.raises(ConfigError, match="built into GRPO only, not 'ppo'") as caught:
        check_step_wise(config(name="ppo"))
    assert caught.value.key == "algorithm.step_wise_trajectories"
    with pytest.raises(ConfigError, match="turns as rows of their own") as caught:
        check_step_wise(config(use_kl_in_reward=True, kl_penalty=0.1))
    assert caught.value.key == "algorithm.use_kl_in_reward"
    agent = AgentRollout.__new__(AgentRollout)
    with pytest.raises(ConfigError, match="not into AgentRollout"):
        step_wise(agent)


def test_validate_refuses_step_wise_where_it_would_not_act(capsys):
    """The validation table's row: ``corerl validate`` refuses as the run would, whatever the algorithm."""
    from corerl import cli

    for overrides, says in ((["algorithm.name=ppo"], "built into GRPO only, not 'ppo'"),
                            (["algorithm.name=distillation"], "built into GRPO only, not 'distillation'"),
                            (["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=0.1"], "turns as rows of their own")):
        assert cli.main(["validate", "--recipe-only", "algorithm.step_wise_trajectories=true", *overrides]) == 2
        err = capsys.readouterr().err
        assert says in err and err.strip().count("\n") == 0, err


def _validate(capsys, tmp_path, *overrides):
    from corerl.cli import main

    launch = tmp_path / "run.sh"
    launch.write_text("#!/bin/bash\npython -m skyrl.train.entrypoints.main_base \\\n  "
                      + " \\\n  ".join(["trainer.policy.model.path=Qwen/Qwen3-4B", *overrides]) + "\n")
    code = main(["validate", "--recipe-only", str(launch)])
    return code, capsys.readouterr().err


def test_skyrls_step_wise_keys_act(capsys, tmp_path):
    from corerl.config.dialects.skyrl.translate import translate
    from corerl.config.tree import value_at

    keys = {"generator.step_wise_trajectories": True, "generator.merge_stepwise_output": True}
    tree = {"generator": {"step_wise_trajectories": True, "merge_stepwise_output": True}}
    result = translate(tree, {key: "run.sh:1" for key in keys}, False, None, "main_base")
    assert value_at(result.tree, "algorithm.step_wise_trajectories") is True
    assert value_at(result.tree, "algorithm.step_wise_merge") is True
    assert _validate(capsys, tmp_path, "generator.step_wise_trajectories=true",
                     "generator.merge_stepwise_output=true")[0] == 0


def test_merging_gives_the_one_sequence_where_the_prefix_holds_and_a_row_per_break_where_it_does_not(engine):
    from corerl.algorithms.batches import merged_steps

    stepped, _, _ = _play(engine, EXTENDING, True)
    whole, _, _ = _play(engine, EXTENDING, False)
    for episode, sequence in zip([s for g in stepped.groups for s in g], [s for g in whole.groups for s in g],
                                 strict=True):
        (row,) = merged_steps(episode.steps)
        assert (row.prompt_ids, row.completion_ids, row.logprobs, tuple(row.completion_mask)) == (
            sequence.prompt_ids, sequence.completion_ids, sequence.logprobs, tuple(sequence.completion_mask))
    dropping, _, _ = _play(engine, DROPPING, True)
    breaks = 0
    for episode in (s for g in dropping.groups for s in g):
        one, two = episode.steps
        holds = two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == one.prompt_ids + one.completion_ids
        assert [(r.prompt_ids, r.completion_ids) for r in merged_steps(episode.steps)] == (
            [(one.prompt_ids, one.completion_ids + two.prompt_ids[len(one.prompt_ids) + len(one.completion_ids):]
              + two.completion_ids)] if holds else [(one.prompt_ids, one.completion_ids),
                                                    (two.prompt_ids, two.completion_ids)])
        breaks += not holds
    assert breaks
    rows, advantages, counts = step_rows(dropping.groups, torch.tensor([[1.0, 2.0], [3.0, 4.0]]), merge=True)
    assert sum(counts) == sum(len(g) for g in rows) == 8 - (4 - breaks)
    assert advantages.tolist() == [a for a, c in zip([1.0, 2.0, 3.0, 4.0], counts, strict=True) for _ in range(c)]


def test_the_grpo_algorithm_plays_a_run_s_environment_step_wise(tmp_path):
    """``algorithm.step_wise_trajectories`` in a recipe reaches the run's rollout: the tools
    environment's episodes train as one row per turn."""
    from corerl.config import config_from_mapping
    from corerl.plugin_manager import PluginHost
    from corerl.testing.algorithm_conformance import started_algorithm

    recipe = {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": "builtin:tiny-qwen2", "generation": {"backend": "hf", "max_new_tokens": 8},
                   "max_seq_length": 64},
        "algorithm": {"name": "grpo", "batch_size": 2, "num_generations_per_prompt": 2, "max_steps": 1,
                      "max_rollout_turns": 3, "step_wise_trajectories": True},
        "data": {"task": "tool_lookup", "env_name": "tools"},
        "env": {"tools": {"tools": ["lookup"]}},
        "run": {"output_dir": str(tmp_path), "name": "env", "tensorboard": False},
    }
    host = PluginHost(env={})
    config = config_from_mapping(recipe, host)
    with started_algorithm(config, host) as (context, algorithm):
        algorithm.begin()
        assert context.training_rollout().step_wise
        metrics = algorithm.step()
    assert metrics["optimizer_step"] == 1.0
    assert metrics["step_wise/rows"] == metrics["env/turns"] * metrics["env/episodes"]
