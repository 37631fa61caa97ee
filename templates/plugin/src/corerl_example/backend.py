"""The engine behind the ``example`` backend; imported only when the backend is built."""

from __future__ import annotations

from typing import Any


class ExampleBackend:
    """Holds the validated config; the training-backend methods follow corerl's contract."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.settings = config.section("policy.example_cfg")
