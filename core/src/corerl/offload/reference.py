"""The frozen reference model's offload: on the accelerator only while it scores."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from corerl.offload.schedule import PARAMETERS


class ReferenceOffload:
    """With ``enabled`` (``policy.reference.cpu_offload``) the reference backend's parameters
    leave the accelerator at once and come back only inside :meth:`scoring`."""

    def __init__(self, reference: Any, enabled: bool) -> None:
        self.reference = reference
        self.enabled = enabled
        if enabled:
            reference.offload([PARAMETERS])

    @contextlib.contextmanager
    def scoring(self) -> Iterator[Any]:
        """The reference backend, on the accelerator for the duration of the block."""
        if self.enabled:
            self.reference.reload([PARAMETERS])
        try:
            yield self.reference
        finally:
            if self.enabled:
                self.reference.offload([PARAMETERS])
