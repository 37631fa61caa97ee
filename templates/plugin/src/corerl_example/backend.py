"""The engine behind the ``example`` backend: plain single-process PyTorch, world size 1.

Imported only when the backend is built, so torch stays out of ``corerl plugins``. It is a
complete implementation of corerl's training-backend contract (``corerl.training.contract``)
and passes the conformance suite; start your own engine from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch

from corerl.errors import ConfigError
from corerl.training.batching import loss_token_count
from corerl.training.contract import StepResult
from corerl.training.grad_norm import clip_grad_norm
from corerl.training.logprobs import model_logprobs
from corerl.training.microbatching import MicroBatcher
from corerl.training.optim import build_optimizer, build_scheduler


class ExampleBackend:
    """Trains a Hugging Face causal LM in this process."""

    def __init__(self, config: Any) -> None:
        if config.core.cluster.world_size != 1:
            raise ConfigError(
                "the example backend runs one process only", key="cluster.gpus_per_node", hint="set it to 1"
            )
        self.config = config
        self.settings = config.section("policy.example_cfg")
        # rows, dynamic (token-budget) or packed micro-batches, as the recipe says
        self.batcher = MicroBatcher.from_config(config)
        self.model: Any = None

    def load_hf(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        policy = self.config.core.policy
        self.model_path = model_path
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.optimizer = build_optimizer(self.model.parameters(), policy.optimizer)
        self.scheduler = build_scheduler(self.optimizer, policy.scheduler, self.config.core.algorithm.max_steps)
        self.step = 0

    def logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.model.eval()
        plan = self.batcher.plan(batch, ranks=1, purpose="logprobs")
        with torch.no_grad():
            return plan.unpack([[model_logprobs(self.model, mb) for mb in plan.per_rank[0]]])

    def train_step(self, batch: dict[str, torch.Tensor], loss_fn: Any) -> StepResult:
        self.model.train()
        normaliser = float(max(1, loss_token_count(batch)))
        total = 0.0
        for mb in self.batcher.plan(batch, ranks=1, purpose="train").per_rank[0]:
            loss, _ = loss_fn(model_logprobs(self.model, mb), mb, normaliser)
            loss.backward()
            total += float(loss.item())
        grad_norm = clip_grad_norm(self.model.parameters(), self.config.core.policy.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return StepResult(loss=total, grad_norm=grad_norm, lr=lr, tokens=int(normaliser), step=self.step)

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        torch.save({
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "step": self.step, "rng": torch.get_rng_state(),
        }, os.path.join(path, "example.pt"))

    def load_checkpoint(self, path: str) -> None:
        state = torch.load(os.path.join(path, "example.pt"), weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        torch.set_rng_state(state["rng"])

    def export_hf(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.model.save_pretrained(path)
        AutoTokenizer.from_pretrained(self.model_path).save_pretrained(path)

    def weight_stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach()

    def offload(self, parts: Any = ("optimizer", "parameters")) -> None:
        """Nothing to move: this engine lives on the CPU."""

    def reload(self, parts: Any = ("optimizer", "parameters")) -> None:
        """Nothing to move back."""

    def shutdown(self) -> None:
        self.model = None
