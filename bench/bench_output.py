"""Where a benchmark writes its JSON: ``bench/results/`` (the committed figures), or the folder
``CORERL_BENCH_RESULTS`` names (the slow test that runs every benchmark at its smallest setting
writes there, leaving the committed figures alone)."""

from __future__ import annotations

import os
from pathlib import Path


def results_path(name: str) -> Path:
    """The path benchmark results file ``name`` is written to."""
    folder = os.environ.get("CORERL_BENCH_RESULTS")
    return Path(folder) / name if folder else Path(__file__).parent / "results" / name
