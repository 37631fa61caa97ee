"""LoRA's refit against a full-weight refit: the bytes that cross to the generation engine and the
time a refit takes, per step, for the same model, in one run.

    .venv/bin/python bench/lora_refit.py              # the 25M benchmark model, rank 8 (about 2 minutes)
    .venv/bin/python bench/lora_refit.py --quick      # a small model

The 25M Qwen2-style model of bench/generation.py (hidden 512, 8 layers, float32). Contenders,
each a dtensor training engine (world size 1) and a generation engine through corerl's own
contracts, refitting as a GRPO step does (``corerl.training.weights.send_weights``) after a
training step, so that the weights or the adapter have changed:

- full: ``weight_stream()`` into ``update_weights`` (vllm: through the shared-memory file to its
  Ray actor);
- lora: a rank-8 adapter on every linear layer (``policy.lora``), ``adapter_weights()`` into
  ``load_adapter`` (vllm: the adapter's tensors to its actor, written as a PEFT folder, a new
  ``LoRARequest``).

Bytes are the tensors handed over (every weight, or every adapter tensor). Time is the median of
``--reps`` refits (``send_weights`` returning), each after a training step; beside it, the time of
the first generation call after the refit (one prompt, 4 tokens: vLLM loads a new adapter when a
request first names it, and an adapter adds its own matrix products to every step). The goal: LoRA's
refit bytes at most 5% of the full model's at rank 8. Writes bench/results/lora_refit.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_output import results_path

RESULTS = results_path("lora_refit.json")
MODELS = {
    "25M": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=1536, vocab_size=512),
    "quick": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, vocab_size=128),
}


def engines(model_dir: str, work: Path, generation: str, lora: bool, rank: int) -> tuple[Any, Any]:
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.plugin_manager import PluginHost
    from corerl.testing import write_recipe

    recipe = write_recipe(work / f"{generation}-{lora}.yaml", {
        "cluster": {"gpus_per_node": 1},
        "policy": {"model_name": model_dir, "precision": "float32", "max_seq_length": 128,
                   "lora": {"enabled": lora, "dim": rank, "alpha": 2 * rank},
                   "generation": {"backend": generation, "vllm_cfg": {"cpu_kvcache_space_gib": 1}}},
    })
    host = PluginHost(env={})
    config = load_config(recipe, [], host)
    selection = select(config, host)
    training = selection.training_backend.registration.create(config=config)
    training.load_hf(model_dir)
    engine = selection.generation_backend.registration.create(config=config)  # hf: a copy of its own
    engine.load_hf(model_dir)
    return training, engine


def measure(model_dir: str, work: Path, generation: str, lora: bool, rank: int, reps: int) -> dict[str, Any]:
    import torch

    from corerl.generation.contract import SamplingSettings
    from corerl.testing.conformance import conformance_batch, conformance_loss
    from corerl.training.weights import send_weights

    training, engine = engines(model_dir, work, generation, lora, rank)
    vocab = training.local_model().config.vocab_size
    batch = conformance_batch(vocab=vocab)
    sampling = SamplingSettings(temperature=0.0, max_new_tokens=4, seed=0)
    try:
        refits, firsts, sent = [], [], 0
        for rep in range(reps + 1):
            training.train_step(batch, conformance_loss)
            payload = training.adapter_weights().tensors() if lora else dict(training.weight_stream())
            sent = sum(t.numel() * t.element_size() for t in payload.values())
            start = time.perf_counter()
            send_weights(training, engine)
            refitted = time.perf_counter()
            engine.generate([[2, 5, 9]], sampling)
            if rep:  # the first one warms up
                refits.append(refitted - start)
                firsts.append(time.perf_counter() - refitted)
        parameters = sum(p.numel() for p in training.local_model().parameters() if not lora or not p.requires_grad)
        return {"generation": generation, "refit": "lora" if lora else "full", "bytes": sent,
                "seconds": statistics.median(refits), "first_generate_seconds": statistics.median(firsts),
                "model_parameters": parameters, "threads": torch.get_num_threads()}
    finally:
        engine.shutdown()
        training.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small model")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--generation", nargs="+", default=["vllm", "hf"])
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from corerl.models.tiny import build_tiny_model

    size = "quick" if args.quick else "25M"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = str(build_tiny_model(work / "model", **MODELS[size]))
        for generation in args.generation:
            for lora in (False, True):
                rows.append(measure(model_dir, work, generation, lora, args.rank, args.reps))
    table = Table(title=f"refit per step: full weights vs a rank-{args.rank} LoRA adapter ({size} model, float32)")
    for column in ("generation", "refit", "bytes", "ms per refit", "bytes vs full", "time vs full",
                   "ms, first generate after"):
        table.add_column(column)
    for row in rows:
        full = next(r for r in rows if r["generation"] == row["generation"] and r["refit"] == "full")
        row["bytes_vs_full"] = row["bytes"] / full["bytes"]
        row["time_vs_full"] = row["seconds"] / full["seconds"]
        table.add_row(row["generation"], row["refit"], f"{row['bytes'] / 1e6:.2f} MB", f"{row['seconds'] * 1e3:.1f}",
                      f"{row['bytes_vs_full'] * 100:.1f}%", f"{row['time_vs_full']:.2f}x",
                      f"{row['first_generate_seconds'] * 1e3:.1f}")
    console = Console()
    console.print(table)
    worst = max(r["bytes_vs_full"] for r in rows if r["refit"] == "lora")
    console.print(f"LoRA refit bytes: {worst * 100:.1f}% of the full model's (goal: at most 5% at rank 8): "
                  f"{'met' if worst <= 0.05 else 'NOT met'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"model": size, "rank": args.rank, "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
