"""GRPO step time: corerl vs TRL's GRPOTrainer on the same tiny model, prompts and reward.

    .venv/bin/pip install -r bench/requirements-trl.txt    # TRL is a benchmark-only dependency
    .venv/bin/python bench/grpo_vs_trl.py                   # 20 steps each (about 10 minutes on 2 cores)
    .venv/bin/python bench/grpo_vs_trl.py --steps 5         # a quick look
    python bench/grpo_vs_trl.py --device cuda --hidden 1024 --layers 8   # on a GPU (TRL with use_cpu=False)

A Qwen2-style model (hidden 256, 4 layers by default, the built-in word-level tokenizer) built once;
the digit-echo prompts as text; the reward is the share of completion words equal to the
prompt's digit. 8 prompts x 8 generations, 64 new tokens, float32, the same torch thread
count everywhere. Contenders, each in its own fresh process, one after the other:

- TRL GRPOTrainer with its defaults, use_vllm=False and bf16=False (gradient checkpointing on);
- the same with gradient checkpointing off;
- corerl: dtensor training, vLLM generation (hf when vllm is absent), through the Python API;
- corerl-hf: dtensor training and hf generation on the training model itself (no refit copy).

The first step of each is warm-up and not counted. Prints median step time, samples/s, the
ratio against the faster TRL variant, corerl's median time per phase and TRL's generation
time (its _generate, timed from outside); writes
bench/results/grpo_vs_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_output import results_path
from contenders import model_shape, run_contender, step_clock

RESULTS = results_path("grpo_vs_trl.json")
MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=128)
PROMPTS, GENERATIONS, NEW_TOKENS, LR = 8, 8, 64, 1e-6


def prompt_rows(count: int = 64) -> list[dict[str, Any]]:
    return [{"prompt": f"w0 {i % 10} :", "answer": str(i % 10)} for i in range(count)]


def digit_share(completion: str, answer: str) -> float:
    words = completion.split()
    return sum(word == answer for word in words) / len(words) if words else 0.0


# -- the contenders, each run in a child process -------------------------------------------------


def run_trl(model_dir: str, steps: int, threads: int, checkpointing: bool, device: str) -> dict[str, Any]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    times: list[float] = []

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [digit_share(c, a) for c, a in zip(completions, answer, strict=True)]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_vllm=False, bf16=False, gradient_checkpointing=checkpointing, use_cpu=device == "cpu",
            per_device_train_batch_size=PROMPTS * GENERATIONS, num_generations=GENERATIONS,
            max_completion_length=NEW_TOKENS, max_steps=steps, learning_rate=LR, report_to="none",
            logging_steps=1_000_000, save_strategy="no", seed=7, disable_tqdm=True, dataloader_num_workers=0,
        )
        phases: dict[str, list[float]] = {"generation": []}
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), reward_funcs=reward,
            args=config, train_dataset=datasets.Dataset.from_list(prompt_rows()),
            processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[step_clock(times)],
        )
        generate = trainer._generate  # timed from outside: TRL's own generation, untouched

        def timed_generate(prompts: list) -> Any:
            start = time.perf_counter()
            out = generate(prompts)
            phases["generation"].append(time.perf_counter() - start)
            return out

        trainer._generate = timed_generate
        trainer.train()
    return {"step_times": times, "phases": {"generation": phases["generation"]}}


def run_corerl(model_dir: str, steps: int, threads: int, generation_backend: str | None) -> dict[str, Any]:
    import importlib.util

    import torch

    import corerl

    torch.set_num_threads(threads)
    backend = generation_backend or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    generation: dict[str, Any] = {"backend": backend, "max_new_tokens": NEW_TOKENS, "temperature": 1.0}
    if backend == "vllm":
        generation["vllm_cfg"] = {"cpu_threads": threads}
    with tempfile.TemporaryDirectory() as out:
        result = corerl.GRPOTrainer({
            "policy": {"model_name": model_dir, "precision": "float32", "max_seq_length": 128,
                       "train_micro_batch_size": PROMPTS * GENERATIONS, "optimizer": {"lr": LR}, "generation": generation},
            "algorithm": {"batch_size": PROMPTS, "num_generations_per_prompt": GENERATIONS, "max_steps": steps, "seed": 7},
            "data": {"held_out_size": 8},
            "run": {"output_dir": out, "name": "bench"},
        }, dataset=prompt_rows(), reward_fn=lambda completion, example: digit_share(completion, example["answer"])).train()
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    phases = ("generation", "logprobs", "training", "refit")
    return {"step_times": [r["time/step"] for r in rows], "backend": backend,
            "phases": {p: [r[f"time/{p}"] for r in rows] for p in phases},
            "completion_tokens": [r["generated_tokens"] for r in rows]}


# -- the parent: build the model, run each contender, compare -------------------------------------

CONTENDERS = ["trl-default", "trl-no-gc", "corerl", "corerl-hf"]


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def child(args: argparse.Namespace) -> None:
    if args.contender.startswith("corerl"):
        result = run_corerl(args.model, args.steps, args.threads, "hf" if args.contender == "corerl-hf" else None)
    else:
        result = run_trl(args.model, args.steps, args.threads, checkpointing=args.contender == "trl-default",
                         device=args.device)
    Path(args.out).write_text(json.dumps(result))


def summarise(name: str, result: dict[str, Any]) -> dict[str, Any]:
    counted = result["step_times"][1:] or result["step_times"]  # the first step warms up
    median = statistics.median(counted)
    row = {"contender": name, "steps_timed": len(counted), "median_step_s": median,
           "samples_per_s": PROMPTS * GENERATIONS / median}
    row["phases_median_s"] = {p: statistics.median(v[1:] or v) for p, v in result["phases"].items() if v}
    if "backend" in result:
        row["generation_backend"] = result["backend"]
        row["completion_tokens_mean"] = statistics.mean(result["completion_tokens"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both sides run; cuda: TRL with use_cpu=False, corerl's ranks take the GPU")
    parser.add_argument("--hidden", type=int, default=MODEL["hidden_size"])
    parser.add_argument("--layers", type=int, default=MODEL["num_layers"])
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.contender:
        child(args)
        return

    from corerl.models.tiny import build_tiny_model

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no GPU on this machine")
    shape = model_shape(MODEL, args.hidden, args.layers)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(Path(tmp) / "model", **shape))
        # the GPU run has no vLLM: corerl's default generation there is hf on the training model
        names = [n for n in CONTENDERS if not (args.device == "cuda" and n == "corerl")]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else dict(os.environ)
        for name in names:
            result, wall = run_contender(__file__, name, model, Path(tmp), args, env)
            rows.append(summarise(name, result) | {"wall_s": wall})

    trl_best = min((r for r in rows if r["contender"].startswith("trl")), key=lambda r: r["median_step_s"])
    ratios = {r["contender"]: trl_best["median_step_s"] / r["median_step_s"] for r in rows
              if r["contender"].startswith("corerl")}
    where = f"{args.threads} threads" if args.device == "cpu" else _gpu_name()
    print(f"\n{PROMPTS} prompts x {GENERATIONS} generations, {NEW_TOKENS} new tokens, {args.steps} steps, "
          f"{where}, float32, hidden {args.hidden} x {args.layers} layers")
    print(f"{'contender':<14}{'median step s':>15}{'samples/s':>12}{'wall s':>9}{'vs faster TRL':>15}{'refit share':>13}")
    for r in rows:
        phases = r["phases_median_s"]
        refit = f"{phases['refit'] / r['median_step_s']:.1%}" if "refit" in phases else "-"
        ratio = f"{ratios[r['contender']]:.2f}x" if r["contender"] in ratios else "-"
        print(f"{r['contender']:<14}{r['median_step_s']:>15.3f}{r['samples_per_s']:>12.1f}{r['wall_s']:>9.1f}"
              f"{ratio:>15}{refit:>13}")
    for r in rows:
        print(f"{r['contender']} median per phase (s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["phases_median_s"].items()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "setup": {"model": shape, "prompts": PROMPTS, "generations": GENERATIONS, "new_tokens": NEW_TOKENS,
                  "steps": args.steps, "threads": args.threads, "precision": "float32", "lr": LR,
                  "device": where},
        "rows": rows, "faster_trl": trl_best["contender"], "corerl_speedup_vs_faster_trl": ratios,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
