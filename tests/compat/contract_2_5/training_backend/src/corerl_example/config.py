"""``policy.example_cfg``: the section this backend owns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from corerl.sdk import setting


@attrs.define(kw_only=True)
class ExampleConfig:
    """Settings of the example backend; ``enabled: true`` makes it a candidate."""

    enabled: bool = setting(False)
    shards: int = setting(1, min=1, help="how many pieces the model is cut into")

    def check(self, config: Any) -> Iterator[tuple[str, str]]:
        """Cross-field rules: (key relative to this section, message) per problem."""
        if config.cluster.world_size % self.shards:
            yield ("shards", f"must divide the world size ({config.cluster.world_size}), got {self.shards}")
