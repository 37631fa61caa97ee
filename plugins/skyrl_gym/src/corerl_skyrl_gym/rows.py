"""What corerl-skyrl-gym's own environments read from a dataset row in SkyRL's layout."""

from __future__ import annotations

from typing import Any


def ground_truth(extras: dict[str, Any] | None, environment: str, what: str) -> Any:
    """The row's ``reward_spec.ground_truth``; a row without it is refused, naming the
    ``environment`` and ``what`` the truth is (the answer, the product, ...)."""
    spec = (extras or {}).get("reward_spec")
    if not isinstance(spec, dict) or "ground_truth" not in spec:
        raise ValueError(f"the {environment} environment needs the row's reward_spec.ground_truth ({what})")
    return spec["ground_truth"]
