"""What every rank of a training backend does alike: wait for the others, and keep its random
number generators across a checkpoint."""

from __future__ import annotations

import random
from typing import Any


def barrier() -> None:
    """Wait for every rank of the default process group (nothing to wait for without one)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def capture_rng() -> dict[str, Any]:
    """This process's torch, Python, NumPy (and CUDA, where there is one) generator states."""
    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
