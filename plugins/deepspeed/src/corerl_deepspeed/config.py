"""``policy.deepspeed_cfg``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import attrs

from corerl.sdk import setting

OffloadTarget = Literal["none", "cpu", "nvme"]


@attrs.define(kw_only=True)
class DeepSpeedConfig:
    """Settings of the deepspeed training backend."""

    enabled: bool = setting(False, help="train with DeepSpeed (it outranks dtensor when enabled)")
    zero_stage: Literal[0, 1, 2, 3] = setting(2, help="ZeRO stage: 0 none, 1 optimizer state, 2 and gradients, 3 and parameters sharded")
    offload_optimizer: OffloadTarget = setting("none", help="where ZeRO keeps the optimizer state: none, cpu or nvme")
    offload_param: OffloadTarget = setting("none", help="where ZeRO-3 keeps the parameters: none, cpu or nvme")
    nvme_path: str | None = setting(None, help="folder for nvme offload")
    gradient_clipping: float | None = setting(None, min=0.0, help="unset: policy.max_grad_norm")
    use_deepspeed_optimizer: bool = setting(
        False, help="DeepSpeed's own AdamW/Adam (FusedAdam, CPUAdam with offload; compiled on first use) with "
                    "policy.optimizer's settings, instead of the torch optimizer")
    config: dict[str, Any] = setting({}, help="further DeepSpeed JSON keys, merged over the generated config")

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """nvme offload needs a writable folder; parameter offload needs ZeRO-3."""
        if "nvme" in (self.offload_optimizer, self.offload_param):
            if not self.nvme_path:
                yield ("nvme_path", "offload to nvme needs nvme_path (a folder on a fast local disk)")
            elif not os.path.isdir(self.nvme_path):
                yield ("nvme_path", f"{self.nvme_path} is not a folder; create it on a fast local disk")
            elif not os.access(self.nvme_path, os.W_OK):
                yield ("nvme_path", f"{self.nvme_path} is not writable by this user")
        if self.use_deepspeed_optimizer and config.policy.optimizer.name == "sgd":
            yield ("use_deepspeed_optimizer", "DeepSpeed's own optimizers are Adam and AdamW; policy.optimizer.name is sgd")
        if self.offload_param != "none" and self.zero_stage != 3:
            yield ("offload_param", f"parameter offload needs zero_stage 3, got {self.zero_stage}")
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            yield ("offload_optimizer", "optimizer offload needs zero_stage 1, 2 or 3")
