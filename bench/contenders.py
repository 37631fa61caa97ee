"""What the benchmarks against TRL share: timing a Hugging Face trainer's steps from a callback,
the tiny model's shape for ``--hidden``/``--layers``, and running one contender in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def step_clock(times: list[float]) -> Any:
    """A ``TrainerCallback`` appending each optimizer step's wall time to ``times``."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

    return StepClock()


def model_shape(base: dict[str, int], hidden: int, layers: int) -> dict[str, int]:
    """``base`` resized to ``hidden`` x ``layers`` (MLP twice the width, heads of 64, KV heads of 128)."""
    return {**base, "hidden_size": hidden, "num_layers": layers, "intermediate_size": 2 * hidden,
            "num_heads": max(4, hidden // 64), "num_kv_heads": max(2, hidden // 128)}


def run_contender(script: str, name: str, model: str, folder: Path, args: Any, env: dict[str, str]) -> tuple[dict[str, Any], float]:
    """``script --contender name`` in a fresh process; its JSON result and the wall seconds it took."""
    out = folder / f"{name}.json"
    print(f"running {name} ({args.steps} steps) ...", flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, script, "--contender", name, "--model", model, "--out", str(out),
                    "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    return json.loads(out.read_text()), time.perf_counter() - start
