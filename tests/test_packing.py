"""Packers, the micro-batch planner, and a third-party packer chosen by id."""

from __future__ import annotations

import random

import pytest
import torch

from corerl.errors import ConfigError
from corerl.packing.algorithms import (
    Concatenative,
    FirstFitDecreasing,
    FirstFitShuffle,
    KarmarkarKarp,
    ModifiedFirstFitDecreasing,
    karmarkar_karp,
)
from corerl.packing.contract import check_bins
from corerl.registry import SequencePacker
from corerl.testing import plugin_from, select_for, write_recipe
from corerl.testing.conformance import conformance_batch
from corerl.training.microbatching import MicroBatcher

PACKERS = [FirstFitDecreasing, ModifiedFirstFitDecreasing, FirstFitShuffle, Concatenative, KarmarkarKarp]


def lengths_uniform(n: int = 64, low: int = 16, high: int = 512, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


@pytest.mark.parametrize("packer", PACKERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", range(5))
def test_every_packer_places_each_sequence_once_within_the_budget(packer, seed):
    lengths = lengths_uniform(seed=seed)
    bins = packer().pack(lengths, 1024)
    check_bins(bins, lengths, 1024, packer.__name__)  # raises on a lost, repeated or overflowing sequence
    assert len(bins) >= -(-sum(lengths) // 1024)


def test_decreasing_packers_fill_rows_better_than_concatenation():
    lengths = lengths_uniform(seed=3)
    count = {p.__name__: len(p().pack(lengths, 1024)) for p in PACKERS}
    assert count["ModifiedFirstFitDecreasing"] <= count["Concatenative"]
    assert count["FirstFitDecreasing"] <= count["Concatenative"]
    lower_bound = -(-sum(lengths) // 1024)
    assert count["ModifiedFirstFitDecreasing"] <= lower_bound + 1


def test_modified_ffd_pairs_a_large_sequence_with_the_medium_one_that_fits():
    # budget 12: 7 is large, 5 and 4 medium; 3 and 2 small (FFD would put 7+5 then 4+3+2 too)
    bins = ModifiedFirstFitDecreasing().pack([7, 5, 4, 3, 2], 12)
    assert sorted(sorted(b) for b in bins) == [[0, 1], [2, 3, 4]]


def test_concatenative_keeps_the_given_order():
    assert Concatenative().pack([5, 5, 3, 9, 1], 10) == [[0, 1], [2], [3, 4]]


def test_first_fit_shuffle_is_reproducible_and_follows_its_seed():
    lengths = lengths_uniform(seed=1)
    assert FirstFitShuffle(seed=4).pack(lengths, 900) == FirstFitShuffle(seed=4).pack(lengths, 900)
    assert FirstFitShuffle(seed=4).pack(lengths, 900) != FirstFitShuffle(seed=5).pack(lengths, 900)  # it reads it


def test_karmarkar_karp_is_the_largest_differencing_method():
    # the textbook case: differencing leaves a spread of 2 where the optimum is 0
    groups = karmarkar_karp([8, 7, 6, 5, 4], 2)
    sums = sorted(sum([8, 7, 6, 5, 4][i] for i in g) for g in groups)
    assert sums == [14, 16]


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_karmarkar_karp_balances_ranks_within_five_percent(ranks):
    lengths = lengths_uniform(seed=ranks)
    groups = karmarkar_karp(lengths, ranks)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in g) for g in groups]
    assert max(loads) / min(loads) < 1.05, loads


def test_karmarkar_karp_packer_balances_its_bins():
    lengths = lengths_uniform(seed=2)
    loads = [sum(lengths[i] for i in b) for b in KarmarkarKarp().pack(lengths, 2048)]
    assert max(loads) - min(loads) < 64, loads


def _batcher(layout: str, budget: int = 40) -> MicroBatcher:
    return MicroBatcher(layout=layout, train_rows=2, logprob_rows=2, train_tokens=budget, logprob_tokens=budget,
                        packer=ModifiedFirstFitDecreasing(), packer_id="modified_first_fit_decreasing")


@pytest.mark.parametrize("layout", ["rows", "dynamic", "packed"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_plan_unpacks_per_token_values_to_their_rows(layout, ranks):
    batch = conformance_batch(rows=8)
    batch["marker"] = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16) * batch["attention_mask"]
    plan = _batcher(layout).plan(batch, ranks)
    assert len({len(mbs) for mbs in plan.per_rank}) == 1  # every rank runs as many forwards
    back = plan.unpack([[mb["marker"] for mb in mbs] for mbs in plan.per_rank])
    assert torch.equal(back, batch["marker"])
    if layout == "packed":
        for mb in (mb for mbs in plan.per_rank for mb in mbs):
            assert mb["input_ids"].shape[0] == 1 and mb["input_ids"].shape[1] <= 40
            starts = mb["position_ids"] == 0
            assert not (mb["loss_mask"].bool() & starts).any()  # no sequence's first token is in the loss


def test_packing_balances_tokens_and_beats_padding_on_slots():
    lengths = lengths_uniform(n=32, low=4, high=64, seed=5)
    from corerl.training.batching import right_pad

    ids, mask = right_pad([[7] * n for n in lengths])
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.clone()}
    packed = _batcher("packed", budget=128).plan(batch, 2)
    rows = _batcher("rows").plan(batch, 2)
    assert packed.efficiency > 0.9 > rows.efficiency
    per_rank = [sum(p.length for p in places) for places in packed.placements]
    assert max(per_rank) / min(per_rank) < 1.05


def test_a_budget_below_the_longest_sequence_names_the_key():
    with pytest.raises(ConfigError) as caught:
        _batcher("packed", budget=10).plan(conformance_batch(rows=4), 1)
    assert "policy.sequence_packing.train_mb_tokens" in str(caught.value)
    assert "16 tokens" in str(caught.value)


def test_packing_refuses_a_per_row_field():
    batch = conformance_batch(rows=4)
    batch["reward"] = torch.ones(4)
    with pytest.raises(ValueError, match="'reward'.*per row"):
        _batcher("packed").plan(batch, 1)


class EverySequenceAlone:
    """A third-party packer: one sequence per row."""

    def pack(self, lengths, budget):
        return [[i] for i in range(len(lengths))]


def test_a_third_party_packer_is_selected_by_id(tmp_path):
    from corerl.plugin_manager import PluginHost

    host = PluginHost(env={})  # the installed plugins (a training backend) plus this one
    host.register(plugin_from(sequence_packers=[
        SequencePacker(id="alone", factory=EverySequenceAlone, description="one sequence per row")]), name="mine")
    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m", "max_seq_length": 16}})
    config, selection = select_for(host, recipe, [
        "policy.sequence_packing.enabled=true", "policy.sequence_packing.algorithm=alone"])
    assert selection.sequence_packer.id == "alone"
    plan = MicroBatcher.from_config(config).plan(conformance_batch(rows=4), 1)
    assert [len({p.micro_batch for p in places}) for places in plan.placements] == [4]


def test_packing_and_dynamic_batching_together_are_refused(corerl_host, tmp_path):
    from corerl.errors import ConfigErrors

    recipe = write_recipe(tmp_path / "r.yaml", {"policy": {"model_name": "m"}})
    with pytest.raises(ConfigErrors, match="policy.dynamic_batching.enabled"):
        select_for(corerl_host, recipe, ["policy.sequence_packing.enabled=true", "policy.dynamic_batching.enabled=true"])


def _metric_rows(run_dir):
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "refit/"))} for row in rows]


