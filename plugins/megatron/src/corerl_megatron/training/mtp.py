"""Multi-token-prediction (MTP) draft heads on the megatron backend, trained with a decoupled draft loss.

The heads are megatron-core's :class:`MultiTokenPredictionBlock` (per head: a norm of the next
token's embedding, a norm of the previous depth's hidden state, a projection of the two
concatenated, one transformer layer and a final norm), attached to the GPTModel as ``mtp`` by
:func:`corerl_megatron.training.model.build_gpt`. GPTModel's own MTP path trains them together with
the trunk against the labels; here they are trained to be a generation engine's speculative
drafter, as ``policy_loss + w * draft_loss`` (``policy.megatron_cfg.mtp_loss_scaling_factor``), where
the draft loss is decoupled: the trunk's hidden states, the re-embedded tokens, the output layer's
weight and the distribution the heads are distilled from (the trunk's own next-token distribution
at the position they predict) are all detached, so its gradient reaches the heads only and the
trunk trains exactly as without them.

Head ``k`` (1-based) at position ``t`` reads the hidden state of ``t`` (the previous head's for
``k > 1``) and the embedding of token ``t + k``, and predicts token ``t + k + 1``: its target is
the trunk's distribution at position ``t + k``, on the positions whose token ``t + k + 1`` is a
loss token (the completion). The loss is the soft cross-entropy, summed over those positions,
divided by the step's normaliser (as the policy loss is) and averaged over the heads; with
``mtp_loss_topk`` only the trunk's ``k`` most likely tokens, renormalised, are distilled; with
``mtp_loss_chunk_size`` the positions go through the output layer a chunk at a time, each chunk
recomputed in the backward pass (the same loss, less memory).

With ``mtp_loss_target: labels`` (megatron-core's and NeMo RL's MTP loss) head ``k``'s target at
``t`` is the row's own token ``t + k + 1`` (cross-entropy, the same positions and normalisation),
and the loss's gradient reaches the trunk, the embeddings and the output layer as well, unless
``mtp_detach_heads``. With ``mtp_use_repeated_layer`` one head (the checkpoint's first) runs at
every depth, its weights shared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

DRAFT_METRIC = "mtp/draft_loss"


def build_mtp_block(config: Any, layer_spec: Any, heads: int, engine_spec: bool, repeated: bool = False) -> Any:
    """megatron-core's MTP block of ``heads`` heads, each with the decoder's (last) layer spec; with
    ``repeated``, its first head at every depth (one set of weights)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionBlock

    # the block reads its head count from its config; the GPTModel's keeps none, so that its forward
    # does not run the heads itself (it would train them with the trunk, against the labels)
    block_config = dataclasses.replace(config, mtp_num_layers=heads)
    spec = get_gpt_mtp_block_spec(block_config, layer_spec, use_transformer_engine=engine_spec)
    block = MultiTokenPredictionBlock(block_config, spec)
    if repeated:  # the parameters are named once, as the first head's (what the checkpoint holds)
        block.layers = torch.nn.ModuleList([block.layers[0]] * heads)
    return block


def heads_to_build(setting: int | None, in_checkpoint: int, model: str, *, lora: bool = False, stages: int = 1,
                   repeated: bool = False) -> int:
    """The heads ``policy.megatron_cfg.mtp_num_layers`` asks for (None: the checkpoint's), at most the
    checkpoint's (a head has no weights to start from otherwise); refused with LoRA (the base weights,
    the heads' among them, are frozen there) and over pipeline stages (the heads re-embed tokens on the
    last stage, which holds no embeddings)."""
    from corerl.sdk import ConfigError, EngineNotAvailable

    heads = in_checkpoint if setting is None else setting
    key = "policy.megatron_cfg.mtp_num_layers"
    if heads and lora:
        raise EngineNotAvailable(f"{model}'s {heads} multi-token-prediction head(s) would be trained with policy.lora, "
                                 "which freezes every base weight (the heads' too)", key=key,
                                 hint="set policy.megatron_cfg.mtp_num_layers=0 with LoRA, or train the whole model")
    if heads and stages > 1:
        raise EngineNotAvailable(f"{model}'s multi-token-prediction heads re-embed tokens on the last pipeline stage, "
                                 "which holds no embeddings", key=key,
                                 hint="set policy.megatron_cfg.pipeline_model_parallel_size=1, or mtp_num_layers=0")
    if repeated and heads and in_checkpoint:  # the checkpoint's first head at every depth
        return heads
    if heads > in_checkpoint:
        raise ConfigError(f"policy.megatron_cfg.mtp_num_layers asks for {heads} multi-token-prediction heads and "
                          f"{model} has {in_checkpoint}" + (" (or its architecture's MTP heads have no conversion "
                                                            "table)" if in_checkpoint == 0 else ""),
                          key="policy.megatron_cfg.mtp_num_layers",
                          hint=f"set it to {in_checkpoint} or less, or leave it unset (the checkpoint's heads)")
    return heads


def soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, topk: int | None) -> torch.Tensor:
    """Per position, the cross-entropy of the student's logits against the teacher's distribution
    (both ``[..., vocab]``); with ``topk``, against the teacher's ``topk`` likeliest tokens, renormalised."""
    student = student.float()
    teacher = teacher.float()
    if topk is not None:
        values, index = teacher.topk(min(topk, teacher.shape[-1]), dim=-1)
        logq = student.gather(-1, index) - student.logsumexp(-1, keepdim=True)
        return -(values.softmax(-1) * logq).sum(-1)
    return -(teacher.softmax(-1) * student.log_softmax(-1)).sum(-1)


class DraftHeads:
    """The MTP heads of one rank's GPTModel (its ``mtp`` block), their decoupled forward and loss.

    Hooks on the model keep what its forward sees (input ids, positions, the decoder's output, the
    rotary embedding) and, in training, run the heads on it after the trunk; :meth:`wrap` adds
    their loss to the policy loss of the same micro-batch."""

    def __init__(self, model: Any, settings: Any) -> None:
        self.model, self.heads = model, len(model.mtp.layers)
        self.weight = float(settings.mtp_loss_scaling_factor)
        self.labels = getattr(settings, "mtp_loss_target", "policy") == "labels"
        #: whether the loss's gradient stops at the heads (always for the policy target)
        self.detached = not self.labels or bool(getattr(settings, "mtp_detach_heads", False))
        self.topk: int | None = settings.mtp_loss_topk
        self.chunk: int | None = settings.mtp_loss_chunk_size
        self.seen: dict[str, Any] = {}
        self.pending: tuple[list[torch.Tensor], torch.Tensor] | None = None
        #: the worker's output-layer tap (:class:`corerl_megatron.training.response_head.HiddenTap`):
        #: while it is active the trunk's output is its final hidden states, and the distribution the
        #: heads are distilled from is computed from them a chunk at a time (:meth:`teacher`)
        self.tap: Any = None
        self.teacher_is_hidden = False
        model.register_forward_pre_hook(self._inputs, with_kwargs=True)
        model.decoder.register_forward_hook(lambda module, args, output: self.seen.__setitem__("hidden", output))
        if getattr(model, "rotary_pos_emb", None) is not None:
            model.rotary_pos_emb.register_forward_hook(
                lambda module, args, output: self.seen.__setitem__("rotary", output))
        model.register_forward_hook(self._after)

    def _inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        names = ("input_ids", "position_ids", "attention_mask")
        self.seen = {name: args[i] if len(args) > i else kwargs.get(name) for i, name in enumerate(names)}
        self.seen["packed_seq_params"] = kwargs.get("packed_seq_params")

    def _output_weight(self) -> torch.Tensor:
        model = self.model
        if model.share_embeddings_and_output_weights:
            return model.shared_embedding_or_output_weight()
        return model.output_layer.weight

    def _after(self, module: Any, args: Any, output: torch.Tensor) -> None:
        """In training, the heads' hidden states from the trunk's detached ones (kept for the loss)."""
        seen, model = self.seen, self.model
        self.seen = {}  # no reference to this forward's graph outlives it
        if not module.training or not torch.is_grad_enabled():
            self.pending = None
            return
        if seen["attention_mask"] is not None or seen["packed_seq_params"] is not None:
            from corerl.sdk import EngineNotAvailable

            # packed rows: the heads' shifted tokens and targets would cross from one sequence into the next
            raise EngineNotAvailable("the MTP heads' draft loss does not run on packed rows yet",
                                     key="policy.megatron_cfg.mtp_num_layers",
                                     hint="set it to 0, or policy.sequence_packing.enabled=false")
        embedding, detached = model.embedding, self.detached
        hidden = model.mtp(
            input_ids=seen["input_ids"], position_ids=seen["position_ids"],
            hidden_states=seen["hidden"].detach() if detached else seen["hidden"],
            attention_mask=seen["attention_mask"], rotary_pos_emb=seen.get("rotary"),
            packed_seq_params=seen["packed_seq_params"],
            embedding=lambda **kw: embedding(**kw).detach() if detached else embedding(**kw))
        per_depth = list(torch.chunk(hidden, 1 + self.heads, dim=0))[1:]
        self.teacher_is_hidden = self.tap is not None and self.tap.active
        self.pending = (per_depth, output.detach())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[s, b, h]`` head states -> ``[b, s, vocab]`` logits through the output layer (its weight
        detached where the loss stops at the heads)."""
        weight = self._output_weight()
        logits, _ = self.model.output_layer(hidden, weight=weight.detach() if self.detached else weight,
                                            runtime_gather_output=True)
        return logits.transpose(0, 1)

    def teacher(self, trunk: torch.Tensor) -> torch.Tensor:
        """``[b, s, vocab]`` logits of the trunk's output ``trunk``: itself, or through the output
        layer's weight (detached) where it is the trunk's final hidden states ``[b, s, h]``."""
        if not self.teacher_is_hidden:
            return trunk
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        with torch.no_grad():  # the hidden states are whole on every rank; the vocabulary is split over them
            logits = torch.nn.functional.linear(trunk, self._output_weight().detach())
            if ps.get_tensor_model_parallel_world_size() > 1:
                logits = gather_from_tensor_model_parallel_region(logits, ps.get_tensor_model_parallel_group())
        return logits

    def loss(self, mb: dict[str, torch.Tensor], normaliser: float) -> torch.Tensor:
        """The micro-batch's draft loss (see the module docstring), from the last training forward."""
        if self.pending is None:
            raise RuntimeError("the MTP draft loss needs the training forward of the same micro-batch")
        per_depth, teacher = self.pending
        self.pending = None
        mask = mb["loss_mask"].to(teacher.device)
        ids = mb["input_ids"].to(teacher.device)
        width = teacher.shape[1]
        total = teacher.new_zeros((), dtype=torch.float32)
        for k, hidden in enumerate(per_depth, start=1):
            usable = width - k - 1  # positions t whose target token t + k + 1 is in the row
            if usable <= 0:
                continue
            target = ids[:, k + 1:] if self.labels else teacher[:, k:k + usable]
            total = total + self._depth(hidden[:usable], target, mask[:, k + 1:].float())
        return total / (normaliser * self.heads)

    def _depth(self, hidden: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        def part(h: torch.Tensor, t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            if self.labels:  # the row's own tokens
                logits = self.logits(h).float()
                return (torch.nn.functional.cross_entropy(logits.transpose(1, 2), t, reduction="none") * m).sum()
            return (soft_cross_entropy(self.logits(h), self.teacher(t), self.topk) * m).sum()

        size = self.chunk if (self.labels or self.topk is None) and self.chunk else hidden.shape[0]
        if size >= hidden.shape[0]:
            return part(hidden, target, mask)
        from torch.utils.checkpoint import checkpoint

        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], size):
            end = start + size
            total = total + checkpoint(part, hidden[start:end], target[:, start:end], mask[:, start:end],
                                       use_reentrant=False)
        return total

    def wrap(self, loss_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``loss_fn`` plus ``w *`` the draft loss of the same micro-batch; its value as ``mtp/draft_loss``."""
        def with_draft(logprobs: torch.Tensor, mb: dict[str, torch.Tensor], normaliser: float) -> Any:
            loss, metrics = loss_fn(logprobs, mb, normaliser)
            draft = self.loss(mb, normaliser)
            return loss + self.weight * draft, {**metrics, DRAFT_METRIC: float(draft.detach())}

        return with_draft

