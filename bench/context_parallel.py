"""What context parallelism buys: the longest sequence whose training activations fit a memory
budget per rank, and tokens/s at a length both fit, with ``context_parallel_size`` 1 and 2.

    .venv/bin/python bench/context_parallel.py                  # hidden 256, 4 layers, 100 MiB per rank
    .venv/bin/python bench/context_parallel.py --hidden 64 --layers 1 --lengths 64 128 --steps 1   # the smoke

Each size runs corerl's own path for it on a tiny Qwen2 (float32, one sequence a micro-batch):
size 1 is ``model_logprobs`` with SDPA attention in one process (what the dtensor backend runs
without context parallelism); size 2 is ``corerl_dtensor.context_parallel.context_parallel_logprobs``
with ring attention over 2 gloo ranks (each holding an early and a late chunk of the sequence),
the path the backend's ranks take with ``policy.dtensor_cfg.context_parallel_size=2``. Memory is
what the forward pass saves for the backward one (``torch.autograd.graph.saved_tensors_hooks``,
each storage counted once) on the rank that saves the most: the activations, which context
parallelism divides; the weights, which FSDP shards in both layouts, are not counted. A length
fits when those bytes are within ``--budget-mib``. Tokens/s is one forward and backward pass of
one sequence at ``--throughput-length``, best of ``--steps`` after a warm-up; size 2 uses two
processes (two CPU cores here), size 1 one. Writes bench/results/context_parallel.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_output import results_path

RESULTS = results_path("context_parallel.json")
MIB = 2**20


def saved_bytes(run: Any) -> tuple[int, Any]:
    """Bytes of the distinct storages the autograd graph saves while ``run()`` builds it, and its result."""
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    return sum(seen.values()), out


def rank_main(rank: int, size: int, port: int, model_dir: str, args: argparse.Namespace, out: str) -> None:
    from corerl.models.value_model import load_pretrained

    torch.set_num_threads(1)
    ring = None
    if size > 1:
        from corerl_dtensor.context_parallel import context_parallel_logprobs
        from corerl_dtensor.ring_attention import ProcessGroupRing, register_with_transformers

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=size)
        ring = ProcessGroupRing()
        model = load_pretrained(model_dir, attn_implementation=register_with_transformers())
    else:
        from corerl.training.logprobs import model_logprobs

        model = load_pretrained(model_dir, attn_implementation="sdpa")

    def forward(length: int) -> torch.Tensor:
        ids = torch.randint(1, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return context_parallel_logprobs(model, batch, ring) if ring is not None else model_logprobs(model, batch)

    memory = {}
    for length in args.lengths:
        memory[length], logprobs = saved_bytes(lambda length=length: forward(length))
        logprobs.sum().backward()
        model.zero_grad(set_to_none=True)
    seconds = []
    for _ in range(args.steps + 1):  # the first one warms up
        if ring is not None:
            dist.barrier()
        start = time.perf_counter()
        forward(args.throughput_length).sum().backward()
        model.zero_grad(set_to_none=True)
        if ring is not None:
            dist.barrier()
        seconds.append(time.perf_counter() - start)
    Path(out, f"{size}-{rank}.json").write_text(json.dumps({"memory": memory, "seconds": min(seconds[1:])}))
    if ring is not None:
        dist.destroy_process_group()


def measure(size: int, model_dir: str, args: argparse.Namespace, work: str) -> dict[str, Any]:
    from corerl.sdk import free_port

    mp.spawn(rank_main, args=(size, free_port(), model_dir, args, work), nprocs=size, join=True)
    ranks = [json.loads(Path(work, f"{size}-{rank}.json").read_text()) for rank in range(size)]
    memory = {int(length): max(r["memory"][str(length)] for r in ranks) for length in args.lengths}
    fits = [length for length, used in memory.items() if used <= args.budget_mib * MIB]
    seconds = max(r["seconds"] for r in ranks)
    return {"context_parallel_size": size, "longest_fitting_length": max(fits, default=0),
            "activation_mib": {length: round(used / MIB, 2) for length, used in memory.items()},
            "tokens_per_s": round(args.throughput_length / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096],
                        help="sequence lengths tried (multiples of 4: 2 x 2 chunks)")
    parser.add_argument("--budget-mib", type=float, default=100.0, help="activation memory per rank")
    parser.add_argument("--throughput-length", type=int, default=None,
                        help="default: 1024 where it is among --lengths (the longest both sizes fit at the "
                             "default budget), else the shortest length")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    args.throughput_length = args.throughput_length or (1024 if 1024 in args.lengths else min(args.lengths))
    from corerl.models.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="corerl-cp-") as work:
        model_dir = str(build_tiny_model(Path(work, "model"), hidden_size=args.hidden, num_layers=args.layers,
                                         max_positions=max(2048, max(args.lengths))))
        for size in (1, 2):
            rows.append(measure(size, model_dir, args, work))
            print(f"  context_parallel_size={size}: longest fitting {rows[-1]['longest_fitting_length']}", flush=True)
    one, two = rows
    longer = two["longest_fitting_length"] / one["longest_fitting_length"] if one["longest_fitting_length"] else None
    faster = two["tokens_per_s"] / one["tokens_per_s"]
    print(f"{'context_parallel_size':>22} {'longest fitting':>16} "
          + " ".join(f"{f'MiB at {n}':>12}" for n in args.lengths) + f" {f'tokens/s at {args.throughput_length}':>18}")
    for row in rows:
        print(f"{row['context_parallel_size']:>22} {row['longest_fitting_length']:>16} "
              + " ".join(f"{row['activation_mib'][n]:>12.2f}" for n in args.lengths) + f" {row['tokens_per_s']:>18.1f}")
    print(f"ratio 2 / 1: longest fitting sequence {f'{longer:.2f}x' if longer else 'n/a (size 1 fits none)'}, "
          f"tokens/s {faster:.2f}x (size 2 on two processes, size 1 on one)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"settings": vars(args), "machine": f"{os.cpu_count()} CPU cores", "rows": rows,
                                   "longest_ratio": longer, "tokens_per_s_ratio": round(faster, 2)}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    sys.exit(main())
