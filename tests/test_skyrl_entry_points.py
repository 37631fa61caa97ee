"""What SkyRL's example entry points add, done by corerl (issue 75): the ``reinforce`` policy loss
(custom_policy_loss), the ``batch_mean`` advantage estimator (custom_advantage_estimator's
simple_baseline), MaxRL's estimator (``maxrl``), SFT's perplexity (sft_with_callbacks), each
against a computation written out here; and the entry points' ``implies``."""

from __future__ import annotations

import math
import types

import pytest
import torch

from corerl.algorithms.grpo_math import (
    GRPOLoss,
    advantages_for,
    batch_mean_advantages,
    maxrl_advantages,
)
from corerl.config.dialects.skyrl import entry_points


def _leaf(rows):
    return torch.tensor(rows, dtype=torch.float64, requires_grad=True)


# --- the reinforce policy loss ----------------------------------------------------------------


def test_reinforce_is_minus_the_advantage_times_the_logprob_summed_over_loss_tokens():
    logp = [[-1.0, -2.0, -0.5], [-0.3, -4.0, -9.0]]
    adv = [[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5]]
    mask = [[1, 1, 1], [1, 1, 0]]
    logprobs = _leaf(logp)
    batch = {"old_logprobs": torch.tensor(logp, dtype=torch.float64) - 0.7,  # far from the policy: no effect
             "advantages": torch.tensor(adv, dtype=torch.float64), "loss_mask": torch.tensor(mask)}
    loss, metrics = GRPOLoss(policy_loss="reinforce")(logprobs, batch, 5.0)
    want = 0.0
    for row in range(2):
        for col in range(3):
            if mask[row][col]:
                want += -adv[row][col] * logp[row][col]
    assert loss.item() == pytest.approx(want / 5.0, rel=1e-12)
    loss.backward()
    grad = [[-adv[r][c] * mask[r][c] / 5.0 for c in range(3)] for r in range(2)]
    assert torch.allclose(logprobs.grad, torch.tensor(grad, dtype=torch.float64))
    assert float(metrics["clip_fraction"]) == 0.0  # nothing is clipped


def test_reinforce_ignores_the_ratio_where_the_clipped_loss_would_cut():
    # r = exp(1.0) is far outside the clip range: the clipped loss gives the token no gradient, reinforce does
    logprobs = _leaf([[0.0]])
    batch = {"old_logprobs": torch.tensor([[-1.0]], dtype=torch.float64),
             "advantages": torch.tensor([[2.0]], dtype=torch.float64), "loss_mask": torch.tensor([[1]])}
    GRPOLoss(policy_loss="reinforce")(logprobs, batch, 1.0)[0].backward()
    assert logprobs.grad.item() == pytest.approx(-2.0)
    clipped = _leaf([[0.0]])
    GRPOLoss()(clipped, batch, 1.0)[0].backward()
    assert clipped.grad.item() == 0.0


def test_reinforce_validates_and_refuses_the_clipped_loss_options():
    from corerl.algorithms.checks import check_policy_loss
    from corerl.config.schema import AlgorithmConfig
    from corerl.errors import ConfigError

    algorithm = AlgorithmConfig(policy_loss="reinforce")
    check_policy_loss(algorithm)
    assert GRPOLoss.from_config(algorithm).policy_loss == "reinforce"
    for bad, key in ((AlgorithmConfig(policy_loss="reinforce", use_cispo=True), "algorithm.use_cispo"),
                     (AlgorithmConfig(policy_loss="reinforce", sequence_level_ratios=True),
                      "algorithm.sequence_level_ratios")):
        with pytest.raises(ConfigError) as caught:
            check_policy_loss(bad)
        assert caught.value.key == key


# --- the maxrl and batch_mean advantage estimators ------------------------------------------


def _maxrl_by_hand(groups, eps=1e-6):
    out = []
    for group in groups:
        if len(group) == 1:
            out.append(list(group))
            continue
        mean = sum(group) / len(group)
        out.append([(r - mean) / (mean + eps) for r in group])
    return out


def test_maxrl_divides_by_the_groups_mean_reward():
    groups = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.4, 0.5]]
    got = maxrl_advantages(torch.tensor(groups, dtype=torch.float64))
    assert torch.allclose(got, torch.tensor(_maxrl_by_hand(groups), dtype=torch.float64))
    # binary rewards: a correct answer to a prompt solved with probability p gets (1 - p) / p
    assert got[0, 0].item() == pytest.approx(3.0, rel=1e-5) and got[1, 0].item() == pytest.approx(1 / 3, rel=1e-5)
    assert torch.equal(got[2], torch.zeros(4, dtype=torch.float64))  # nothing solved: no signal
    # the same group under GRPO is scaled by its std instead
    assert not torch.allclose(advantages_for("grpo", torch.tensor(groups)), got.float())


