"""How a batch becomes each data-parallel rank's micro-batches, and how per-micro-batch
outputs are put back in the batch's row order.

Three layouts, picked by the config:

- ``rows`` (default): contiguous equal shards per rank, ``policy.train_micro_batch_size``
  rows per micro-batch, every row at the batch's full width;
- ``dynamic`` (``policy.dynamic_batching.enabled``): rows balanced across ranks by token
  count (Karmarkar-Karp), then grouped longest first so that rows x longest row stays within
  the token budget, each micro-batch cut to its longest row;
- ``packed`` (``policy.sequence_packing.enabled``): rows balanced across ranks likewise,
  then the selected packer fills bins of at most the token budget; each bin is one row of
  concatenated sequences with ``position_ids`` restarting at 0 per sequence (no padding, no
  attention across sequences: see :func:`corerl.training.logprobs.model_logprobs`).

Rows that share a ``group_ids`` value (a per-token field, constant along a row; DPO's pairs)
form one unit in every layout: the same rank, the same micro-batch, adjacent in a packed row,
because their loss is not a sum over their tokens. A unit larger than the micro-batch size
gets a micro-batch of its own.

Every rank gets the same number of micro-batches (ranks with fewer get empty ones whose loss
and gradient are zero), because FSDP and tensor parallelism run collectives per forward.
Fields of shape ``[B, T, ...]`` are per token and move with their tokens; other row-shaped
fields are refused in the packed layout (a packed row holds several rows).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from corerl.errors import ConfigError
from corerl.models.facts import model_shape
from corerl.packing import algorithms as packing_algorithms
from corerl.packing.algorithms import CORE_PACKERS, karmarkar_karp
from corerl.packing.contract import check_bins, check_budget
from corerl.training.batching import batch_rows, micro_batches, shard_rows
from corerl.training.image_rows import IMAGE_FIELDS

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from corerl.packing.contract import Packer
    from corerl.training.contract import Batch
    from corerl.training.recipe_config import RecipeConfig

Layout = Literal["rows", "dynamic", "packed"]
Purpose = Literal["train", "logprobs"]


@attrs.frozen
class Placement:
    """Where the tokens of one batch row sit: micro-batch ``micro_batch`` of its rank, row
    ``row``, columns ``start`` to ``start + length``."""

    source_row: int
    micro_batch: int
    row: int
    start: int
    length: int


@attrs.define
class MicroBatchPlan:
    """Each data-parallel rank's micro-batches (equal counts) and where every batch row went."""

    per_rank: list[list[Batch]]
    placements: list[list[Placement]]
    rows: int
    width: int
    real_tokens: int
    slots: int

    @property
    def efficiency(self) -> float:
        """Real tokens over the token slots the forward passes process."""
        return self.real_tokens / self.slots if self.slots else 1.0

    def unpack(self, outputs: Sequence[Sequence[torch.Tensor]]) -> torch.Tensor:
        """Per-token outputs ``outputs[rank][micro_batch]`` (``[rows, width, ...]``) back into the
        batch's ``[B, T, ...]`` layout, float32; padding stays 0."""
        import torch

        trailing = next((tuple(o.shape[2:]) for answers in outputs for o in answers), ())
        out = torch.zeros((self.rows, self.width, *trailing), dtype=torch.float32)
        for rank, placements in enumerate(self.placements):
            for p in placements:
                out[p.source_row, : p.length] = outputs[rank][p.micro_batch][p.row, p.start : p.start + p.length]
        return out


