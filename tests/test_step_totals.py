"""A step's loss and metrics summed over micro-batches as tensors, read once at the end."""

from __future__ import annotations

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
