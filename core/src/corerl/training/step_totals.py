"""A rank's loss and metrics summed over its micro-batches with one host sync per step.

Turning each micro-batch's loss and metrics into Python floats as they come makes the host
wait for the accelerator after every micro-batch; here they stay tensors (detached, on the
device) until :meth:`StepTotals.result`, which reads them all at once.
"""

from __future__ import annotations

from typing import Any


def combine(key: str, a: Any, b: Any) -> Any:
    """Two micro-batches' (or ranks') values of metric ``key``: the larger for a name ending in
    ``/max``, the smaller for ``/min``, else their sum."""
    import torch

    if key.endswith("/max"):
        return torch.maximum(a, b) if isinstance(a, torch.Tensor) else max(a, b)
    if key.endswith("/min"):
        return torch.minimum(a, b) if isinstance(a, torch.Tensor) else min(a, b)
    return a + b


class StepTotals:
    """Sums of the loss and of each metric (floats or 0-d tensors) over a step's micro-batches
    (maximum and minimum for names ending in ``/max`` and ``/min``: :func:`combine`)."""

    def __init__(self) -> None:
        self.loss: Any = 0.0
        self.metrics: dict[str, Any] = {}

    def add(self, loss: Any, metrics: dict[str, Any]) -> None:
        self.loss = self.loss + (loss.detach() if hasattr(loss, "detach") else loss)
        for key, value in metrics.items():
            value = value.detach() if hasattr(value, "detach") else value
            self.metrics[key] = combine(key, self.metrics[key], value) if key in self.metrics else value

    def result(self) -> tuple[float, dict[str, float]]:
        """The step's loss and metrics as floats (the one sync)."""
        import torch

        keys = list(self.metrics)
        values = [self.loss, *(self.metrics[k] for k in keys)]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if tensors:  # one transfer for every tensor value
            read = iter(torch.stack([t.float().reshape(()) for t in tensors]).cpu().tolist())
            values = [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
        return float(values[0]), {k: float(v) for k, v in zip(keys, values[1:], strict=True)}