def test_a_grpo_run_reports_the_same_metrics_with_packing_on_and_off(tmp_path):
    """The demo recipe, cut short, through `corerl run`: SFT and GRPO steps with packing (and the
    full offload policy) on give the same metrics as the plain run."""
    import math

    from tests.conftest import run_corerl

    common = ["run", f"run.output_dir={tmp_path}", "sft.max_steps=2", "algorithm.max_steps=3",
              "policy.generation.backend=hf", "checkpointing.enabled=false"]
    plain = run_corerl(*common, "run.name=plain")
    assert plain.code == 0, plain
    packed = run_corerl(*common, "run.name=packed", "policy.sequence_packing.enabled=true",
                        "policy.sequence_packing.train_mb_tokens=256", "policy.sequence_packing.logprob_mb_tokens=512",
                        "policy.offload.policy=full")
    assert packed.code == 0, packed
    assert "modified_first_fit_decreasing" in packed.out and "full" in packed.out  # the selection table
    ours, theirs = _metric_rows(tmp_path / "packed"), _metric_rows(tmp_path / "plain")
    assert [r["phase"] for r in ours] == ["sft"] * 2 + ["grpo"] * 3
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            if isinstance(value, float):
                assert math.isclose(a[key], value, rel_tol=1e-5, abs_tol=1e-6), (a["phase"], a["step"], key, a[key], value)
            else:
                assert a[key] == value, key
