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
    """This process's torch, Python, NumPy (and CUDA, where there is one) generator states, as
    tensors and plain data only (a checkpoint loads them with ``weights_only=True``)."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng` returned."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
