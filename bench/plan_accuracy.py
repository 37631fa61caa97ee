"""``corerl plan``'s memory models against the live ranks: estimated vs measured per-rank state.

    .venv/bin/python bench/plan_accuracy.py [--hidden 256 --layers 4] [--layouts "deepspeed ZeRO-3"] [--worlds 2]

For each layout of bench/memory.py (dtensor FSDP2, deepspeed ZeRO-1/2/3, megatron TP), at world
size 1 and 2 (2 Ray ranks, gloo, on CPU; on a GPU machine, its GPUs: world size 2 only where it has
two), one training step, then the
largest rank's parameter, gradient and optimizer bytes as the rank reports them
(``state_bytes()``) next to what the backend's memory model estimates for the same recipe, and
their ratio (target: within 10%). On a GPU it also prints each rank's CUDA peak during a second step (the optimizer's moments exist)
next to the estimated training-phase total (state + activations; target: within 15%) and writes
bench/results/gpu/plan_accuracy.json with the GPU's name and the versions; on CPU,
bench/results/plan_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench_output import results_path
from memory import LAYOUTS, measure  # bench/memory.py, beside this script

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.planning.command import request_of
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe

RESULTS = results_path("plan_accuracy.json")
KINDS = ("parameters", "gradients", "optimizer")


def estimate(backend: str, overrides: list[str], world: int, model: str, work: Path, host: PluginHost) -> object:
    recipe = write_recipe(work / f"plan-{backend}-{world}.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 4,
                   "training_backend": backend, "optimizer": {"name": "adamw", "lr": 1e-4}, "max_seq_length": 32}})
    extra = [f"cluster.gpus_per_node={world}"]
    if backend == "megatron":
        extra.append(f"policy.megatron_cfg.tensor_model_parallel_size={world}")
    config = load_config(recipe, [*overrides, *extra], host)
    memory_model = host.memory_models.get(backend).create()
    request = request_of(config)
    return memory_model.estimate(request, memory_model.layout_of(config, request))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(label for label, *_ in LAYOUTS),
                        help="comma-separated layout labels of bench/memory.py (default: all)")
    parser.add_argument("--worlds", default="1,2", help="comma-separated world sizes of 1, 2 (default: both; on a GPU "
                                                        "machine 2 only where it has two GPUs)")
    args = parser.parse_args()
    if unknown := sorted(set(args.worlds.split(",")) - {"1", "2"}):
        parser.error(f"--worlds: no world size {unknown}; 1 and 2 are measured")
    chosen = args.layouts.split(",")
    unknown = sorted(set(chosen) - {label for label, *_ in LAYOUTS})
    if unknown:
        parser.error(f"--layouts: no layout {unknown}; bench/memory.py has {[label for label, *_ in LAYOUTS]}")
    work = Path(tempfile.mkdtemp(prefix="corerl-plan-"))
    model = str(build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers))
    host = PluginHost()
    import torch

    cuda = torch.cuda.is_available()
    worlds = [world for world in ((1, 2) if not cuda or torch.cuda.device_count() >= 2 else (1,))
              if str(world) in args.worlds.split(",")]
    rows = []
    for label, backend, overrides, _, _ in (layout for layout in LAYOUTS if layout[0] in chosen):
        for world in worlds:
            ranks, gpu = measure(backend, overrides, world, model, work, host)
            largest = max(ranks, key=lambda r: sum(r[k] for k in KINDS))
            ours = estimate(backend, overrides, world, model, work, host)
            row = {"layout": label, "world": world, "measured": {k: largest[k] for k in KINDS},
                   "estimated": {k: getattr(ours, k) for k in KINDS},
                   "ratio": {k: getattr(ours, k) / largest[k] for k in KINDS}}
            if gpu is not None:
                row["gpu"] = {"peak": max(gpu["peak"]), "estimated_training_total": ours.state + ours.activations + ours.buffers}
            rows.append(row)
    print(f"\nper-rank state, estimated / measured (MiB), largest rank; model hidden {args.hidden} x {args.layers} "
          "layers, fp32, AdamW; target: every ratio within 0.90-1.10")
    print("| layout | world | parameters | gradients | optimizer |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        cells = [f"{row['estimated'][k] / 2**20:.2f} / {row['measured'][k] / 2**20:.2f} ({row['ratio'][k]:.3f})"
                 for k in KINDS]
        print(f"| {row['layout']} | {row['world']} | " + " | ".join(cells) + " |")
    worst = max(abs(r["ratio"][k] - 1) for r in rows for k in KINDS)
    print(f"\nlargest deviation: {worst * 100:.1f}%")
    if any("gpu" in r for r in rows):
        print("\n| layout | world | CUDA peak MiB | estimated MiB | ratio |")
        for row in rows:
            if "gpu" in row:
                g = row["gpu"]
                print(f"| {row['layout']} | {row['world']} | {g['peak'] / 2**20:.1f} | "
                      f"{g['estimated_training_total'] / 2**20:.1f} | {g['estimated_training_total'] / g['peak']:.3f} |")
    results = RESULTS.parent / "gpu" / RESULTS.name if cuda else RESULTS
    results.parent.mkdir(exist_ok=True)
    machine = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "cuda": torch.version.cuda, "command": " ".join(["python", *sys.argv])}
    results.write_text(json.dumps({"hidden": args.hidden, "layers": args.layers, "machine": machine, "rows": rows},
                                  indent=2) + "\n")
    print(f"\nwrote {results}")


if __name__ == "__main__":
    main()
