"""Forward+backward+optimizer tokens/s: the dtensor backend vs plain PyTorch, same model, same batch.

    .venv/bin/python bench/train_step.py            # hidden 256, 4 layers, 8 x 512 tokens
    .venv/bin/python bench/train_step.py --dp2      # also dtensor with 2 Ray ranks (FSDP2, gloo)

Both sides run on the same device (the GPU where torch sees one, which the dtensor ranks take
too; else the CPU with the same thread count), alternating step by step; on a GPU each timed
step is bracketed by ``torch.cuda.synchronize()`` so that queued kernels are counted. The
table shows the median over the timed steps and the ratio ours/theirs (higher is better).
Writes bench/results/train_step.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_output import results_path
from transformers import AutoModelForCausalLM

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
from corerl.training.logprobs import model_logprobs
from corerl_dtensor.backend import DTensorBackend

RESULTS = results_path("train_step.json")


def loss_fn(logprobs, batch, normaliser):
    return -(logprobs * batch["advantages"] * batch["loss_mask"]).sum() / normaliser, {}


def make_batch(rows: int, length: int, vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (rows, length), generator=gen)
    mask = torch.ones_like(ids)
    loss_mask = mask.clone()
    loss_mask[:, : length // 4] = 0
    adv = torch.randn(rows, 1, generator=gen).expand(rows, length).contiguous()
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask, "advantages": adv}


class PlainPyTorch:
    """The comparison: a transformers model, AdamW, one forward/backward/step on the batch."""

    def __init__(self, model_dir: str, lr: float, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.autocast = dtype != torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.dtype = dtype

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast):
            logprobs = model_logprobs(self.model, batch)
        loss, _ = loss_fn(logprobs, batch, float(batch["loss_mask"][:, 1:].sum()))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.item())


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, batch) -> float:
    """Seconds for ``fn(batch)``, with the GPU's queue drained before and after."""
    synchronize()
    start = time.perf_counter()
    fn(batch)
    synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per side (after one warm-up)")
    parser.add_argument("--dp2", action="store_true", help="also time dtensor at dp=2 on Ray (needs 2 GPUs on a GPU machine)")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    work = Path(tempfile.mkdtemp(prefix="corerl-bench-"))
    vocab = 512
    model_dir = str(build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers,
                                     num_heads=4, num_kv_heads=2, vocab_size=vocab, max_positions=args.seq))
    batch = make_batch(args.rows, args.seq, vocab)
    tokens = int(batch["attention_mask"].sum())
    threads = torch.get_num_threads()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
    bench_config = {"hidden": args.hidden, "layers": args.layers, "batch": f"{args.rows}x{args.seq}",
                    "threads": threads, "steps": args.steps, "precision": args.precision, "optimizer": "adamw",
                    "device": where}

    def dtensor(world: int) -> DTensorBackend:
        recipe = write_recipe(work / f"r{world}.yaml", {"policy": {
            "model_name": model_dir, "train_micro_batch_size": args.rows // world, "max_seq_length": args.seq,
            "optimizer": {"name": "adamw", "lr": 1e-5}, "max_grad_norm": 1.0, "precision": args.precision}})
        config = load_config(recipe, [f"cluster.gpus_per_node={world}"], PluginHost(env={}))
        backend = DTensorBackend(config)
        backend.load_hf(model_dir)
        ranks_on = {d.split(":")[0] for d in backend.worker_devices()}
        assert ranks_on == {device.type}, f"the dtensor ranks compute on {ranks_on}, plain PyTorch on {device.type}"
        return backend

    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
    plain = PlainPyTorch(model_dir, lr=1e-5, device=device, dtype=dtype)
    timed(plain.step, batch)  # warm-up

    def race(name: str, world: int) -> dict:
        """Alternate plain PyTorch and dtensor at ``world`` ranks, step by step; median tokens/s."""
        ours = dtensor(world)
        try:
            timed(lambda b: ours.train_step(b, loss_fn), batch)  # warm-up
            plain_times, ours_times = [], []
            for _ in range(args.steps):
                plain_times.append(timed(plain.step, batch))
                ours_times.append(timed(lambda b: ours.train_step(b, loss_fn), batch))
        finally:
            ours.shutdown()
        theirs_tps = tokens / statistics.median(plain_times)
        ours_tps = tokens / statistics.median(ours_times)
        return {"name": name, "ours": round(ours_tps, 1), "theirs": round(theirs_tps, 1),
                "ratio": round(ours_tps / theirs_tps, 3), "unit": "tokens/s",
                "config": {**bench_config, "world_size": world}}

    rows = [race("dtensor world 1 vs plain PyTorch", 1)]
    if args.dp2:
        rows.append(race("dtensor dp=2 (2 Ray ranks, FSDP2, gloo) vs plain PyTorch", 2))

    from rich.table import Table

    from corerl.reporting.console import make_console

    table = Table(title=f"train step, {bench_config['batch']} tokens, hidden {args.hidden} x {args.layers} layers, "
                        f"{args.precision}, {where} (median of {args.steps})")
    for column in ("comparison", "ours tok/s", "plain PyTorch tok/s", "ratio"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], f"{row['ours']:,.0f}", f"{row['theirs']:,.0f}", f"{row['ratio']:.3f}")
    make_console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
