"""Which slice of the full Megatron state a rank's model stage holds, and copying it in.

A rank holds one pipeline stage (its layers renumbered from 0) and, within it, its
tensor-parallel shard of each parameter. :class:`StageWeights` records both for a built stage
and moves weights between the full (global names, whole tensors) and the local form.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import torch

log = logging.getLogger(__name__)


@attrs.define
class StageWeights:
    """The layer numbering and partition dims of one rank's model stage (and, in a mixture of
    experts, which experts it holds: its expert-parallel rank and the experts per rank)."""

    numbering: Any
    partition: dict[str, int | None]
    tied: bool
    tp_rank: int
    tp: int
    ep_rank: int = 0
    experts_per_rank: int = 0

    @classmethod
    def of(cls, model: Any, full: dict[str, torch.Tensor], tied: bool, tp_rank: int, tp: int,
           ep_rank: int = 0, experts_per_rank: int = 0) -> StageWeights:
        """Read ``model``'s layout against the full state, marking each parameter's partition
        the way megatron does while initialising weights (which conversion skips; its grad norm
        counts a tensor-parallel-duplicated parameter once by them)."""
        from corerl_megatron.training.sharding import layer_numbering, partition_dim

        layout = cls(layer_numbering(model), {}, tied, tp_rank, tp, ep_rank, experts_per_rank)
        for name, param in model.named_parameters():
            dim = layout.partition[name] = partition_dim(full[layout.source_name(name)].shape, param.shape)
            param.tensor_model_parallel = dim is not None
            param.partition_dim = dim if dim is not None else -1
            param.partition_stride = 1
        return layout

    def source_name(self, local_name: str) -> str:
        """The global Megatron name a local parameter is cut from."""
        from corerl_megatron.training.experts import global_expert_name
        from corerl_megatron.training.model import spec_neutral_name
        from corerl_megatron.training.sharding import renumber

        name = global_expert_name(spec_neutral_name(renumber(local_name, self.numbering)), self.ep_rank,
                                  self.experts_per_rank)
        # tied embeddings: the last pipeline stage's copy of the word embeddings is the same tensor
        return "embedding.word_embeddings.weight" if name == "output_layer.weight" and self.tied else name

    def copy_in(self, module: Any, full: dict[str, torch.Tensor]) -> None:
        """This rank's shard of every parameter of ``module`` from the full Megatron state."""
        from corerl_megatron.training.sharding import shard

        # a LoRA adapter's tensors (added after the layout was read) are not the checkpoint's
        local = {name: shard(name, full[self.source_name(name)], self.partition[name], self.tp_rank, self.tp)
                 for name, _ in module.named_parameters() if name in self.partition}
        local.update({name: full[self.source_name(name)] for name, _ in routed_buffers(module)})
        missing, unexpected = module.load_state_dict(local, strict=False)
        # a module at several places (a repeated MTP head) is loaded under its first name only
        tensors = module.state_dict(keep_vars=True)
        loaded = {id(tensors[name]) for name in local if name in tensors}
        missing = [m for m in missing if not m.endswith("_extra_state") and id(tensors[m]) not in loaded]
        if missing or unexpected:
            raise RuntimeError(f"megatron stage: missing {missing[:3]}, unexpected {unexpected[:3]}")


def routed_buffers(module: Any) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors a stage keeps as buffers, not parameters: each router's per-expert
    bias (``router.expert_bias``, whole on every rank: the router is not split)."""
    return [(name, buffer) for name, buffer in module.named_buffers() if name.endswith("router.expert_bias")]


def freeze_routers(model: Any) -> None:
    """``policy.moe.freeze_router`` (NeMo RL's ``freeze_moe_router``): the MoE routers' weights
    take no gradient (set before DDP builds its gradient buffers, which then leave them out)."""
    routers = [param for name, param in model.named_parameters() if ".router." in name]
    for param in routers:
        param.requires_grad_(False)
    if not routers:
        log.info("megatron: freeze_moe_router is set but the model has no MoE router")
