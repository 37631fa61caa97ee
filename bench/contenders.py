"""What the benchmarks share: timing a Hugging Face trainer's steps from a callback, timing a corerl
training backend's train steps,
the tiny model's shape for ``--hidden``/``--layers``, the ``--contenders`` subset a run measures, running one contender in a fresh process
(its stderr shown as it comes and kept for the error report), and the machine and package
versions a result was measured with."""

from __future__ import annotations

import collections
import json
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STDERR_TAIL = 40  # lines of a failed child's stderr kept in its CalledProcessError


def step_clock(times: list[float]) -> Any:
    """A ``TrainerCallback`` appending each optimizer step's wall time to ``times``."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append(time.perf_counter() - self.start)

    return StepClock()


def train_step_seconds(backend: Any, batch: Any, loss_fn: Any, steps: int) -> list[float]:
    """Seconds of each of ``steps`` train steps of a loaded corerl training ``backend`` on ``batch``,
    after one untimed warm-up step."""
    backend.train_step(batch, loss_fn)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        backend.train_step(batch, loss_fn)
        times.append(time.perf_counter() - start)
    return times


def model_shape(base: dict[str, int], hidden: int, layers: int) -> dict[str, int]:
    """``base`` resized to ``hidden`` x ``layers`` (MLP twice the width, heads of 64, KV heads of 128)."""
    return {**base, "hidden_size": hidden, "num_layers": layers, "intermediate_size": 2 * hidden,
            "num_heads": max(4, hidden // 64), "num_kv_heads": max(2, hidden // 128)}


def pick_contenders(given: str | None, known: Sequence[str], default: Sequence[str], parser: Any) -> list[str]:
    """The contenders a ``--contenders a,b`` argument names, in order (``default`` when it is
    unset); an unknown name is a usage error naming the known ones."""
    if not given:
        return list(default)
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--contenders: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def run_contender(script: str, name: str, model: str, folder: Path, args: Any, env: dict[str, str],
                  extra: Sequence[str] = ()) -> tuple[dict[str, Any], float]:
    """``script --contender name ... *extra`` in a fresh process; its JSON result and the wall
    seconds it took. Its stdout is dropped; its stderr passes through to ours, and a failure
    raises ``CalledProcessError`` carrying the last lines of it."""
    out = folder / f"{name}.json"
    print(f"running {name} ({args.steps} steps) ...", flush=True)
    command = [sys.executable, script, "--contender", name, "--model", model, "--out", str(out),
               "--steps", str(args.steps), "--threads", str(args.threads), "--device", args.device, *extra]
    start = time.perf_counter()
    code, tail = _run_teeing_stderr(command, env)
    if code != 0:
        raise subprocess.CalledProcessError(code, command, stderr=tail)
    return json.loads(out.read_text()), time.perf_counter() - start


def _run_teeing_stderr(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``command``; copy its stderr to ours line by line; its exit code and last stderr lines."""
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          text=True, errors="replace") as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line)
    sys.stderr.flush()
    return proc.returncode, "".join(tail)


def failure_text(exc: subprocess.CalledProcessError) -> str:
    """A failed contender's exit status and the last of its stderr, for its result row."""
    return f"exit status {exc.returncode}: {(exc.stderr or '').strip()}"


def machine(device: str, threads: int) -> dict[str, Any]:
    """Where the benchmark ran: the GPU and CUDA version on ``cuda``, the CPU otherwise."""
    import torch

    info: dict[str, Any] = {"device": device, "threads": threads, "cpu": platform.processor() or platform.machine(),
                            "python": platform.python_version()}
    if device == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(), "gpu_count": torch.cuda.device_count(),
                 "cuda": torch.version.cuda}
    return info


def versions(packages: Sequence[str] = ("torch", "transformers", "trl", "accelerate", "corerl")) -> dict[str, str | None]:
    """The installed version of each of ``packages`` (None where it is not installed)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found
