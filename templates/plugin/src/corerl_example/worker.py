"""The rank of the ``example`` backend: plain PyTorch on one process.

A rank worker supplies what is its own (how to build the model, run a forward pass and an
optimizer step, and save its state); :class:`corerl.training.rank_worker.RankWorker` does the
rest: the micro-batch loop with gradient accumulation, the checkpoint sidecar (step and RNG
state), Hugging Face export, offload, shutdown. Start your own engine from this file.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from corerl.sdk import (
    RankWorker,
    build_optimizer,
    build_scheduler,
    clip_grad_norm,
    model_logprobs,
    optimizer_state_tensors,
    storage_bytes,
)


class ExampleWorker(RankWorker):
    """A Hugging Face causal LM trained in this process."""

    settings_key = "policy.example_cfg"

    def load_hf(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        policy = self.config.core.policy
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)
        self.model_path, self.hf_config = model_path, self.model.config
        self.optimizer = build_optimizer(self.model.parameters(), policy.optimizer)
        self.scheduler = build_scheduler(self.optimizer, policy.scheduler, self.config.core.algorithm.max_steps)
        self.step = 0

    def set_mode(self, training: bool) -> None:
        self.model.train(training)

    def forward_logprobs(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        # policy.precision=bfloat16: float32 weights and optimizer, the forward computed in bf16
        bf16 = self.config.core.policy.precision == "bfloat16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            return model_logprobs(self.model, mb)

    def optimizer_step(self) -> tuple[float, float]:
        grad_norm = clip_grad_norm(self.model.parameters(), self.config.core.policy.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.grad_bytes = storage_bytes(p.grad for p in self.model.parameters())
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, lr

    def save_state(self, path: str) -> dict[str, Any]:
        os.makedirs(path, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                   os.path.join(path, "example.pt"))
        return {"scheduler": self.scheduler.state_dict()}

    def load_state(self, path: str, sidecar: dict[str, Any]) -> None:
        state = torch.load(os.path.join(path, "example.pt"), weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(sidecar["scheduler"])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()}

    def phase_tensors(self, part: str) -> list[torch.Tensor] | None:
        # what offload between phases moves off the device (on a CPU: parks in host memory)
        if part == "parameters":
            return list(self.model.parameters())
        if part == "optimizer":
            return optimizer_state_tensors(self.optimizer)
        return None

    def state_bytes(self) -> dict[str, int]:
        # bytes on this rank's device: 0 for a part while it is offloaded
        return {"parameters": self.resident_bytes(self.model.parameters()), "gradients": self.grad_bytes,
                "optimizer": self.resident_bytes(optimizer_state_tensors(self.optimizer))}
