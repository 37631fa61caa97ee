"""Importing DeepSpeed in a rank process, set for the machine it runs on."""

from __future__ import annotations

import logging
import os
from typing import Any


def import_deepspeed(on_gpu: bool) -> Any:
    """Import DeepSpeed for this machine. Without a GPU: the CPU accelerator, and no shared-memory
    all-reduce op (DeepSpeed would JIT-compile it for about 85 s in every fresh environment;
    gloo does the reductions training needs)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    if on_gpu:
        from corerl_deepspeed.cuda_arch import fix_arch_list_for_deepspeed

        fix_arch_list_for_deepspeed()  # before any op is JIT-built
    import deepspeed

    if not on_gpu:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return deepspeed
