"""The training-backend conformance suite holds a plugin to the contract version it states: a
backend written to contract 2.0 (stating no version) whose steps report no loss metrics fails in
one line naming the metric, the version that added it and how to add it, not with a KeyError
from inside the suite; what a later version added is skipped, in one line, for an older plugin."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from corerl.sdk import (
    CONTRACT_VERSION,
    LocalWorkerGroup,
    MicroBatcher,
    TrainingBackend,
    WorkerGroupBackend,
)
from corerl.testing import plugin_from
from corerl.testing.conformance import TrainingBackendConformance, conformance_batch
from corerl.testing.contract_versions import (
    LOSS_METRICS,
    OLDEST_SUPPORTED,
    TOPK_LOGPROBS,
    ContractCheck,
    version_key,
)
from corerl_example.config import ExampleConfig
from corerl_example.worker import ExampleWorker


class OldWorker(ExampleWorker):
    settings_key = "policy.old_cfg"


class OldBackend(WorkerGroupBackend):
    """A backend written to the docs of contract 2.0: it trains, and its steps report no metrics."""

    def __init__(self, config):
        self.config = config
        self.batcher = MicroBatcher.from_config(config)
        self.group = LocalWorkerGroup(OldWorker, config=config)

    def train_step(self, batch, loss_fn):
        return attrs.evolve(super().train_step(batch, loss_fn), metrics={})


def _old_plugin(stated: str | None = None):
    plugin = plugin_from(training_backends=[TrainingBackend(id="old", factory=OldBackend, config_section="policy.old_cfg",
                                                            config_schema=ExampleConfig)])
    if stated is not None:
        plugin.corerl_contract = stated
    return plugin


class OldLayout(TrainingBackendConformance):  # not collected: its checks are called below
    backend_id = "old"
    plugin = _old_plugin()
    overrides = ["cluster.gpus_per_node=1", "policy.old_cfg.enabled=true"]


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text.strip(), text
    return text


def test_a_backend_that_states_no_version_and_reports_no_loss_metrics_fails_in_one_line(tmp_path: Path):
    from corerl.models.tiny import build_tiny_model

    model = str(build_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2))
    _, engine = OldLayout._build(model, tmp_path, [])
    engine.conformance_world_size = 1
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            OldLayout().test_train_step_matches_plain_pytorch(engine, model, conformance_batch())
    finally:
        engine.shutdown()
    assert _one_line(failed) == (
        f"training backend 'old' (plugin 'old-under-test') (it states no contract version: held to {OLDEST_SUPPORTED}, "
        "the oldest supported) reports no metric 'loss_tokens' (it reports: none): contract 2.0 added the loss "
        "function's metrics; return them in StepResult.metrics under the loss's own names, each summed over "
        "micro-batches and ranks (corerl.sdk.WorkerGroupBackend with RankWorker does; corerl.sdk.step_result folds "
        "the ranks' results)")


class NoTopK:
    """An engine with no ``topk_logprobs`` (written before contract 2.10)."""


@pytest.mark.parametrize("stated, outcome", [("2.9", pytest.skip.Exception), (CONTRACT_VERSION, pytest.fail.Exception)])
def test_a_method_a_later_version_added_is_skipped_for_an_older_plugin_and_fails_for_a_newer(stated, outcome):
    class Layout(OldLayout):
        plugin = _old_plugin(stated)

    with pytest.raises(outcome) as caught:
        Layout().test_topk_distillation_matches_plain_pytorch(NoTopK(), "unused")
    line = _one_line(caught)
    assert line.startswith(f"training backend 'old' (plugin 'old-under-test') (contract {stated}) has no "
                           "topk_logprobs(batch, k)"), line
    assert "contract 2.10 added" in line and "add topk_logprobs(batch, k) returning" in line
    assert ("not checked at 2.9" in line) == (stated == "2.9")


def test_versions_compare_as_numbers_and_the_core_is_held_to_the_offered_one():
    assert version_key("2.10") > version_key("2.9") and OLDEST_SUPPORTED == f"{CONTRACT_VERSION.split('.')[0]}.0"
    check = ContractCheck("training backend 'x'", None)
    assert check.version == OLDEST_SUPPORTED
    assert check.metric({"loss_tokens": 3.0}, "loss_tokens", LOSS_METRICS) == 3.0
    with pytest.raises(pytest.fail.Exception, match="reports no metric 'clip_fraction' \\(it reports: loss_tokens\\)"):
        check.metric({"loss_tokens": 3.0}, "clip_fraction", LOSS_METRICS)
    with pytest.raises(pytest.skip.Exception, match="has no topk_logprobs"):
        check.method(NoTopK(), "topk_logprobs", TOPK_LOGPROBS)

    from corerl.plugin_manager import PluginHost
    from corerl.testing.contract_versions import stated_contract

    host = PluginHost(discover=False, env={})
    assert stated_contract(host, host.generation_backends.get("hf")) == CONTRACT_VERSION
