"""Importing DeepSpeed in a rank process, set for the machine it runs on."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def import_deepspeed(on_gpu: bool) -> Any:
    """Import DeepSpeed for this machine. Without a GPU: the CPU accelerator, and no shared-memory
    all-reduce op (DeepSpeed would JIT-compile it for about 85 s in every fresh environment;
    gloo does the reductions training needs)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    if on_gpu:
        from corerl_deepspeed.cuda_arch import fix_arch_list_for_deepspeed

        fix_arch_list_for_deepspeed()  # before any op is JIT-built
    with not_importable("mlflow"):
        import deepspeed

    if not on_gpu:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return deepspeed


@contextmanager
def not_importable(name: str) -> Iterator[None]:
    """``import name`` fails (ImportError) inside the block, unless it was imported already; after
    it the module imports as usual. For MLflow: DeepSpeed's autotuner imports it where it is
    installed (corerl's MLflow logger installs it) and uses it only while autotuning, which a rank
    never does; it was 1.2 s of CPU of the 2.8 s DeepSpeed's import took in every rank process
    (``python -X importtime``). A lazily loaded module would not do: importing one again loads it."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable" mark
    try:
        yield
    finally:
        if sys.modules.get(name, "") is None:
            del sys.modules[name]