def logits_token_cap(config: RecipeConfig) -> int:
    """How many tokens one forward may score within ``policy.max_logits_mb``: their fp32 logits and
    log-softmax take ``2 x 4 x tokens x vocabulary`` bytes. Unbounded where the vocabulary is not
    known here (a model whose config cannot be read before it loads)."""
    shape = model_shape(config)
    if shape is None:
        return 1 << 62
    return max(1, config.core.policy.max_logits_mb * 2**20 // (8 * shape.vocab))


def _capped(asked: int, cap: int, key: str, config: RecipeConfig) -> int:
    """``asked``, or ``cap`` with a warning where the logits of ``asked`` would not fit."""
    if asked <= cap:
        return asked
    log.warning("%s: %d would hold more than policy.max_logits_mb=%d MiB of logits (vocabulary %d); using %d",
                key, asked, config.core.policy.max_logits_mb, _vocab(config), cap)
    return cap


def _vocab(config: RecipeConfig) -> int:
    shape = model_shape(config)
    return shape.vocab if shape is not None else 0


@attrs.define
class MicroBatcher:
    """Plans micro-batches in one layout; build it with :meth:`from_config`."""

    layout: Layout = "rows"
    train_rows: int = 4
    logprob_rows: int = 4
    train_tokens: int = 4096
    logprob_tokens: int = 4096
    packer: Packer | None = None
    packer_id: str = ""

    @classmethod
    def from_config(cls, config: RecipeConfig) -> MicroBatcher:
        """The layout, sizes and packer the recipe asks for (``policy.sequence_packing``,
        ``policy.dynamic_batching``, ``policy.*micro_batch_size``)."""
        policy = config.core.policy
        logprob_rows = policy.logprob_micro_batch_size or policy.train_micro_batch_size
        packing, dynamic = policy.sequence_packing, policy.dynamic_batching
        settings = packing if packing.enabled else dynamic
        most = logits_token_cap(config)  # the tokens whose logits fit policy.max_logits_mb
        width = policy.max_seq_length
        train_rows = _capped(policy.train_micro_batch_size, max(1, most // width), "policy.train_micro_batch_size", config)
        logprob_rows = _capped(logprob_rows, max(1, most // width), "policy.logprob_micro_batch_size", config)
        section = "policy.sequence_packing" if packing.enabled else "policy.dynamic_batching"
        train_tokens = settings.train_mb_tokens or train_rows * width
        logprob_tokens = settings.logprob_mb_tokens or logprob_rows * width
        return cls(
            layout="packed" if packing.enabled else "dynamic" if dynamic.enabled else "rows",
            train_rows=train_rows,
            logprob_rows=logprob_rows,
            train_tokens=_capped(train_tokens, max(width, most), f"{section}.train_mb_tokens", config),
            logprob_tokens=_capped(logprob_tokens, max(width, most), f"{section}.logprob_mb_tokens", config),
            packer=resolve_packer(config) if packing.enabled else None,
            packer_id=packing.algorithm if packing.enabled else "",
        )

    def _budget_key(self, purpose: Purpose) -> str:
        section = "sequence_packing" if self.layout == "packed" else "dynamic_batching"
        return f"policy.{section}.{'train' if purpose == 'train' else 'logprob'}_mb_tokens"

    def plan(self, batch: Batch, ranks: int, purpose: Purpose = "train") -> MicroBatchPlan:
        """Micro-batches of ``batch`` for ``ranks`` data-parallel ranks."""
        rows, width = batch_rows(batch), int(batch["input_ids"].shape[1])
        lengths = [int(n) for n in batch["attention_mask"].sum(dim=1).tolist()]
        units = _units(batch, self.layout == "rows")
        if self.layout == "rows":
            size = self.train_rows if purpose == "train" else self.logprob_rows
            if len(units) == rows:
                return self._plan_rows(batch, ranks, size, sum(lengths))
            return self._plan_unit_rows(batch, units, ranks, size, sum(lengths))
        budget = self.train_tokens if purpose == "train" else self.logprob_tokens
        key = self._budget_key(purpose)
        check_budget(lengths, budget, key)
        if self.layout == "packed":
            _refuse_row_fields(batch, rows, width)
            unit_tokens = [sum(lengths[i] for i in unit) for unit in units]
        else:
            unit_tokens = [len(unit) * max(lengths[i] for i in unit) for unit in units]
        if max(unit_tokens, default=0) > budget:
            raise ConfigError(f"a group of rows that must share a micro-batch (e.g. a preference pair) takes "
                              f"{max(unit_tokens)} tokens, over the micro-batch budget of {budget}", key=key,
                              hint=f"raise it, e.g. {key}={max(unit_tokens)}")
        per_rank: list[list[Batch]] = []
        placements: list[list[Placement]] = []
        slots = 0
        for members in karmarkar_karp(unit_tokens, ranks):
            rank_units = [units[u] for u in members]
            if self.layout == "packed":
                mbs, places, used = self._pack_rank(batch, rank_units, lengths, budget)
            else:
                mbs, places, used = self._group_rank(batch, rank_units, lengths, budget)
            per_rank.append(mbs)
            placements.append(places)
            slots += used
        _even_out(per_rank, batch, packed=self.layout == "packed")
        return MicroBatchPlan(per_rank, placements, rows, width, sum(lengths), slots)

    def _plan_rows(self, batch: Batch, ranks: int, size: int, real_tokens: int) -> MicroBatchPlan:
        width = int(batch["input_ids"].shape[1])
        per_rank, placements = [], []
        for rank, shard in enumerate(shard_rows(batch, ranks)):
            mbs = micro_batches(shard, size)
            first = rank * batch_rows(shard)
            placements.append([Placement(first + index * size + row, index, row, 0, width)
                               for index, mb in enumerate(mbs) for row in range(batch_rows(mb))])
            per_rank.append(mbs)
        return MicroBatchPlan(per_rank, placements, batch_rows(batch), width, real_tokens, batch_rows(batch) * width)

    def _plan_unit_rows(self, batch: Batch, units: list[list[int]], ranks: int, size: int,
                        real_tokens: int) -> MicroBatchPlan:
        """Contiguous equal shards of whole units per rank, micro-batches of whole units."""
        if len(units) % ranks:
            raise ConfigError(
                f"a batch of {len(units)} row groups (e.g. preference pairs) cannot be split evenly across "
                f"{ranks} data-parallel ranks", key="algorithm.batch_size",
                hint="make the number of pairs a step takes a multiple of the data-parallel size")
        width = int(batch["input_ids"].shape[1])
        share = len(units) // ranks
        per_rank, placements = [], []
        for rank in range(ranks):
            chunks: list[list[int]] = []
            for unit in units[rank * share:(rank + 1) * share]:
                if chunks and len(chunks[-1]) + len(unit) <= size:
                    chunks[-1].extend(unit)
                else:
                    chunks.append(list(unit))
            per_rank.append([_select_rows(batch, chunk, width) for chunk in chunks])
            placements.append([Placement(source, number, row, 0, width)
                               for number, chunk in enumerate(chunks) for row, source in enumerate(chunk)])
        return MicroBatchPlan(per_rank, placements, batch_rows(batch), width, real_tokens, batch_rows(batch) * width)

    def _group_rank(self, batch: Batch, units: list[list[int]], lengths: list[int], budget: int) -> tuple[list[Batch], list[Placement], int]:
        def longest(unit: list[int]) -> int:
            return max(lengths[i] for i in unit)

        order = sorted(units, key=lambda unit: (-longest(unit), unit[0]))
        groups: list[list[int]] = []
        for unit in order:  # longest first, so a group's first unit holds its widest row
            if groups and (len(groups[-1]) + len(unit)) * lengths[groups[-1][0]] <= budget:
                groups[-1].extend(unit)
            else:
                groups.append(sorted(unit, key=lambda i: (-lengths[i], i)))
        mbs, places, used = [], [], 0
        for number, group in enumerate(groups):
            cut = lengths[group[0]]
            mbs.append(_select_rows(batch, group, cut))
            places.extend(Placement(source, number, row, 0, cut) for row, source in enumerate(group))
            used += cut * len(group)
        return mbs, places, used

    def _pack_rank(self, batch: Batch, units: list[list[int]], lengths: list[int], budget: int) -> tuple[list[Batch], list[Placement], int]:
        assert self.packer is not None
        local = [sum(lengths[i] for i in unit) for unit in units]
        bins = self.packer.pack(local, budget)
        check_bins(bins, local, budget, self.packer_id)
        mbs, places, used = [], [], 0
        for number, members_of_bin in enumerate(bins):
            sources = [row for i in members_of_bin for row in units[i]]
            mbs.append(_pack_rows(batch, sources, lengths))
            start = 0
            for source in sources:
                places.append(Placement(source, number, 0, start, lengths[source]))
                start += lengths[source]
            used += budget
        return mbs, places, used


def _units(batch: Batch, contiguous: bool) -> list[list[int]]:
    """The rows that must stay together, in first-row order: rows sharing a ``group_ids`` value
    (read at each row's first token), else every row alone. ``contiguous``: a group's rows must
    be adjacent (the rows layout shards and cuts the batch in order)."""
    rows = batch_rows(batch)
    if "group_ids" not in batch:
        return [[row] for row in range(rows)]
    ids = batch["group_ids"]
    firsts = (ids[:, 0] if ids.dim() > 1 else ids).tolist()
    units: dict[int, list[int]] = {}
    for row, group in enumerate(firsts):
        unit = units.setdefault(int(group), [])
        if contiguous and unit and unit[-1] != row - 1:
            raise ValueError(f"rows of group {group} are not adjacent: the rows layout keeps a group "
                             "together only when its rows follow each other")
        unit.append(row)
    return list(units.values())




def resolve_packer(config: RecipeConfig) -> Packer:
    """The packer ``policy.sequence_packing.algorithm`` names: the registration selection
    resolved (see :func:`corerl.config.selection.select`, which puts it in ``config.components``),
    else, for a config built without selection, the core's own packer of that id."""
    packer_id = config.core.policy.sequence_packing.algorithm
    registration = config.components.get("sequence_packer")
    if registration is None or registration.id != packer_id:
        if packer_id in CORE_PACKERS:
            return getattr(packing_algorithms, CORE_PACKERS[packer_id][0])()
        raise ConfigError(f"no sequence packer {packer_id!r} was selected for this config",
                          key="policy.sequence_packing.algorithm",
                          hint="`corerl plugins` lists the packers; install the plugin that provides it, and build the "
                               "config through selection (corerl.testing.select_for), which resolves it")
    packer = registration.create()
    if not callable(getattr(packer, "pack", None)):
        raise ConfigError(f"sequence packer {packer_id!r} (plugin {registration.plugin!r}) built an object without pack()",
                          key="policy.sequence_packing.algorithm", hint="its factory must return an object with pack(lengths, budget)")
    return packer


def _per_row(value: Any, rows: int) -> bool:
    return getattr(value, "dim", lambda: 0)() >= 1 and value.shape[0] == rows


def _per_token(value: Any, rows: int, width: int, key: str = "") -> bool:
    return key not in IMAGE_FIELDS and _per_row(value, rows) and value.dim() >= 2 and value.shape[1] == width


def _refuse_row_fields(batch: Batch, rows: int, width: int) -> None:
    for key, value in batch.items():
        if _per_row(value, rows) and not _per_token(value, rows, width, key):
            raise ValueError(f"batch field {key!r} of shape {tuple(value.shape)} is per row, not per token: "
                             "sequence packing moves [B, T, ...] fields only; expand it over the tokens")


def _select_rows(batch: Batch, sources: list[int], cut: int) -> Batch:
    import torch

    rows, width = batch_rows(batch), int(batch["input_ids"].shape[1])
    index = torch.tensor(sources, dtype=torch.long)
    out = {}
    for key, value in batch.items():
        if _per_token(value, rows, width, key):
            out[key] = value.index_select(0, index)[:, :cut].contiguous()
        elif _per_row(value, rows):
            out[key] = value.index_select(0, index)
        else:
            out[key] = value
    return out


def _pack_rows(batch: Batch, sources: list[int], lengths: list[int]) -> Batch:
    import torch

    rows, width = batch_rows(batch), int(batch["input_ids"].shape[1])
    out: Batch = {}
    for key, value in batch.items():
        if _per_token(value, rows, width):
            out[key] = torch.cat([value[s, : lengths[s]] for s in sources]).unsqueeze(0)
        else:
            out[key] = value
    out["position_ids"] = torch.cat([torch.arange(lengths[s]) for s in sources]).unsqueeze(0)
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    if "loss_mask" in out:  # a sequence's first token has no context: never in the loss
        out["loss_mask"] = out["loss_mask"] * (out["position_ids"] != 0).to(out["loss_mask"].dtype)
    return out


def _empty_micro_batch(batch: Batch, packed: bool) -> Batch:
    import torch

    rows, width = batch_rows(batch), int(batch["input_ids"].shape[1])
    out: Batch = {}
    for key, value in batch.items():
        if _per_token(value, rows, width, key):
            out[key] = torch.zeros((1, 1, *value.shape[2:]), dtype=value.dtype)
        elif _per_row(value, rows):
            out[key] = torch.zeros((1, *value.shape[1:]), dtype=value.dtype)
        else:
            out[key] = value
    out["attention_mask"] = torch.ones((1, 1), dtype=batch["attention_mask"].dtype)
    if packed:
        out["position_ids"] = torch.zeros((1, 1), dtype=torch.long)
    return out


def _even_out(per_rank: list[list[Batch]], batch: Batch, packed: bool) -> None:
    most = max((len(mbs) for mbs in per_rank), default=0)
    for mbs in per_rank:
        while len(mbs) < most:
            mbs.append(_empty_micro_batch(batch, packed))
