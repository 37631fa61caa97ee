"""The one driver-side dispatch of a call to a worker group's ranks, in three modes (in the
manner of verl's dispatch modes):

- :attr:`Dispatch.ALL`: the same arguments to every rank; every rank's answer, by rank.
- :attr:`Dispatch.SPLIT_BY_DP`: one part per data-parallel rank; each rank gets its data-parallel
  rank's part (the ranks of one tensor- or pipeline-parallel group share it), and the answers of
  the ranks that report for their data-parallel group come back in data-parallel order.
- :attr:`Dispatch.ONE_RANK`: the same arguments to every rank (collectives need them all);
  the answer of the first rank only.

:class:`RankLayout` says which data-parallel rank each rank belongs to and which ranks report.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import attrs


class Dispatch(enum.Enum):
    """How a call reaches the ranks and how their answers come back (see the module docstring)."""

    ALL = "all"
    SPLIT_BY_DP = "split_by_dp"
    ONE_RANK = "one_rank"


@attrs.frozen
class RankLayout:
    """Per rank: its data-parallel rank and whether it reports its data-parallel group's answer."""

    data_parallel_rank: tuple[int, ...] = attrs.field(converter=tuple)
    reports: tuple[bool, ...] = attrs.field(converter=tuple)

    @classmethod
    def data_parallel(cls, world_size: int) -> RankLayout:
        """Every rank its own data-parallel rank (ZeRO, plain DDP)."""
        return cls(range(world_size), [True] * world_size)

    @classmethod
    def tensor_parallel(cls, world_size: int, tensor_parallel_size: int) -> RankLayout:
        """Consecutive ranks form a tensor-parallel group; its first rank reports."""
        return cls([rank // tensor_parallel_size for rank in range(world_size)],
                   [rank % tensor_parallel_size == 0 for rank in range(world_size)])

    @property
    def world_size(self) -> int:
        return len(self.data_parallel_rank)

    @property
    def data_parallel_size(self) -> int:
        return max(self.data_parallel_rank) + 1


def dispatch(group: Any, layout: RankLayout, mode: Dispatch, method: str, *args: Any,
             parts: Sequence[Any] | None = None) -> Any:
    """Call ``method`` on the ranks of ``group`` in ``mode``. With :attr:`Dispatch.SPLIT_BY_DP`,
    ``parts[d]`` goes first in the arguments of the ranks of data-parallel rank ``d``, before
    ``args``; the other modes take no ``parts``."""
    if mode is Dispatch.SPLIT_BY_DP:
        if parts is None or len(parts) != layout.data_parallel_size:
            raise ValueError(f"{method}: {layout.data_parallel_size} parts needed (one per data-parallel rank), "
                             f"got {None if parts is None else len(parts)}")
        results = group.call_per_rank(method, [(parts[d], *args) for d in layout.data_parallel_rank])
        by_dp = {layout.data_parallel_rank[r]: out for r, out in enumerate(results) if layout.reports[r]}
        return [by_dp[d] for d in range(layout.data_parallel_size)]
    if parts is not None:
        raise ValueError(f"{method}: parts go with Dispatch.SPLIT_BY_DP only")
    results = group.call(method, *args)
    return results if mode is Dispatch.ALL else results[0]
