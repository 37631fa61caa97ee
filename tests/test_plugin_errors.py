"""Errors in the right voice: an SDK function given arguments it does not take says so in one
line naming the plugin and the function (``PluginError``), while the same mistake in corerl's own
code stays an internal error; a support check's refusal is ``ConfigErrors`` with the origin of
its key, as schema errors are."""

from __future__ import annotations

import pytest
import torch

from corerl import Algorithm, Environment
from corerl.algorithms.batches import minibatches, samples_to_batch, step_seed
from corerl.environments.contract import Turn
from corerl.environments.pool import InProcessPool, malformed_turn
from corerl.environments.tools import ToolCall, execute, parse_hermes
from corerl.errors import (
    EXIT_FAILURE,
    ConfigError,
    ConfigErrors,
    CorerlError,
    PluginError,
    plugin_of_module,
)
from corerl.generation.contract import Sample
from corerl.plugin_manager import PluginHost
from corerl.testing import plugin_from, select_for
from tests.conftest import EXAMPLES

SAMPLE = Sample(prompt_ids=(2, 21), completion_ids=(7, 3), logprobs=(-0.1, -0.2), finish_reason="stop")


def called_from(module: str, function, *args, **kwargs):
    """``function(*args, **kwargs)`` called by code whose module is ``module`` (a plugin's, or corerl's)."""
    namespace = {"__name__": module, "function": function, "args": args, "kwargs": kwargs}
    exec(compile("def call():\n    return function(*args, **kwargs)\n", f"<{module}>", "exec"), namespace)
    return namespace["call"]()


def test_a_plugin_passing_a_list_of_advantages_gets_one_line_naming_it_and_the_function():
    with pytest.raises(PluginError) as caught:
        called_from("corerl_reinforce.algorithm", samples_to_batch, [[SAMPLE, SAMPLE]], [1.0, -1.0])
    error = caught.value
    assert isinstance(error, CorerlError) and error.exit_code == EXIT_FAILURE
    assert (error.plugin, error.function) == ("corerl_reinforce", "samples_to_batch")
    assert error.one_line().startswith("plugin 'corerl_reinforce': samples_to_batch: advantages must be a "
                                       "torch.Tensor with one value per sample (2), got list; build it with torch.tensor(")


def test_through_the_sdk_the_plugin_is_still_the_caller():
    from corerl import sdk

    with pytest.raises(PluginError, match=r"^plugin 'corerl_guess': samples_to_batch: advantages holds 3 values"):
        called_from("corerl_guess.plugin", sdk.samples_to_batch, [[SAMPLE, SAMPLE]], torch.zeros(3))
    with pytest.raises(PluginError, match=r"^plugin 'corerl_guess': step_seed: step must be an integer, got Tensor"):
        called_from("corerl_guess.plugin", sdk.step_seed, 3, torch.tensor(2))


def test_the_same_mistake_in_corerls_own_code_is_an_internal_error():
    with pytest.raises(TypeError, match=r"^samples_to_batch: advantages must be a torch.Tensor") as caught:
        called_from("corerl.algorithms.grpo", samples_to_batch, [[SAMPLE]], [1.0])
    assert not isinstance(caught.value, CorerlError)


def test_samples_to_batch_minibatches_and_step_seed_check_what_they_are_given():
    plugin = "corerl_x.steps"
    cases = [
        ((samples_to_batch, SAMPLE, torch.zeros(1)), "samples_to_batch: groups must be a list of groups"),
        ((samples_to_batch, [SAMPLE], torch.zeros(1)), "samples_to_batch: groups[0] must be a list of Sample"),
        ((samples_to_batch, [[(1, 2)]], torch.zeros(1)), "samples_to_batch: sample 0 (in group order) is a tuple"),
        ((samples_to_batch, [[]], torch.zeros(0)), "samples_to_batch: groups holds no samples"),
        ((samples_to_batch, [[Sample(prompt_ids=(1,), completion_ids=(2, 3), logprobs=(0.0,), finish_reason="stop")]],
          torch.zeros(1)),
         "samples_to_batch: sample 0 (in group order) has 1 logprobs for 2 completion tokens"),
        ((samples_to_batch, [[SAMPLE]], torch.ones(1, dtype=torch.bool)), "samples_to_batch: advantages must hold real"),
        ((minibatches, {"ids": 1}, 2), "minibatches: batch must be a dict of tensors with 'input_ids'"),
        ((minibatches, {"input_ids": torch.zeros(6, 2)}, 0), "minibatches: rows must be None or a positive integer"),
        ((minibatches, {"input_ids": torch.zeros(6, 2)}, 4), "minibatches: 4 rows per optimizer step do not divide"),
        ((step_seed, "1", 2), "step_seed: seed must be an integer, got str '1'"),
        ((step_seed, 1, True), "step_seed: step must be an integer, got bool True"),
    ]
    for (function, *args), expected in cases:
        with pytest.raises(PluginError) as caught:
            called_from(plugin, function, *args)
        assert caught.value.one_line().startswith(f"plugin 'corerl_x': {expected}"), caught.value.one_line()
    import numpy as np

    assert step_seed(np.int64(3), 4) == step_seed(3, 4)
    batch = samples_to_batch([[SAMPLE], [SAMPLE]], torch.tensor([[1.0], [-1.0]]))
    assert batch["advantages"][:, 0].tolist() == [1.0, -1.0]
    assert len(minibatches(batch, 1)) == 2 and minibatches(batch, None) == [batch]


