"""Cross-field rules that several backends' schemas share."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any


def parallel_sizes_divide_world(key: str, sizes: Mapping[str, int], config: Any) -> Iterator[tuple[str, str]]:
    """The product of model-parallel ``sizes`` must divide the world size; reported at ``key``."""
    world = config.cluster.world_size
    product = math.prod(sizes.values())
    if world % product:
        yield (
            key,
            f"{' x '.join(sizes)} ({product}) must divide the world size "
            f"cluster.num_nodes x cluster.gpus_per_node ({world})",
        )
