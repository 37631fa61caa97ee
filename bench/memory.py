"""Per-rank training state: parameter, gradient and optimizer-state bytes, measured on the live ranks.

    .venv/bin/python bench/memory.py

One tiny Qwen2 (``--hidden``, ``--layers``), fp32, AdamW (megatron: its Adam), one training
step on a fixed batch, then each rank reports what it holds (``state_bytes()``): its
parameters as stored (FSDP2 and ZeRO-3 shards, megatron's tensor-parallel slices), its
gradients at the step's accumulation boundary (before the optimizer runs; ZeRO's reduced
partitions and flat buffers, megatron's gradient buffer) and its optimizer state (moments, and
the fp32 master copies ZeRO and megatron keep). Tensors are counted by storage, once each.

Every layout runs at world size 1 and 2 (2 Ray ranks, gloo): the table gives the largest
rank's total at each and their ratio, next to the ratio the ZeRO paper's accounting gives at
two data-parallel ranks (mixed-precision Adam, 16 bytes a parameter: ZeRO-1 (4 + 12/2)/16,
ZeRO-2 (2 + 14/2)/16, ZeRO-3 and FSDP full sharding 1/2; tensor parallel 2 splits all three
kinds of state, bar the replicated norms).

Where the ranks run on a GPU, a second table gives each layout's CUDA peak per rank during the
step (``torch.cuda.max_memory_allocated``, reset before it) and the GPU memory each offload
policy frees: what stays allocated after the policy's ``offload`` of the generation phase
(``optimizer``: the optimizer state; ``full``: optimizer and parameters), against before.
Writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench_output import results_path

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.offload.schedule import FullOffload, OptimizerOffload
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.testing.conformance import conformance_batch, conformance_loss

RESULTS = results_path("memory.json")

# label, backend id, overrides, the literature's world-2 / world-1 ratio, where it comes from
LAYOUTS: list[tuple[str, str, list[str], float, str]] = [
    ("dtensor FSDP2", "dtensor", [], 0.5, "full sharding: 16/2 of 16 bytes"),
    ("deepspeed ZeRO-1", "deepspeed", ["policy.deepspeed_cfg.zero_stage=1"], (4 + 12 / 2) / 16, "(4 + 12/Nd) / 16"),
    ("deepspeed ZeRO-2", "deepspeed", ["policy.deepspeed_cfg.zero_stage=2"], (2 + 14 / 2) / 16, "(2 + 14/Nd) / 16"),
    ("deepspeed ZeRO-3", "deepspeed", ["policy.deepspeed_cfg.zero_stage=3"], 0.5, "16/Nd of 16 bytes"),
    ("megatron TP=2", "megatron", ["policy.megatron_cfg.enabled=true"], 0.5, "tensor parallel: everything / 2"),
]


OFFLOAD_POLICIES = {"optimizer": OptimizerOffload.for_generation, "full": FullOffload.for_generation}


def gpu_figures(backend: Any, step: Any) -> dict[str, Any]:
    """Per rank: the CUDA peak during ``step()`` (the second step: ``measure`` runs one before), and
    the bytes each offload policy frees."""
    backend.accelerator_memory(reset_peak=True)
    step()
    during = backend.accelerator_memory()
    freed: dict[str, list[int]] = {}
    for name, parts in OFFLOAD_POLICIES.items():
        backend.offload(sorted(parts))
        after = backend.accelerator_memory()
        backend.reload(sorted(parts))
        freed[name] = [b["allocated"] - a["allocated"] for b, a in zip(during, after, strict=True)]
    return {"peak": [rank["peak"] for rank in during], "allocated": [rank["allocated"] for rank in during],
            "freed": freed}


def measure(backend_id: str, overrides: list[str], world: int, model: str, work: Path,
            host: PluginHost) -> tuple[list[dict[str, int]], dict[str, Any] | None]:
    recipe = write_recipe(work / f"{backend_id}-{world}.yaml", {
        "policy": {"model_name": model, "precision": "float32", "train_micro_batch_size": 4,
                   "training_backend": backend_id, "optimizer": {"name": "adamw", "lr": 1e-4}},
    })
    extra = [f"cluster.gpus_per_node={world}"]
    if backend_id == "megatron":
        extra.append(f"policy.megatron_cfg.tensor_model_parallel_size={world}")
    config = load_config(recipe, [*overrides, *extra], host)
    backend = host.training_backends.get(backend_id).create(config=config)
    try:
        backend.load_hf(model)

        def step() -> None:
            backend.train_step(conformance_batch(rows=8, length=32, vocab=128), conformance_loss)

        on_gpu = any(device.startswith("cuda") for device in backend.worker_devices())
        if on_gpu:  # the plan estimates the steady state: the optimizer makes its moments in the first step
            step()
        gpu = gpu_figures(backend, step) if on_gpu else None
        if gpu is None:
            step()
        return backend.state_bytes(), gpu
    finally:
        backend.shutdown()


def total(rank: dict[str, int]) -> int:
    return rank["parameters"] + rank["gradients"] + rank["optimizer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--layouts", default=",".join(label for label, *_ in LAYOUTS),
                        help="comma-separated layouts to measure (default: all)")
    args = parser.parse_args()
    chosen = args.layouts.split(",")
    if unknown := [label for label in chosen if label not in {label for label, *_ in LAYOUTS}]:
        parser.error(f"--layouts: no layout {unknown}; bench/memory.py has {[label for label, *_ in LAYOUTS]}")
    work = Path(tempfile.mkdtemp(prefix="corerl-memory-"))
    model = str(build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers))
    host = PluginHost()
    import torch

    worlds = (1, 2) if not torch.cuda.is_available() or torch.cuda.device_count() >= 2 else (1,)
    rows: list[dict[str, Any]] = []
    for label, backend_id, overrides, literature, source in LAYOUTS:
        if label not in chosen:
            continue
        if backend_id == "megatron" and 2 not in worlds:
            continue  # the TP=2 layout needs two GPUs
        measured = {world: measure(backend_id, overrides, world, model, work, host) for world in worlds}
        ranks = {world: m[0] for world, m in measured.items()}
        gpu = {str(world): m[1] for world, m in measured.items() if m[1] is not None}
        largest = {world: max(ranks[world], key=total) for world in ranks}
        rows.append({"layout": label, "ranks": {str(w): r for w, r in ranks.items()},
                     "world1": largest[1], "world2": largest.get(2),
                     "ratio": total(largest[2]) / total(largest[1]) if 2 in largest else None,
                     "literature": literature, "source": source, "gpu": gpu or None})

    def mib(rank: dict[str, int]) -> str:
        return (f"{total(rank) / 2**20:6.2f} ({rank['parameters'] / 2**20:.2f} / {rank['gradients'] / 2**20:.2f} / "
                f"{rank['optimizer'] / 2**20:.2f})")

    print(f"\nper-rank state, MiB: total (parameters / gradients / optimizer); model hidden {args.hidden} x "
          f"{args.layers} layers, fp32, AdamW, largest rank shown")
    print("| layout | world size 1 | world size 2 | world 2 / world 1 | literature at 2 ranks |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        two = (mib(row["world2"]), f"{row['ratio']:.3f}") if row["world2"] else ("(needs 2 GPUs)", "-")
        print(f"| {row['layout']} | {mib(row['world1'])} | {two[0]} | {two[1]} | "
              f"{row['literature']:.3f} ({row['source']}) |")
    print("\nThe literature's figures count mixed precision (2-byte parameters and gradients). Here everything is\n"
          "fp32, and DeepSpeed keeps an fp32 master copy besides: 20 bytes a parameter, so ZeRO-1 and ZeRO-2 at\n"
          "2 ranks come to (4 + 16/2) / 20 = 0.60 by the same accounting; their gradients differ only in how long\n"
          "whole gradients live, which one step at 2 ranks does not show.")
    if any(row["gpu"] for row in rows):
        print(f"\nGPU memory per rank, MiB ({torch.cuda.get_device_name()}): CUDA peak during the second step, allocated after "
              "it, and what each offload policy frees")
        print("| layout | world size | peak | allocated | freed by `optimizer` | freed by `full` |")
        print("| --- | --- | --- | --- | --- | --- |")
        for row in rows:
            for world, gpu in (row["gpu"] or {}).items():
                for rank, peak in enumerate(gpu["peak"]):
                    print(f"| {row['layout']} (rank {rank}) | {world} | {peak / 2**20:.2f} | "
                          f"{gpu['allocated'][rank] / 2**20:.2f} | {gpu['freed']['optimizer'][rank] / 2**20:.2f} | "
                          f"{gpu['freed']['full'][rank] / 2**20:.2f} |")
    else:
        print("\nNo GPU here: the CUDA peak and offload figures are printed where the ranks run on one.")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"hidden": args.hidden, "layers": args.layers, "rows": rows}, indent=2) + "\n")
    print(f"\nwrote {RESULTS}")


if __name__ == "__main__":
    main()