def test_maxrl_leaves_a_group_of_one_its_reward():
    got = maxrl_advantages(torch.tensor([[0.5], [1.0]]))
    assert got.tolist() == [[0.5], [1.0]]


def test_batch_mean_subtracts_one_mean_over_the_whole_step():
    groups = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.5]]
    flat = [r for group in groups for r in group]
    mean = sum(flat) / len(flat)
    want = [[r - mean for r in group] for group in groups]
    got = batch_mean_advantages(torch.tensor(groups, dtype=torch.float64))
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64))
    # a group whose rewards are equal still moves (its baseline is the batch's, not its own)
    assert got[1].tolist() == pytest.approx([1.0 - mean] * 2)
    assert torch.allclose(advantages_for("batch_mean", torch.tensor(groups)), got.float())


def test_an_unknown_estimator_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        advantages_for("nope", torch.zeros(1, 2))


class _Scoring:
    """A training engine that records the batches it trains on (what is under test is the loop's
    advantages, not training)."""

    def __init__(self) -> None:
        self.trained = []

    def logprobs(self, batch):
        return torch.zeros(batch["input_ids"].shape)

    def train_step(self, batch, loss):
        from corerl.training.contract import StepResult

        self.trained.append(batch)
        return StepResult(loss=0.0, grad_norm=0.0, lr=0.1, tokens=int(batch["loss_mask"].sum()), step=1)


@pytest.mark.parametrize("estimator", ["maxrl", "batch_mean"])
def test_the_grpo_loop_trains_on_the_chosen_estimators_advantages(estimator):
    from corerl.algorithms.grpo import GRPO
    from corerl.environments.rollout import Rollout
    from corerl.generation.contract import Sample

    def sample(tokens: int) -> Sample:
        return Sample(prompt_ids=(1, 2), completion_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                      finish_reason="stop")

    policy = _Scoring()
    loop = GRPO(types.SimpleNamespace(), policy, None, lambda sample, item: 0.0, advantage_estimator=estimator,
                hand_over=lambda: None)
    rewards = [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    loop.learn(Rollout([[sample(2), sample(1), sample(3)], [sample(1), sample(2), sample(2)]], rewards), {})
    (batch,) = policy.trained
    flat = [r for group in rewards for r in group]
    if estimator == "maxrl":
        want = [a for group in _maxrl_by_hand(rewards) for a in group]
    else:
        want = [r - sum(flat) / len(flat) for r in flat]
    mask = batch["loss_mask"].bool()
    for row, advantage in enumerate(want):  # every loss token of a sample carries its advantage
        assert torch.allclose(batch["advantages"][row][mask[row]], torch.tensor(advantage), atol=1e-5)


def test_the_new_estimators_validate_and_refuse_a_leave_one_out_baseline():
    from corerl.algorithms.checks import check_policy_loss
    from corerl.config.schema import AlgorithmConfig
    from corerl.errors import ConfigError

    for estimator in ("maxrl", "batch_mean"):
        check_policy_loss(AlgorithmConfig(advantage_estimator=estimator))
        with pytest.raises(ConfigError) as caught:
            check_policy_loss(AlgorithmConfig(advantage_estimator=estimator, leave_one_out_baseline=True))
        assert caught.value.key == "algorithm.leave_one_out_baseline"
        # the KL in the reward: each sample's summed KL taken from its reward before the estimator
        check_policy_loss(AlgorithmConfig(advantage_estimator=estimator, use_kl_in_reward=True, kl_penalty=0.1))


# --- SFT's perplexity (sft_with_callbacks' PerplexityLogger) ---------------------------------


class _Scored:
    """A training engine whose model gives each token a fixed probability: it computes the loss it is
    given on those logprobs (training itself is not under test)."""

    def __init__(self, probabilities) -> None:
        self.probabilities = probabilities

    def train_step(self, batch, loss):
        from corerl.training.contract import StepResult

        mask = batch["loss_mask"]
        logprobs = torch.zeros(mask.shape, dtype=torch.float64)
        logprobs[mask.bool()] = torch.log(torch.tensor(self.probabilities, dtype=torch.float64))
        value, metrics = loss(logprobs, batch, float(mask.sum()))
        return StepResult(loss=float(value), grad_norm=0.0, lr=0.1, tokens=int(mask.sum()), step=1, metrics=metrics)


def test_sft_logs_the_perplexity_of_the_steps_response_tokens():
    from corerl.algorithms.sft import SFT

    pairs = [((1, 2), (3, 4)), ((5,), (6, 7, 8))]  # five response tokens
    probabilities = [0.5, 0.25, 0.1, 0.8, 0.5]
    metrics = SFT(_Scored(probabilities)).step(pairs)
    # perplexity: the inverse geometric mean of the probabilities the model gave the tokens
    assert metrics["perplexity"] == pytest.approx(math.prod(probabilities) ** (-1 / len(probabilities)), rel=1e-9)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]), rel=1e-12)


