"""Sequence packing on the dtensor backend: real tokens/s of forward+backward, padded vs packed.

    .venv/bin/python bench/packing.py               # 64 sequences, lengths uniform in 16..512

One batch of ``--seqs`` sequences (lengths uniform in ``--min``..``--max``, seeded) goes
through the real dtensor backend's ``train_step`` (world size 1, fp32, AdamW) in each
micro-batch layout:

- padded: rows right-padded to the batch's longest, ``--rows`` rows per micro-batch (the
  comparison: what every layout is measured against, in the same run);
- dynamic: rows grouped longest first within a ``--budget``-token micro-batch, no packing;
- packed, once per packer: bins of at most ``--budget`` tokens, one row each.

Columns: real tokens/s (median of ``--steps`` timed steps after a warm-up; the optimizer
step is included and negligible at this size), the ratio to padded, and the efficiency,
real tokens / token slots (padded: rows x width; packed: bins x budget). Efficiency depends
on how the draw divides into bins, so it is also given as mean and minimum over ``--draws``
draws of lengths (packing only, no model). Then Karmarkar-Karp's balance of token counts
across 2, 4 and 8 data-parallel ranks (max/min; the draw, and the worst over the draws).
Writes bench/results/packing.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

import torch
from bench_output import results_path
from contenders import train_step_seconds

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.packing.algorithms import karmarkar_karp
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.training.batching import right_pad
from corerl.training.microbatching import MicroBatcher
from corerl_dtensor.backend import DTensorBackend

RESULTS = results_path("packing.json")
PACKERS = ["modified_first_fit_decreasing", "first_fit_decreasing", "first_fit_shuffle", "concatenative",
           "karmarkar_karp"]
DEFAULT = "modified_first_fit_decreasing"


def loss_fn(logprobs, batch, normaliser):
    return -(logprobs * batch["advantages"] * batch["loss_mask"]).sum() / normaliser, {}


def draw_lengths(count: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(count)]


def make_batch(lengths: list[int], vocab: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    input_ids, attention = right_pad([torch.randint(4, vocab, (n,), generator=gen).tolist() for n in lengths])
    loss_mask = attention.clone()
    loss_mask[:, :8] = 0  # a prompt
    advantages = torch.randn(len(lengths), 1, generator=gen).expand_as(attention).contiguous()
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask, "advantages": advantages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--min", type=int, default=16)
    parser.add_argument("--max", type=int, default=512)
    parser.add_argument("--budget", type=int, default=1024, help="tokens per packed / dynamic micro-batch")
    parser.add_argument("--rows", type=int, default=2, help="rows per padded micro-batch (same slots as the budget)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per layout (after one warm-up)")
    parser.add_argument("--draws", type=int, default=50, help="length draws for the efficiency and balance statistics")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="corerl-bench-"))
    vocab = 512
    model_dir = str(build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers,
                                     num_heads=4, num_kv_heads=2, vocab_size=vocab, max_positions=args.max))
    lengths = draw_lengths(args.seqs, args.min, args.max, args.seed)
    batch = make_batch(lengths, vocab, args.seed)
    real = sum(lengths)
    threads = torch.get_num_threads()
    host = PluginHost(env={})

    def layout(name: str, overrides: list[str]) -> dict:
        recipe = write_recipe(work / "r.yaml", {"policy": {
            "model_name": model_dir, "train_micro_batch_size": args.rows, "max_seq_length": args.max,
            "optimizer": {"name": "adamw", "lr": 1e-5}, "max_grad_norm": 1.0}})
        config = load_config(recipe, overrides, host)
        backend = DTensorBackend(config)
        try:
            backend.load_hf(model_dir)
            plan = backend.batcher.plan(batch, 1)
            times = train_step_seconds(backend, batch, loss_fn, args.steps)
        finally:
            backend.shutdown()
        return {"layout": name, "real_tokens_per_s": round(real / statistics.median(times), 1),
                "micro_batches": len(plan.per_rank[0]), "efficiency": round(plan.efficiency, 4),
                "median_step_s": round(statistics.median(times), 3)}

    packing = ["policy.sequence_packing.enabled=true", f"policy.sequence_packing.train_mb_tokens={args.budget}"]
    rows = [layout("padded", [])]
    rows.append(layout("dynamic (no packing)", ["policy.dynamic_batching.enabled=true",
                                                f"policy.dynamic_batching.train_mb_tokens={args.budget}"]))
    for packer in PACKERS:
        rows.append(layout(f"packed: {packer}", [*packing, f"policy.sequence_packing.algorithm={packer}"]))
    for row in rows:
        row["ratio_to_padded"] = round(row["real_tokens_per_s"] / rows[0]["real_tokens_per_s"], 3)

    draws = [draw_lengths(args.seqs, args.min, args.max, args.seed + k) for k in range(args.draws)]
    for row in rows[2:]:
        packer = row["layout"].removeprefix("packed: ")
        batcher = MicroBatcher(layout="packed", train_tokens=args.budget, packer_id=packer,
                               packer=host.sequence_packers.get(packer).create())
        effs = [sum(ls) / (len(batcher.packer.pack(ls, args.budget)) * args.budget) for ls in draws]
        row["efficiency_mean_over_draws"] = round(statistics.mean(effs), 4)
        row["efficiency_min_over_draws"] = round(min(effs), 4)

    balance = []
    for ranks in (2, 4, 8):
        def ratio(ls: list[int], ranks: int = ranks) -> float:
            loads = [sum(ls[i] for i in group) for group in karmarkar_karp(ls, ranks)]
            return max(loads) / min(loads)
        balance.append({"ranks": ranks, "max_over_min": round(ratio(lengths), 4),
                        "worst_over_draws": round(max(ratio(ls) for ls in draws), 4),
                        "contiguous_split_max_over_min": round(_contiguous(lengths, ranks), 4)})

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    title = (f"fwd+bwd, {args.seqs} sequences of {args.min}..{args.max} tokens ({real:,} real), budget {args.budget}, "
             f"hidden {args.hidden} x {args.layers} layers, {threads} threads, median of {args.steps}")
    table = Table(title=title)
    for column in ("layout", "real tok/s", "vs padded", "micro-batches", "efficiency", "mean / min over draws"):
        table.add_column(column)
    for row in rows:
        spread = (f"{row['efficiency_mean_over_draws']:.1%} / {row['efficiency_min_over_draws']:.1%}"
                  if "efficiency_mean_over_draws" in row else "")
        table.add_row(row["layout"], f"{row['real_tokens_per_s']:,.0f}", f"{row['ratio_to_padded']:.2f}x",
                      str(row["micro_batches"]), f"{row['efficiency']:.1%}", spread)
    console.print(table)
    fewest = -(-real // args.budget)
    best = real / (fewest * args.budget)
    console.print(f"no packer can use fewer than ceil({real:,} / {args.budget}) = {fewest} bins on this draw: "
                  f"efficiency at most {best:.1%}")
    kk = Table(title=f"Karmarkar-Karp token balance across data-parallel ranks (worst of {args.draws} draws)")
    for column in ("ranks", "max/min (this draw)", "worst over draws", "contiguous equal-row split"):
        kk.add_column(column)
    for row in balance:
        kk.add_row(str(row["ranks"]), f"{row['max_over_min']:.4f}", f"{row['worst_over_draws']:.4f}",
                   f"{row['contiguous_split_max_over_min']:.4f}")
    console.print(kk)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    config = {"seqs": args.seqs, "lengths": f"uniform {args.min}..{args.max}", "budget": args.budget,
              "padded_rows_per_micro_batch": args.rows, "hidden": args.hidden, "layers": args.layers,
              "threads": threads, "steps": args.steps, "draws": args.draws, "seed": args.seed, "precision": "float32",
              "backend": "dtensor, world size 1", "default_packer": DEFAULT}
    bound = {"fewest_bins": fewest, "best_efficiency": round(best, 4)}
    RESULTS.write_text(json.dumps({"config": config, "layouts": rows, "this_draw_bound": bound,
                                   "karmarkar_karp": balance}, indent=2) + "\n",
                       encoding="utf-8")
    print(f"wrote {RESULTS}")


def _contiguous(lengths: list[int], ranks: int) -> float:
    """max/min tokens of the default rows layout (equal contiguous shards), for comparison."""
    size = len(lengths) // ranks
    loads = [sum(lengths[i * size : (i + 1) * size]) for i in range(ranks)]
    return max(loads) / min(loads)


if __name__ == "__main__":
    main()
