"""Train-step tokens/s of a tiny mixture-of-experts model: one process, data parallel at 2 ranks,
and expert parallelism at 2 ranks, per training backend.

    .venv/bin/python bench/moe.py                          # dtensor rows
    .venv/bin/python bench/moe.py --backends dtensor,megatron

A tiny Qwen3-MoE (``--hidden``, ``--layers``, ``--experts`` experts, top-2), fp32, AdamW, one
fixed batch of ``--rows`` x ``--seq`` tokens. Each layout builds its backend (2 Ray ranks over
gloo for the 2-rank rows, each rank given half the machine's threads), loads the model, runs one
warm-up step, then ``--steps`` timed steps; the table gives the median step's tokens/s and each
row's ratio to its backend's one-process row, all measured in the same run. A row whose layout
fails records the error instead of a figure. Writes bench/results/moe.json.

The megatron rows use the shared settings ``policy.megatron_cfg.expert_model_parallel_size``
(its MoE layers come from the megatron plugin); add a backend's rows to :data:`LAYOUTS`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_output import results_path
from contenders import machine, train_step_seconds, versions

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.testing.conformance import conformance_batch, conformance_loss

RESULTS = results_path("moe.json")

# backend id -> [(label, world size, overrides)]; the first row of each backend is its 1-process baseline
LAYOUTS: dict[str, list[tuple[str, int, list[str]]]] = {
    "dtensor": [
        ("1 process", 1, []),
        ("FSDP2, 2 ranks", 2, []),
        ("FSDP2 + EP=2, 2 ranks", 2, ["policy.dtensor_cfg.expert_parallel_size=2"]),
    ],
    "megatron": [
        ("1 process", 1, ["policy.megatron_cfg.enabled=true"]),
        ("DP=2, 2 ranks", 2, ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=1"]),
        ("EP=2, 2 ranks", 2, ["policy.megatron_cfg.enabled=true", "policy.megatron_cfg.tensor_model_parallel_size=1",
                              "policy.megatron_cfg.expert_model_parallel_size=2"]),
    ],
}


def time_layout(backend_id: str, world: int, overrides: list[str], model: str, work: Path, args: argparse.Namespace,
                host: PluginHost) -> list[float]:
    """Seconds of each timed train step of ``backend_id`` in one layout (after a warm-up step)."""
    recipe = write_recipe(work / f"{backend_id}-{world}-{len(overrides)}.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": args.rows // world,
                   "training_backend": backend_id, "optimizer": {"name": "adamw", "lr": 1e-4},
                   "generation": {"backend": "hf"}},
    })
    config = load_config(recipe, [*overrides, f"cluster.gpus_per_node={world}"], host)
    backend = host.training_backends.get(backend_id).create(config=config)
    batch = conformance_batch(rows=args.rows, length=args.seq, vocab=128)
    try:
        backend.load_hf(model)
        return train_step_seconds(backend, batch, conformance_loss, args.steps)
    finally:
        backend.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="dtensor", help=f"comma-separated, of {', '.join(LAYOUTS)}")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--layouts", default=None, help="comma-separated layout labels to run (default: all)")
    args = parser.parse_args()
    wanted = None if args.layouts is None else {label.strip() for label in args.layouts.split(",")}
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(LAYOUTS))
    if unknown:
        parser.error(f"--backends: no layouts for {', '.join(unknown)}; known: {', '.join(LAYOUTS)}")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="corerl-moe-bench-"))
    model = str(build_tiny_model(work / "model", family="qwen3_moe", hidden_size=args.hidden, num_layers=args.layers,
                                 num_experts=args.experts, experts_per_token=2, max_positions=max(args.seq, 64)))
    tokens = args.rows * args.seq
    host = PluginHost()
    rows: list[dict[str, Any]] = []
    for backend_id in backends:
        baseline = None
        for label, world, overrides in LAYOUTS[backend_id]:
            if wanted is not None and label not in wanted:
                continue
            row: dict[str, Any] = {"backend": backend_id, "layout": label, "world": world, "overrides": overrides}
            try:
                times = time_layout(backend_id, world, overrides, model, work, args, host)
            except Exception as exc:  # a layout the backend cannot run: recorded, the others still measured
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            else:
                median = statistics.median(times)
                row |= {"step_seconds": times, "median_seconds": median, "tokens_per_second": tokens / median}
                if baseline is None and world == 1:
                    baseline = row["tokens_per_second"]
                row["ratio_to_one_process"] = row["tokens_per_second"] / baseline if baseline else None
            rows.append(row)
            print(f"{backend_id} {label}: {row.get('tokens_per_second', row.get('error'))}", flush=True)

    print(f"\ntrain-step tokens/s, tiny Qwen3-MoE: hidden {args.hidden}, {args.layers} layers, {args.experts} experts "
          f"top-2, batch {args.rows} x {args.seq} tokens, fp32, AdamW, median of {args.steps} steps "
          f"(CPU, {torch.get_num_threads()} threads in all)")
    print("| backend | layout | tokens/s | step s | vs 1 process |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        if "error" in row:
            print(f"| {row['backend']} | {row['layout']} | failed: {row['error'][:80]} | - | - |")
            continue
        ratio = f"{row['ratio_to_one_process']:.2f}" if row["ratio_to_one_process"] else "-"
        print(f"| {row['backend']} | {row['layout']} | {row['tokens_per_second']:.0f} | {row['median_seconds']:.2f} | "
              f"{ratio} |")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    stamp = machine(device, torch.get_num_threads()) | {"command": " ".join(["python", *sys.argv])}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "model": {"family": "qwen3_moe", "hidden": args.hidden, "layers": args.layers, "experts": args.experts,
                  "experts_per_token": 2},
        "batch": {"rows": args.rows, "seq": args.seq, "tokens": tokens}, "steps": args.steps,
        "machine": stamp, "versions": versions(("torch", "transformers", "megatron-core", "corerl")), "rows": rows,
    }, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
