"""A step's loss and metrics summed over micro-batches as tensors, read once at the end."""

from __future__ import annotations

import pytest
import torch

from corerl.training.step_totals import StepTotals


def test_tensor_and_float_metrics_sum_to_floats():
    totals = StepTotals()
    loss = torch.tensor(0.5, requires_grad=True) * 2
    totals.add(loss, {"kl": torch.tensor(0.25), "tokens": 3.0})
    totals.add(torch.tensor(1.5), {"kl": torch.tensor(0.75), "tokens": 4.0, "late": torch.tensor(2.0)})
    assert not totals.loss.requires_grad  # nothing of the graph is kept alive
    total, metrics = totals.result()
    assert total == 2.5 and metrics == {"kl": 1.0, "tokens": 7.0, "late": 2.0}
    assert all(type(v) is float for v in metrics.values()) and type(total) is float


def test_a_step_without_tensors_needs_no_torch_read():
    totals = StepTotals()
    totals.add(1.0, {"a": 2.0})
    assert totals.result() == (1.0, {"a": 2.0})


def test_extremes_combine_by_maximum_and_minimum_over_micro_batches_and_ranks():
    from corerl.distributed.group_backend import step_result

    totals = StepTotals()
    totals.add(1.0, {"gap/max": torch.tensor(0.5), "ratio/min": torch.tensor(0.9), "gap/mean": torch.tensor(0.1)})
    totals.add(1.0, {"gap/max": torch.tensor(0.2), "ratio/min": torch.tensor(0.7), "gap/mean": torch.tensor(0.2)})
    _, metrics = totals.result()
    assert metrics == pytest.approx({"gap/max": 0.5, "ratio/min": 0.7, "gap/mean": 0.3})
    ranks = [{"loss": 1.0, "grad_norm": 1.0, "lr": 0.1, "step": 1, "metrics": metrics},
             {"loss": 1.0, "grad_norm": 1.0, "lr": 0.1, "step": 1,
              "metrics": {"gap/max": 0.9, "ratio/min": 0.8, "gap/mean": 0.1}}]
    assert step_result(ranks, tokens=8).metrics == pytest.approx({"gap/max": 0.9, "ratio/min": 0.7, "gap/mean": 0.4})
