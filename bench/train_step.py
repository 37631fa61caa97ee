"""Forward+backward+optimizer tokens/s: the dtensor backend vs plain PyTorch, same model, same batch.

    .venv/bin/python bench/train_step.py            # hidden 256, 4 layers, 8 x 512 tokens
    .venv/bin/python bench/train_step.py --dp2      # also dtensor with 2 Ray ranks (FSDP2, gloo)
    .venv/bin/python bench/train_step.py --model smollm2-135m-instruct   # the GRPO recipe's training phase

With ``--model`` the batch is a GRPO step's (``--rows`` 64 samples of ``--prompt`` 40 prompt and
``--response`` 64 completion tokens, micro-batches of ``--micro`` rows, the loss on the completions)
and the table also says how close each side comes to this machine's limit: the matrix multiplies of
the model's own linear layers at the step's shapes (forward, and the backward's two products per
layer, at the training precision) are timed alone, and each side's achieved FLOP/s (the step's model
FLOPs: every linear layer at every token, the LM head at the completion tokens, attention, times 3 for
forward and backward, over the step's seconds) is given as a share of that rate. Plain PyTorch is what
a user writes: the model's logits at every position, their log-softmax. A profile of corerl's step by
operator (``torch.profiler``, self time) says where the rest goes.

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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_output import results_path
from grpo_vs_trl import real_model_folder
from transformers import AutoModelForCausalLM

from corerl.config import load_config
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe
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

    def __init__(self, model_dir: str, lr: float, device: torch.device, dtype: torch.dtype, micro: int) -> None:
        self.device, self.micro = device, micro
        self.autocast = dtype != torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.dtype = dtype

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        normaliser = float(batch["loss_mask"][:, 1:].sum())
        for part in micro_batches(batch, self.micro):
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.autocast):
                logits = self.model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, part["input_ids"][:, 1:, None])[..., 0]
            logprobs = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)
            loss, _ = loss_fn(logprobs, part, normaliser)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.item())


def micro_batches(batch: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
    """``batch`` in slices of ``rows`` rows."""
    total = batch["input_ids"].shape[0]
    return [{k: v[i:i + rows] for k, v in batch.items()} for i in range(0, total, rows)]


def grpo_batch(rows: int, prompt: int, response: int, vocab: int) -> dict[str, torch.Tensor]:
    """A GRPO step's training batch: ``rows`` samples, the loss on the ``response`` tokens."""
    batch = make_batch(rows, prompt + response, vocab)
    batch["loss_mask"].zero_()
    batch["loss_mask"][:, prompt:] = 1
    return batch


def linear_shapes(model: torch.nn.Module) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """``(in, out)`` of every linear layer of the decoder, and of the LM head."""
    head = model.get_output_embeddings()
    body = [(m.in_features, m.out_features) for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m is not head]
    return body, (head.weight.shape[1], head.weight.shape[0])


