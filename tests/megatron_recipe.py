"""A validated recipe of a megatron policy for the megatron plugin's tests: float32, hf generation,
seed 7, on ``model``, with ``overrides``; and a megatron rank of such a config in the test's process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from corerl.testing import host_with, select_for, write_recipe


def megatron_config(model: str, folder: Path, overrides: list[str]) -> Any:
    """The validated config of that recipe, written in ``folder``, with ``overrides``."""
    recipe = write_recipe(folder / "r.yaml", {
        "policy": {"model_name": model, "precision": "float32", "megatron_cfg": {"enabled": True},
                   "generation": {"backend": "hf"}},
        "algorithm": {"seed": 7}})
    config, _ = select_for(host_with(None, "installed"), recipe, overrides)
    return config


@contextmanager
def megatron_rank(config: Any, model_dir: str, checkpoint_dir: Path) -> Iterator[Any]:
    """A megatron rank in this process (world size 1) of ``config``, holding ``model_dir``
    (converted into ``checkpoint_dir``); its process groups are destroyed on the way out."""
    import pytest
    import torch.distributed as dist
    from megatron.core import parallel_state

    from corerl.sdk import free_port
    from corerl_megatron.training.worker import MegatronWorker

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MASTER_ADDR", "127.0.0.1")
        patch.setenv("MASTER_PORT", str(free_port()))
        rank = MegatronWorker(rank=0, world_size=1, config=config, threads=1, checkpoint_dir=str(checkpoint_dir))
        try:
            rank.load_hf(model_dir)
            yield rank
        finally:
            parallel_state.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()
