"""A plugin under a conformance suite is held to the plugin contract version it states.

A plugin states ``corerl_contract = "2.9"`` in its plugin module (docs/plugins.md, "Versions of
the plugin contract"); one that states none is held to the oldest version this corerl still
loads (:data:`OLDEST_SUPPORTED`). What a check needs of the engine is a :class:`Requirement`
carrying the version that added it. Where the engine lacks it:

- the plugin's version has it: the check fails, in one line naming the metric or method, the
  version that added it and how to add it;
- the plugin states an older version: the check is skipped, in one line saying the same, since
  the plugin never claimed it.

Never a ``KeyError`` or an ``AttributeError`` from inside the suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import attrs
import pytest

from corerl.plugin_manager import version_key
from corerl.sdk import CONTRACT_VERSION

#: the oldest contract version this corerl loads: the offered major's first minor
OLDEST_SUPPORTED = f"{CONTRACT_VERSION.split('.')[0]}.0"


@attrs.frozen
class Requirement:
    """Something a conformance check needs of an engine: what (``the metric 'x'`` is filled in
    by :meth:`ContractCheck.metric`), the contract version that added it, and how to add it."""

    what: str
    added: str
    how: str


#: contract 2.0: a loss function's metrics come back under the loss's own names
LOSS_METRICS = Requirement(
    "the loss function's metrics", "2.0",
    "return them in StepResult.metrics under the loss's own names, each summed over micro-batches and ranks "
    "(corerl.sdk.WorkerGroupBackend with RankWorker does; corerl.sdk.step_result folds the ranks' results)")

#: contract 2.6: SamplingSettings.ignore_eos runs every completion to max_new_tokens
IGNORE_EOS = Requirement(
    "SamplingSettings.ignore_eos", "2.6",
    "with ignore_eos, let no token end a completion (not the end of sequence, not the stop ids): every one runs to "
    "max_new_tokens, with finish_reason 'length'")

#: contract 2.7: a mixture-of-experts step reports its routers
ROUTER_METRICS = Requirement(
    "the routers' metrics", "2.7",
    "report moe/aux_loss, moe/z_loss and each layer's load_min, load_max and load_entropy in StepResult.metrics "
    "(corerl.sdk.RankWorker does under policy.moe)")

#: contract 2.10: a teacher's top-k next tokens
TOPK_LOGPROBS = Requirement(
    "topk_logprobs(batch, k)", "2.10",
    "add topk_logprobs(batch, k) returning the token logprobs [B, T] and, at each position, the k most likely next "
    "tokens' logprobs and ids [B, T, k] from one forward (corerl.sdk.WorkerGroupBackend with RankWorker has it when "
    "the forward goes through model_logprobs or batch_logprobs)")

#: contract 2.10: a student's logprobs of the teacher's candidates
CANDIDATE_LOGPROBS = Requirement(
    "candidate_logprobs for a batch's candidate_ids", "2.10",
    "before the loss reads a micro-batch that carries candidate_ids [B, T, K], write its differentiable "
    "candidate_logprobs [B, T, K] into it (corerl.sdk.RankWorker does)")


#: contract 2.12: a prompt's samples drawn from its own request seed
REQUEST_SEEDS = Requirement(
    "SamplingSettings.request_seeds", "2.12",
    "seed sample j of prompt i with request_seeds[i] + j, one stream a sample (an engine that takes a seed per request: "
    "pass it there; a decode loop of your own: corerl.sdk.row_seeds, row_generators and choose_tokens_per_row)")


#: contract 2.14: stop ids end a completion besides the model's end of sequence
STOP_IDS_BESIDES_EOS = Requirement(
    "stop_token_ids that end a completion besides the model's end of sequence", "2.14",
    "stop at SamplingSettings.stop_token_ids and at the checkpoint's end-of-sequence ids (generation_config.json's "
    "eos_token_id, else the tokenizer's) alike, unless ignore_eos")


#: contract 2.14: an update may leave out a weight tied to one it carries
TIED_UPDATES = Requirement(
    "updates that leave out the tied copy of a weight (lm_head.weight where tie_word_embeddings)", "2.14",
    "take update_weights' pairs as part of a state (load_state_dict(strict=False)), refusing only missing names "
    "that share no tensor with a name given, and keep tied tensors tied")


#: contract 2.15: offload between phases moves the state (corerl.testing.offload_check)
OFFLOAD_MOVES_STATE = Requirement(
    "offload that moves the parts' state off the ranks' device and brings back the same bytes", "2.15",
    "name each part's tensors in RankWorker.phase_tensors (the core parks them in host memory on a CPU and, "
    "by default, on a GPU) or move them in RankWorker.move, and count in state_bytes() only what is on the device")

class ContractCheck:
    """The engine of one plugin under a suite, held to the version the plugin states (None: it
    states none, and is held to :data:`OLDEST_SUPPORTED`). ``who`` names it in failure lines."""

    def __init__(self, who: str, stated: str | None) -> None:
        self.who, self.stated = who, stated
        self.version = stated or OLDEST_SUPPORTED

    def describe(self) -> str:
        """The engine and the version it is held to, for failure lines."""
        if self.stated is None:
            return f"{self.who} (it states no contract version: held to {OLDEST_SUPPORTED}, the oldest supported)"
        return f"{self.who} (contract {self.stated})"

    def missing(self, lack: str, requirement: Requirement) -> NoReturn:
        """Fail, or skip where the plugin's version predates ``requirement``, in one line."""
        if version_key(self.version) < version_key(requirement.added):
            pytest.skip(f"{self.describe()} {lack}, which contract {requirement.added} added: not checked at "
                        f"{self.version}; to state {requirement.added}, {requirement.how}")
        pytest.fail(f"{self.describe()} {lack}: contract {requirement.added} added {requirement.what}; "
                    f"{requirement.how}", pytrace=False)

    def metric(self, metrics: Mapping[str, Any], name: str, requirement: Requirement) -> Any:
        """``metrics[name]``, or the one-line failure (or skip) naming it."""
        if name not in metrics:
            shown = ", ".join(sorted(metrics)) or "none"
            self.missing(f"reports no metric {name!r} (it reports: {shown})", requirement)
        return metrics[name]

    def method(self, engine: Any, name: str, requirement: Requirement) -> Any:
        """``engine.name`` when callable, or the one-line failure (or skip) naming it."""
        found = getattr(engine, name, None)
        if not callable(found):
            self.missing(f"has no {requirement.what}", requirement)
        return found


def stated_contract(host: Any, registration: Any) -> str | None:
    """The contract version ``registration``'s plugin states (the core's own: the offered one)."""
    from corerl.plugin_manager import CORE_PLUGIN

    if registration.plugin == CORE_PLUGIN:
        return CONTRACT_VERSION
    info = host.plugins.get(registration.plugin)
    return info.contract if info is not None else None