def model_flops(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """FLOPs of one training step's model work: every decoder linear layer at every token, the LM
    head at the loss's tokens, attention (QK^T and AV over each row's length), forward x 3."""
    body, (h_in, h_out) = linear_shapes(model)
    config = model.config
    tokens = float(batch["attention_mask"].sum())
    loss_tokens = float(batch["loss_mask"][:, 1:].sum())
    lengths = batch["attention_mask"].sum(dim=1).double()
    forward = 2 * tokens * sum(i * o for i, o in body) + 2 * loss_tokens * h_in * h_out
    forward += 4 * config.num_hidden_layers * config.hidden_size * float((lengths ** 2).sum())
    return 3 * forward


def matmul_limit(model: torch.nn.Module, micro_tokens: int, micro_loss_tokens: int, dtype: torch.dtype,
                 device: torch.device, reps: int = 3) -> float:
    """FLOP/s of this machine's matrix multiplies at one micro-batch's shapes: each distinct linear
    layer's forward product and the backward's two (input and weight gradients), the LM head at the
    loss's tokens, weighted by how often the model runs each."""
    body, head = linear_shapes(model)
    counts: dict[tuple[int, int, int], int] = {}
    for i, o in body:
        counts[(micro_tokens, i, o)] = counts.get((micro_tokens, i, o), 0) + 1
    counts[(micro_loss_tokens, *head)] = counts.get((micro_loss_tokens, *head), 0) + 1
    flops = seconds = 0.0
    for (m, i, o), count in counts.items():
        x, w, g = (torch.randn(m, i, device=device, dtype=dtype), torch.randn(o, i, device=device, dtype=dtype),
                   torch.randn(m, o, device=device, dtype=dtype))
        products = ((x, w.t()), (g, w), (g.t(), x))  # forward, input gradient, weight gradient
        for a, b in products:
            a @ b  # warm-up
        synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            for a, b in products:
                a @ b
        synchronize()
        seconds += count * (time.perf_counter() - start) / reps
        flops += count * 3 * 2 * m * i * o
    return flops / seconds


def op_profile(step: Any, batch: dict[str, torch.Tensor], top: int = 12) -> list[dict[str, Any]]:
    """One step under ``torch.profiler``: the operators with the most self time, and their share."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(batch)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "self_s": round(e.self_cpu_time_total / 1e6, 3),
             "share": round(e.self_cpu_time_total / total, 3), "calls": e.count} for e in events[:top]]


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
    parser.add_argument("--model", help="a packaged model (smollm2-135m-instruct), a .gguf file or a Hugging Face "
                                        "folder: a GRPO step's batch of it, with the machine's limit and a profile")
    parser.add_argument("--prompt", type=int, default=40, help="--model: prompt tokens per sample")
    parser.add_argument("--response", type=int, default=64, help="--model: completion tokens per sample")
    parser.add_argument("--micro", type=int, help="rows per micro-batch (default: --rows; with --model 16)")
    args = parser.parse_args()
    if args.model and "--rows" not in sys.argv:
        args.rows = 64
    micro = args.micro or (16 if args.model else args.rows)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    work = Path(tempfile.mkdtemp(prefix="corerl-bench-"))
    if args.model:
        model_dir = str(real_model_folder(args.model, parser))
        vocab = int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
        batch = grpo_batch(args.rows, args.prompt, args.response, vocab)
        args.seq = args.prompt + args.response
    else:
        vocab = 512
        model_dir = str(build_tiny_model(work / "model", hidden_size=args.hidden, num_layers=args.layers,
                                         num_heads=4, num_kv_heads=2, vocab_size=vocab, max_positions=args.seq))
        batch = make_batch(args.rows, args.seq, vocab)
    tokens = int(batch["attention_mask"].sum())
    threads = torch.get_num_threads()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {threads} threads"
    bench_config = {"model": args.model or "built in code", "hidden": args.hidden, "layers": args.layers,
                    "batch": f"{args.rows}x{args.seq}", "micro_batch_rows": micro,
                    "threads": threads, "steps": args.steps, "precision": args.precision, "optimizer": "adamw",
                    "device": where}

    def dtensor(world: int) -> DTensorBackend:
        recipe = write_recipe(work / f"r{world}.yaml", {"policy": {
            "model_name": model_dir, "train_micro_batch_size": max(1, micro // world), "max_seq_length": args.seq,
            "optimizer": {"name": "adamw", "lr": 1e-5}, "max_grad_norm": 1.0, "precision": args.precision}})
        config = load_config(recipe, [f"cluster.gpus_per_node={world}"], PluginHost(env={}))
        backend = DTensorBackend(config)
        backend.load_hf(model_dir)
        ranks_on = {d.split(":")[0] for d in backend.worker_devices()}
        assert ranks_on == {device.type}, f"the dtensor ranks compute on {ranks_on}, plain PyTorch on {device.type}"
        return backend

    dtype = torch.bfloat16 if args.precision == "bfloat16" else torch.float32
    plain = PlainPyTorch(model_dir, lr=1e-5, device=device, dtype=dtype, micro=micro)
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
            profile = op_profile(lambda b: ours.train_step(b, loss_fn), batch) if args.model and world == 1 else None
        finally:
            ours.shutdown()
        theirs_tps = tokens / statistics.median(plain_times)
        ours_tps = tokens / statistics.median(ours_times)
        row = {"name": name, "ours": round(ours_tps, 1), "theirs": round(theirs_tps, 1),
               "ratio": round(ours_tps / theirs_tps, 3), "unit": "tokens/s",
               "config": {**bench_config, "world_size": world},
               "ours_median_s": round(statistics.median(ours_times), 3),
               "theirs_median_s": round(statistics.median(plain_times), 3)}
        if profile is not None:
            row["ours_profile_by_op"] = profile
        return row

    rows = [race("dtensor world 1 vs plain PyTorch", 1)]
    if args.dp2:
        rows.append(race("dtensor dp=2 (2 Ray ranks, FSDP2, gloo) vs plain PyTorch", 2))
    limit = None
    if args.model:
        flops = model_flops(plain.model, batch)
        loss_tokens = int(batch["loss_mask"][:, 1:].sum())
        limit = matmul_limit(plain.model, micro * args.seq, loss_tokens * micro // args.rows, dtype, device)
        for row in rows:
            row["model_flops_per_step"] = flops
            row["matmul_limit_flops"] = round(limit)
            row["ours_flops"] = round(flops / row["ours_median_s"])
            row["theirs_flops"] = round(flops / row["theirs_median_s"])
            row["ours_share_of_limit"] = round(flops / row["ours_median_s"] / limit, 3)
            row["theirs_share_of_limit"] = round(flops / row["theirs_median_s"] / limit, 3)

    from rich.table import Table

    from corerl.reporting.console import make_console

    what = args.model or f"hidden {args.hidden} x {args.layers} layers"
    table = Table(title=f"train step, {bench_config['batch']} tokens, {what}, "
                        f"{args.precision}, {where} (median of {args.steps})")
    for column in ("comparison", "ours tok/s", "plain PyTorch tok/s", "ratio"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], f"{row['ours']:,.0f}", f"{row['theirs']:,.0f}", f"{row['ratio']:.3f}")
    make_console().print(table)
    if limit is not None:
        row = rows[0]
        print(f"this machine's matrix multiplies at the step's shapes: {limit / 1e9:.1f} GFLOP/s; the step's model "
              f"work {row['model_flops_per_step'] / 1e12:.2f} TFLOP")
        print(f"| side | s/step | GFLOP/s | share of the limit |\n| --- | --- | --- | --- |\n"
              f"| corerl (dtensor) | {row['ours_median_s']:.2f} | {row['ours_flops'] / 1e9:.1f} | "
              f"{row['ours_share_of_limit']:.0%} |\n| plain PyTorch | {row['theirs_median_s']:.2f} | "
              f"{row['theirs_flops'] / 1e9:.1f} | {row['theirs_share_of_limit']:.0%} |")
        print("corerl's step by operator (self time):")
        for op in row["ours_profile_by_op"]:
            print(f"  {op['op']:<40} {op['self_s']:>8.3f} s  {op['share']:>6.1%}  x{op['calls']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
