"""A broken vLLM install: `corerl plugins` keeps working; selecting vllm fails in one line naming the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CORERL = Path(sys.executable).with_name("corerl")


def test_broken_vllm_is_reported_in_one_line_when_selected(tmp_path, fake_site):
    fake_site.add_distribution("vllm", "99.0", files={
        "vllm/__init__.py": "raise ImportError('libcuda.so.1: cannot open shared object file')\n",
    })
    env = fake_site.env({k: v for k, v in os.environ.items() if not k.startswith("CORERL_")})
    listing = subprocess.run([str(CORERL), "plugins", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert listing.returncode == 0 and '"vllm"' in listing.stdout

    recipe = tmp_path / "r.yaml"
    recipe.write_text("policy:\n  model_name: builtin:tiny-qwen2\n", encoding="utf-8")
    run = subprocess.run([str(CORERL), "run", str(recipe), "policy.generation.backend=vllm",
                          f"run.output_dir={tmp_path / 'runs'}"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("corerl: error:")]
    assert len(errors) == 1 and "Traceback" not in run.stderr.split("corerl: error:")[-1]
    line = errors[0]
    assert "generation backend 'vllm' cannot start: vLLM failed to import (ImportError: libcuda.so.1" in line
    assert "pip install './plugins/vllm_gen[cpu]'" in line
