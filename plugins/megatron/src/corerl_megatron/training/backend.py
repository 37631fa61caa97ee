"""The driver side of the megatron backend: one Ray worker group, batches in, results out."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from corerl.sdk import (
    Config,
    Dispatch,
    MicroBatcher,
    RankLayout,
    RayWorkerGroup,
    WorkerGroupBackend,
    training_layout,
)

WORKER = "corerl_megatron.training.worker:MegatronWorker"


class MegatronBackend(WorkerGroupBackend):
    """megatron-core GPTModel, tensor x pipeline x data parallel over Ray ranks; a policy, or PPO's
    critic (a :class:`~corerl_megatron.training.model.ValueHead` in place of the vocabulary projection)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.world_size = config.core.cluster.world_size
        threads = max(1, (os.cpu_count() or 1) // self.world_size)
        self.batcher = MicroBatcher.from_config(config)
        from corerl_megatron.conversion.store import checkpoint_root

        # the driver's environment decides where conversions live (Ray workers may have started earlier)
        self.group = RayWorkerGroup(WORKER, self.world_size, ray_address=config.core.cluster.ray_address,
                                    layout=training_layout(config.core.cluster, config.pool), role="megatron critic worker" if config.role == "critic" else "megatron worker", config=config, threads=threads,
                                    checkpoint_dir=str(checkpoint_root()))
        coords = self.group.call("coordinates")
        self.layout = RankLayout([c["dp"] for c in coords], [c["reports"] for c in coords])

    def load_hf(self, model_path: str) -> None:
        from corerl_megatron.conversion.store import load_hf_model_config

        super().load_hf(model_path)
        self.model_path = model_path
        # read once here, not on every refit
        self.hf_config, self.family, self.shape = load_hf_model_config(
            Path(model_path), self.config.section("policy.megatron_cfg").converter_type)

    def adapter_weights(self) -> Any:
        """The LoRA adapter for a refit, its config naming the Hugging Face projections adapted
        (:func:`corerl_megatron.training.lora.peft_config`; megatron's layer names and wildcards
        mean nothing to a generation engine)."""
        from corerl.sdk import AdapterWeights
        from corerl_megatron.training.lora import peft_config

        config = peft_config(self.config.core.policy.lora, self.hf_config.num_hidden_layers, self.base_path)
        return AdapterWeights(self, config, self.base_path,
                              lambda: self.call(Dispatch.ONE_RANK, "adapter_state"))

    def _megatron_state(self) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = {}
        for part in self.call(Dispatch.ALL, "full_state_dict"):
            state.update(part or {})
        return state

    def hf_state(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The ranks' megatron weights, gathered and converted to Hugging Face names and layouts."""
        from corerl_megatron.conversion.convert import megatron_to_hf

        return megatron_to_hf(self._megatron_state(), self.family, self.shape).items()

    def export_hf(self, path: str) -> None:
        from corerl.sdk import write_hf_checkpoint

        write_hf_checkpoint(dict(self.hf_state()), self.hf_config, self.model_path, path, self.config.role)

