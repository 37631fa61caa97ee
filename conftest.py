"""The test tiers of the whole workspace: tests marked ``gpu`` exercise real CUDA paths and are
skipped, with the reason, where torch sees no GPU (the CPU suite is the CI gate)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch sees none); run `bash scripts/test.sh -m gpu` on a GPU machine")
    for item in gpu_items:
        item.add_marker(skip)