def test_perplexity_caps_the_loss_and_keeps_nan():
    from corerl.algorithms.sft import perplexity

    assert perplexity(0.0) == 1.0 and perplexity(1000.0) == pytest.approx(math.exp(20.0))
    assert math.isnan(perplexity(float("nan")))


# --- the entry points' records ------------------------------------------------------------------


def test_a_registered_name_acts_only_where_the_key_selects_it():
    key = "trainer.algorithm.policy_loss_type"
    assert entry_points.registered("custom_policy_loss", key, "reinforce") == (("algorithm.policy_loss", "reinforce"),)
    assert entry_points.registered("custom_policy_loss", key, "regular") is None  # the module only adds a name
    assert entry_points.registered("main_base", key, "reinforce") is None  # SkyRL's own entry point has no reinforce
    assert entry_points.registered("nope", key, "reinforce") is None
    estimator = "trainer.algorithm.advantage_estimator"
    assert entry_points.registered("custom_advantage_estimator", estimator, "simple_baseline") == (
        ("algorithm.advantage_estimator", "batch_mean"),)


def test_what_the_entry_points_stand_for_is_valid_corerl_settings():
    from corerl.algorithms.checks import check_policy_loss
    from corerl.config.schema import AlgorithmConfig
    from corerl.config.structure import StructureContext, structure

    for entry in entry_points.ENTRY_POINTS:
        assert not (entry.adds and (entry.implies or entry.registers)), entry.id
        for item in entry.registers:
            fields = {target.removeprefix("algorithm."): value for target, value in item.settings}
            context = StructureContext(origins={}, owned_sections={})
            algorithm = structure(AlgorithmConfig, fields, "algorithm", context)
            assert context.errors == [], (entry.id, context.errors)  # a value the schema lacks is an error here
            check_policy_loss(algorithm)
    context = StructureContext(origins={}, owned_sections={})
    structure(AlgorithmConfig, {"policy_loss": "unheard_of"}, "algorithm", context)
    assert context.errors  # (the check above can fail)
    (target, value), = entry_points.by_id("multiply").implies
    module, _, name = value.partition(":")
    assert target == "env.skyrl_gym.register.multiply"
    pytest.importorskip("skyrl_gym")
    import importlib

    assert getattr(importlib.import_module(module), name).__name__ == name


def test_the_callbacks_example_is_sft_and_refused_no_more():
    entry = entry_points.by_id("sft_with_callbacks")
    assert entry.family == "sft" and entry.adds is None


#: SkyRL's corpus (its examples' launch scripts): CORERL_SKYRL_CORPUS, else the copy beside this checkout
def _corpus():
    import os
    from pathlib import Path

    from tests.conftest import REPO

    return Path(os.environ.get("CORERL_SKYRL_CORPUS") or REPO.parent / "shared" / "skyrl")


def _load(script: str):
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.plugin_manager import PluginHost

    path = _corpus() / script
    if not path.is_file():
        pytest.skip(f"SkyRL's corpus is not at {_corpus()} (set CORERL_SKYRL_CORPUS)")
    host = PluginHost()
    config = load_config(str(path), [], host, [], "skyrl", environ={"HOME": "/home/someone", "PATH": "/usr/bin"})
    select(config, host)
    return config


def test_the_multiply_example_plays_corerl_skyrl_gyms_multiply():
    pytest.importorskip("corerl_skyrl_gym")
    config = _load("examples/train/multiply/run_multiply.sh")
    gym = config.section("env.skyrl_gym")
    assert gym.register == {"multiply": "corerl_skyrl_gym.multiply:MultiplyEnv"} and gym.env_class == "multiply"
    assert config.core.data.env_name == "skyrl_gym"


def test_the_callbacks_example_runs_corerls_sft():
    config = _load("examples/train/callbacks/run_sft_with_callbacks.sh")
    assert config.core.algorithm.name == "sft"


def test_the_full_context_example_runs_corerls_full_context_memory_check():
    config = _load("examples/train_scripts/full_context/run_full_ctx.sh")
    data = config.core.data
    assert data.full_context is True and data.env_name is None
    assert config.core.policy.generation.ignore_eos is True
    assert config.core.algorithm.max_steps == 5  # trainer.num_dummy_steps
