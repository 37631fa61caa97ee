"""What a dead rank costs: seconds from its death to the next completed step, and the work lost,
with in-run recovery (``run.max_restarts``) against a person rerunning the command at once.

    .venv/bin/python bench/recovery.py                          # dtensor, deepspeed ZeRO-3, megatron TP 2
    .venv/bin/python bench/recovery.py --backends dtensor --contenders in-run   # the smoke

Each backend runs the demo (``builtin:tiny-qwen2``, digit_echo) as GRPO at world size 2 on CPU:
``--steps`` steps, a checkpoint after every ``--save-period``, hf generation. Rank 1 dies
(SIGKILL) inside the training step of step ``--kill-step``, through the fault-injection markers
(:mod:`corerl.progress_markers`). Contenders:

- in-run: ``run.max_restarts=1``; the run tears its workers down, restarts them from the last
  complete checkpoint and goes on by itself;
- rerun: the run stops as it does by default (``run.max_restarts=0``, in one line) and the same
  command is started the moment it has exited (the best a person or a job scheduler watching it
  can do), resuming from the same checkpoint.

Death to next step: from the moment the rank is killed (the marker written just before the
SIGKILL) to the next step's row, the step that was under way redone. Work lost: completed steps
redone (those since the last checkpoint) and the seconds they had taken. The ratio is rerun's
seconds over in-run's, both measured in this run. Writes bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_output import results_path

RESULTS = results_path("recovery.json")
REPO = Path(__file__).resolve().parents[1]
CORERL = Path(sys.executable).with_name("corerl")
BACKENDS = {
    "dtensor": ("training worker", ["policy.training_backend=dtensor"]),
    "deepspeed ZeRO-3": ("deepspeed worker", ["policy.deepspeed_cfg.enabled=true", "policy.deepspeed_cfg.zero_stage=3"]),
    "megatron TP 2": ("megatron worker", ["policy.megatron_cfg.enabled=true",
                                          "policy.megatron_cfg.tensor_model_parallel_size=2"]),
}
CONTENDERS = ("in-run", "rerun")


class MarkerClock:
    """Stamps each line of a markers file with the time it was first seen (polled every 10 ms)."""

    def __init__(self, path: Path) -> None:
        self.path, self.seen = path, []  # (seconds since the epoch, line)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._read()
            time.sleep(0.01)

    def _read(self) -> None:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        now = time.time()
        self.seen += [(now, line) for line in lines[len(self.seen):]]

    def stop(self) -> list[tuple[float, str]]:
        self._stop.set()
        self._thread.join()
        self._read()
        return self.seen


def command(work: Path, name: str, backend: str, args: argparse.Namespace, *extra: str) -> list[str]:
    return [str(CORERL), "run", f"run.output_dir={work}", f"run.name={name}", "sft.enabled=false",
            f"algorithm.max_steps={args.steps}", "algorithm.batch_size=4", "algorithm.num_generations_per_prompt=4",
            "checkpointing.enabled=true", f"checkpointing.save_period={args.save_period}", "checkpointing.keep_last=1",
            "cluster.gpus_per_node=2", "policy.generation.backend=hf", "run.tensorboard=false",
            *BACKENDS[backend][1], *extra]


def run(cmd: list[str], markers: Path, faults: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORERL_PROGRESS_MARKERS": str(markers), "CORERL_TEST_FAULTS": faults}
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1200)


def step_seconds(seen: list[tuple[float, str]]) -> dict[int, float]:
    """Seconds each GRPO step took before the kill (from the previous step's row, or the first call)."""
    rows = [(t, int(line.rsplit(":", 1)[1])) for t, line in seen if line.startswith("grpo:step:")]
    return {step: t - before for (before, _), (t, step) in zip(rows, rows[1:], strict=False)}


def measure(backend: str, contender: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    role = BACKENDS[backend][0]
    # counted from the run's start: the kill lands in the training step of step --kill-step
    fault = f"kill:{role} 1:train_step#{args.kill_step}"
    markers = work / f"markers-{backend.split()[0]}-{contender}"
    clock = MarkerClock(markers)
    name = f"{backend.split()[0]}-{contender}"
    restarts = "run.max_restarts=1" if contender == "in-run" else "run.max_restarts=0"
    first = run(command(work, name, backend, args, restarts), markers, fault)
    again = None
    if contender == "rerun":
        assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-2000:]
        again = run(command(work, name, backend, args), markers, "")  # the same command, at once
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    else:
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    seen = clock.stop()
    died = next(t for t, line in seen if line == f"fault:{fault}")
    after = [(t, line) for t, line in seen if t >= died and line.startswith("grpo:step:")]
    next_step_t, next_step = after[0][0], int(after[0][1].rsplit(":", 1)[1])
    done_before = max((int(line.rsplit(":", 1)[1]) for t, line in seen if t < died and line.startswith("grpo:step:")),
                      default=0)
    redone = done_before - (next_step - 1)  # completed steps run again
    seconds = step_seconds([(t, line) for t, line in seen if t < died])
    return {"backend": backend, "contender": contender, "death_to_next_step_s": round(next_step_t - died, 2),
            "steps_redone": redone, "work_lost_s": round(sum(seconds.get(s, 0.0) for s in range(next_step, done_before + 1)), 2),
            "killed_in_step": done_before + 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", choices=sorted(BACKENDS), default=list(BACKENDS),
                        metavar="BACKEND", help=f"of {', '.join(BACKENDS)}")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-period", type=int, default=2)
    parser.add_argument("--kill-step", type=int, default=4, help="the step whose training the kill lands in")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="corerl-recovery-") as folder:
        for backend in args.backends:
            for contender in args.contenders:
                row = measure(backend, contender, Path(folder), args)
                rows.append(row)
                print(f"  {backend:18} {contender:7} {row['death_to_next_step_s']:7.1f} s", flush=True)
    table = [f"{'backend':18} {'contender':9} {'death -> next step':>19} {'steps redone':>13} {'work lost':>10} {'rerun / in-run':>15}"]
    for row in rows:
        base = next((r for r in rows if r["backend"] == row["backend"] and r["contender"] == "in-run"), None)
        ratio = (f"{row['death_to_next_step_s'] / base['death_to_next_step_s']:.2f}x" if base is not None
                 and row["contender"] == "rerun" else "")
        row["ratio_to_in_run"] = ratio
        table.append(f"{row['backend']:18} {row['contender']:9} {row['death_to_next_step_s']:17.1f} s "
                     f"{row['steps_redone']:13d} {row['work_lost_s']:8.1f} s {ratio:>15}")
    print("\n".join(table))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"settings": vars(args), "machine": f"{os.cpu_count()} CPU cores", "rows": rows},
                                  indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
