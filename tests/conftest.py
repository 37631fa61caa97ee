"""Shared helpers: running the real ``corerl`` command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "configs"
CORERL = Path(sys.executable).with_name("corerl")


def clean_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without any CORERL_* variable, plus ``extra``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("CORERL_")}
    env.update(extra or {})
    return env


class CliResult:
    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self) -> Any:
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def run_corerl(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> CliResult:
    """Run the installed ``corerl`` console script."""
    proc = subprocess.run(
        [str(CORERL), *args], capture_output=True, text=True, env=dict(env) if env is not None else clean_env(),
        cwd=cwd or REPO, timeout=600,
    )
    return CliResult(proc)


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    """A small valid recipe file."""
    path = tmp_path / "recipe.yaml"
    path.write_text("cluster:\n  gpus_per_node: 2\npolicy:\n  model_name: some/model\n", encoding="utf-8")
    return path
