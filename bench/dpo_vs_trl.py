"""DPO step time: corerl vs TRL's DPOTrainer on the same tiny model, pairs and batch.

    .venv/bin/pip install -r bench/requirements-trl.txt    # TRL is a benchmark-only dependency
    .venv/bin/python bench/dpo_vs_trl.py                    # 30 steps each (a few minutes on 2 cores)
    python bench/dpo_vs_trl.py --device cuda --hidden 1024 --layers 8   # on a GPU (TRL with use_cpu=False)

A Qwen2-style model (hidden 256, 4 layers by default, the built-in word-level tokenizer) built
once; 720 text pairs of the digit-preference kind (prompt ``w0 d :``, chosen ``d d d``, rejected
another digit three times, with end-of-sequence); 32 pairs per step, one micro-batch, sigmoid
loss with beta 0.1, AdamW, float32, the same torch thread count everywhere. Contenders, each in
its own fresh process, one after the other:

- TRL DPOTrainer with its defaults (a reference copy scores each batch; gradient checkpointing on);
- the same with gradient checkpointing off;
- TRL with ``precompute_ref_log_probs=True`` and checkpointing off;
- corerl (dtensor) with its default: the reference's logprobs precomputed once for every pair;
- corerl with a frozen reference copy scoring each batch (``precompute_reference_logprobs=false``).

The first step of each is warm-up and not counted; a one-off reference pass (corerl's and TRL's
precompute) is outside the step times and inside the wall time. Prints the median step time,
pairs/s, wall time and the ratio against the faster TRL variant of the same reference mode;
writes bench/results/dpo_vs_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench_output import results_path
from contenders import model_shape, pick_contenders, run_contender, step_clock

RESULTS = results_path("dpo_vs_trl.json")
MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=128)
PAIRS, LR, BETA = 32, 1e-5, 0.1


def preference_rows(count: int = 720) -> list[dict[str, str]]:
    rows = []
    for i in range(count):
        digit, wrong = i % 10, (i // 10 + 1 + i % 10) % 10
        wrong = wrong if wrong != digit else (digit + 1) % 10
        rows.append({"prompt": f"w0 {digit} :", "chosen": " ".join([str(digit)] * 3),
                     "rejected": " ".join([str(wrong)] * 3)})
    return rows


def run_trl(model_dir: str, steps: int, threads: int, checkpointing: bool, precompute: bool, device: str) -> dict[str, Any]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    torch.set_num_threads(threads)
    times: list[float] = []

    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(
            output_dir=out, bf16=False, gradient_checkpointing=checkpointing, use_cpu=device == "cpu",
            per_device_train_batch_size=PAIRS, max_steps=steps, learning_rate=LR, beta=BETA, report_to="none",
            logging_steps=1_000_000, save_strategy="no", seed=7, disable_tqdm=True, dataloader_num_workers=0,
            precompute_ref_log_probs=precompute, max_length=64,
        )
        trainer = DPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), args=config,
            train_dataset=datasets.Dataset.from_list(preference_rows()),
            processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[step_clock(times)],
        )
        trainer.train()
    return {"step_times": times}


def run_corerl(model_dir: str, steps: int, threads: int, precompute: bool) -> dict[str, Any]:
    import torch

    import corerl

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        result = corerl.DPOTrainer({
            "policy": {"model_name": model_dir, "precision": "float32", "max_seq_length": 64,
                       "train_micro_batch_size": 2 * PAIRS, "logprob_micro_batch_size": 2 * 64,
                       "optimizer": {"lr": LR}},
            "algorithm": {"batch_size": PAIRS, "max_steps": steps, "seed": 7,
                          "dpo": {"beta": BETA, "precompute_reference_logprobs": precompute}},
            "data": {"held_out_size": 32},
            "run": {"output_dir": out, "name": "bench", "tensorboard": False},
        }, dataset=preference_rows()).train()
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"step_times": [r["time/step"] for r in rows],
            "phases": {p: [r[f"time/{p}"] for r in rows] for p in ("reference", "training")}}


# -- the parent: build the model, run each contender, compare -------------------------------------

CONTENDERS = {  # name: (reference mode, runner arguments)
    "trl-default": ("per batch", {"checkpointing": True, "precompute": False}),
    "trl-no-gc": ("per batch", {"checkpointing": False, "precompute": False}),
    "trl-precompute": ("precomputed", {"checkpointing": False, "precompute": True}),
    "corerl": ("precomputed", {"precompute": True}),
    "corerl-copy": ("per batch", {"precompute": False}),
}


def child(args: argparse.Namespace) -> None:
    options = CONTENDERS[args.contender][1]
    if args.contender.startswith("corerl"):
        result = run_corerl(args.model, args.steps, args.threads, **options)
    else:
        result = run_trl(args.model, args.steps, args.threads, device=args.device, **options)
    Path(args.out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--hidden", type=int, default=MODEL["hidden_size"])
    parser.add_argument("--layers", type=int, default=MODEL["num_layers"])
    parser.add_argument("--contenders", help=f"comma-separated subset of {', '.join(CONTENDERS)}; default: all (each "
                                             "corerl contender needs a TRL one with its reference mode)")
    parser.add_argument("--contender", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        child(args)
        return
    names = pick_contenders(args.contenders, list(CONTENDERS), list(CONTENDERS), parser)
    modes = {CONTENDERS[n][0] for n in names if n.startswith("trl")}
    if missing := [n for n in names if n.startswith("corerl") and CONTENDERS[n][0] not in modes]:
        parser.error(f"--contenders: {', '.join(missing)} need a TRL contender with the same reference mode")
    if "corerl" not in names:
        parser.error("--contenders: name corerl (the default mode every ratio is taken against)")

    from corerl.models.tiny import build_tiny_model

    shape = model_shape(MODEL, args.hidden, args.layers)
    rows = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(Path(tmp) / "model", **shape))
        for name in names:
            mode = CONTENDERS[name][0]
            result, wall = run_contender(__file__, name, model, Path(tmp), args, env)
            counted = result["step_times"][1:] or result["step_times"]
            median = statistics.median(counted)
            rows.append({"contender": name, "reference": mode, "steps_timed": len(counted), "median_step_s": median,
                         "pairs_per_s": PAIRS / median, "wall_s": wall,
                         "phases_median_s": {p: statistics.median(v[1:] or v) for p, v in result.get("phases", {}).items()}})

    def faster_trl(mode: str) -> dict[str, Any]:
        return min((r for r in rows if r["contender"].startswith("trl") and r["reference"] == mode),
                   key=lambda r: r["median_step_s"])

    ratios = {r["contender"]: faster_trl(r["reference"])["median_step_s"] / r["median_step_s"]
              for r in rows if r["contender"].startswith("corerl")}
    ratios["corerl vs faster TRL of any mode"] = min(r["median_step_s"] for r in rows if r["contender"].startswith("trl")) \
        / next(r["median_step_s"] for r in rows if r["contender"] == "corerl")
    where = f"{args.threads} threads" if args.device == "cpu" else _gpu_name()
    print(f"\n{PAIRS} pairs per step, {args.steps} steps, {where}, float32, hidden {args.hidden} x {args.layers} layers")
    print(f"{'contender':<16}{'reference':<13}{'median step s':>14}{'pairs/s':>10}{'wall s':>9}{'ratio':>8}")
    for r in rows:
        ratio = f"{ratios[r['contender']]:.2f}x" if r["contender"] in ratios else "-"
        print(f"{r['contender']:<16}{r['reference']:<13}{r['median_step_s']:>14.4f}{r['pairs_per_s']:>10.1f}"
              f"{r['wall_s']:>9.1f}{ratio:>8}")
    print("ratio: the faster TRL variant with the same reference mode over corerl's median step time; corerl vs the "
          f"faster TRL of any mode: {ratios['corerl vs faster TRL of any mode']:.2f}x")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "setup": {"model": shape, "pairs": PAIRS, "steps": args.steps, "threads": args.threads, "precision": "float32",
                  "lr": LR, "beta": BETA, "device": where},
        "rows": rows, "corerl_speedup": ratios,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


if __name__ == "__main__":
    main()