def test_a_plugin_is_named_by_its_entry_point_when_it_is_installed(monkeypatch):
    import importlib.metadata

    point = importlib.metadata.EntryPoint(name="guess", value="corerl_guess.plugin", group="corerl.plugins")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [point])
    assert plugin_of_module("corerl_guess.env.steps") == "guess"
    assert plugin_of_module("my_script") == "my_script"


def test_an_environment_passing_execute_or_parse_hermes_the_wrong_thing_is_told_which():
    with pytest.raises(PluginError, match=r"^plugin 'corerl_env': parse_hermes: text must be a str \(a model turn\), "
                                          r"got EpisodeView"):
        from corerl.environments.contract import EpisodeView

        called_from("corerl_env.env", parse_hermes, EpisodeView(row={}, turn=1, responses=("x",)))
    with pytest.raises(PluginError, match=r"^plugin 'corerl_env': execute: call must be a ToolCall, got dict"):
        called_from("corerl_env.env", execute, {"name": "lookup"}, {})
    with pytest.raises(PluginError, match=r"^plugin 'corerl_env': execute: tools must be a mapping"):
        called_from("corerl_env.env", execute, ToolCall(name="lookup"), [print])
    assert execute(ToolCall(name="echo", arguments={"text": "w1"}), {"echo": lambda text: text}).content == "w1"


def test_a_turn_with_fields_of_the_wrong_type_ends_its_episode_as_malformed_not_the_run():
    assert malformed_turn(Turn(observation="w5")) is None and malformed_turn(Turn(observation=[{"role": "tool"}])) is None
    assert malformed_turn(Turn(observation=7)) == ("Turn.observation is a int; it must be text or a list of chat "
                                                   "messages (dicts)")
    assert malformed_turn(Turn(observation=["w5"])) is not None
    assert malformed_turn(Turn(observation="w5", tool_calls=1.5)) == ("Turn.tool_calls is 1.5; it must be a count "
                                                                      "(an int, 0 or more)")

    class Wrong:
        def step(self, episode):
            return Turn(observation={"content": "w5"})

    from corerl.environments.contract import EpisodeView

    (answer,) = InProcessPool(Wrong(), 10).answer([EpisodeView(row={}, turn=1, responses=("w1",))])
    assert answer.fault == "env_malformed" and "Turn.observation is a dict" in answer.cause


def _refuse(config):
    raise ConfigError("cannot run with this seed", key="algorithm.seed", hint="use seed 0")


def _refuse_without_a_key(config):
    raise ConfigError("not on this machine")


def _crash(config):
    return config.no_such_attribute


def _host(check, kind="environment"):
    host = PluginHost(env={})
    if kind == "environment":
        item = Environment(id="strict", factory="os:getcwd", check_supported=check)
        host.register(plugin_from(environments=[item]), name="strict_env")
    else:
        item = Algorithm(id="strict_algo", factory="os:getcwd", check_supported=check)
        host.register(plugin_from(algorithms=[item]), name="strict_algo")
    return host


def test_a_support_checks_refusal_is_config_errors_with_the_origin_of_its_key():
    with pytest.raises(ConfigErrors) as caught:
        select_for(_host(_refuse), EXAMPLES / "base.yaml", ["data.env_name=strict", "algorithm.seed=7"])
    (error,) = caught.value.errors
    assert error.one_line() == "algorithm.seed: cannot run with this seed; use seed 0 (override 'algorithm.seed=7')"
    assert isinstance(caught.value, ConfigError) and caught.value.one_line() == error.one_line()  # as before, a ConfigError


def test_a_refusal_naming_no_key_gets_the_origin_of_the_key_that_chose_the_component():
    with pytest.raises(ConfigErrors) as caught:
        select_for(_host(_refuse_without_a_key), EXAMPLES / "base.yaml", ["data.env_name=strict"])
    assert caught.value.errors[0].one_line() == "not on this machine (override 'data.env_name=strict')"


def test_a_support_check_that_crashes_is_the_plugins_error_not_corerls_bug():
    with pytest.raises(PluginError) as caught:
        select_for(_host(_crash, kind="algorithm"), EXAMPLES / "base.yaml", ["algorithm.name=strict_algo"])
    line = caught.value.one_line()
    assert line.startswith("plugin 'strict_algo': algorithm 'strict_algo': check_supported: raised AttributeError: ")
    assert line.endswith("(override 'algorithm.name=strict_algo')")


def test_config_errors_holding_one_error_read_as_that_error():
    only = ConfigError("too big", key="policy.max_seq_length", source="recipe.yaml", hint="lower it")
    both = ConfigErrors([only, ConfigError("bad", key="algorithm.seed")])
    assert ConfigErrors([only]).one_line() == only.one_line() and ConfigErrors([only]).key == "policy.max_seq_length"
    assert both.one_line() == f"{only.one_line()}; algorithm.seed: bad" and both.key is None
    assert ConfigErrors([only]).errors == [only]
