"""GRPO step time: corerl vs TRL's GRPOTrainer on the same model, prompts and reward, equal work.

    .venv/bin/pip install -r bench/requirements-trl.txt    # TRL is a benchmark-only dependency
    .venv/bin/python bench/grpo_vs_trl.py                   # 20 steps each (about 10 minutes on 2 cores)
    .venv/bin/python bench/grpo_vs_trl.py --steps 5         # a quick look
    .venv/bin/python bench/grpo_vs_trl.py --contenders trl-no-gc,corerl-hf --precision bfloat16
    python bench/grpo_vs_trl.py --device cuda --shape 605M --precision bfloat16   # on a GPU
    python bench/grpo_vs_trl.py --device cuda --shape qwen2-1.5b --precision bfloat16 --steps 10
    .venv/bin/python bench/grpo_vs_trl.py --model smollm2-135m-instruct --steps 4   # a real pretrained model

``--model`` takes a real model instead of ``--shape``: a Hugging Face folder, a ``.gguf`` file or a
packaged model (``smollm2-135m-instruct``, converted once into corerl's model cache); both sides
load the same folder and its own tokenizer, with the same prompts and token counts.

A Qwen2-style model built once in code (random weights, the built-in word-level tokenizer) at
``--shape``: tiny (hidden 256 x 4 layers, the default), 76M (1024 x 8), 605M (2048 x 16), all with
a 128-word vocabulary and ``--hidden``/``--layers`` to resize them; or qwen2-1.5b, Qwen2-1.5B's
shape (hidden 1536 x 28 layers, 12 heads, 2 KV heads, MLP 8960, vocabulary 151936 and a tokenizer
of that many words, tied embeddings). The digit-echo prompts as text; the reward is the share of
completion words equal to the prompt's digit. 8 prompts x 8 generations, 64 new tokens with end of
sequence ignored on both sides (TRL: ``generation_kwargs={"min_new_tokens": 64}``; corerl:
``policy.generation.ignore_eos``, left out with a warning where the installed corerl lacks it), so
every completion is 64 tokens; the same torch thread count everywhere. ``--precision float32``
(default) or ``bfloat16``: both sides keep float32 weights and compute under bfloat16 autocast (TRL
``bf16=True`` through accelerate's mixed precision, the model loaded in float32 as TRL loads one
itself; corerl ``policy.precision: bfloat16``). Contenders, each in its own fresh process, one after
the other (``--contenders a,b`` picks some):

- trl-default: TRL GRPOTrainer with its defaults, use_vllm=False (gradient checkpointing on);
- trl-no-gc: the same with gradient checkpointing off;
- corerl: dtensor training, vLLM generation (hf when vllm is absent), through the Python API;
- corerl-hf: dtensor training and hf generation on the training model itself (no refit copy),
  with the KV cache corerl picks (``auto``: static on a GPU, dynamic on CPU);
- corerl-hf-dynamic: corerl-hf with ``policy.generation.hf_kv_cache: dynamic``.

The default set is the first four on CPU and trl-no-gc, corerl-hf, corerl-hf-dynamic on
``--device cuda``. The first step of each is warm-up and not counted. Tokens are counted as each
side generated them: corerl's ``generated_tokens`` per step, TRL's ``completion_ids`` as handed to
the reward function (called once per step here). Prints per contender the median step time,
samples/s, completion tokens per step, tokens/s (tokens per step / median step), generation
tokens/s (tokens per step / median generation time; TRL's is its ``_generate``, timed from
outside), the median generation time, the wall time, and two ratios: the faster TRL variant's
median step over ours, and our tokens/s over the best TRL tokens/s. Then the median time per phase
and what corerl's hf generation logged (under bfloat16 autocast with the static cache, corerl-hf
decodes through a bfloat16 copy of the training model's weights, refreshed before each call;
corerl-hf-dynamic decodes the training model itself under autocast, as TRL does). A contender that fails is recorded as an error
row (its stderr shows as it runs) and the others go on; the exit status is then 1. Writes the JSON
(machine, package versions, command line, precision, shape, parameter count, rows) to
bench/results/grpo_vs_trl.json on CPU (grpo_vs_trl-<model>.json with ``--model``, -<model>-bfloat16.json
in bfloat16) and to bench/results/gpu/grpo_vs_trl-<shape>-<precision>.json
on ``--device cuda``, or into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_output import results_path
from contenders import (
    failure_text,
    machine,
    model_shape,
    pick_contenders,
    run_contender,
    step_clock,
    versions,
)

MODEL = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512, vocab_size=128)
#: --shape: hidden x layers resized from MODEL (model_shape), or a whole shape of its own
SIZES = {"tiny": (256, 4), "76M": (1024, 8), "605M": (2048, 16)}
QWEN2_1_5B = dict(hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2, intermediate_size=8960,
                  vocab_size=151936, tie_word_embeddings=True)
SHAPES = [*SIZES, "qwen2-1.5b"]
PROMPTS, GENERATIONS, NEW_TOKENS, LR = 8, 8, 64, 1e-6
CONTENDERS = ["trl-default", "trl-no-gc", "corerl", "corerl-hf", "corerl-hf-dynamic"]
DEFAULT_CONTENDERS = {"cpu": ["trl-default", "trl-no-gc", "corerl", "corerl-hf"],
                      "cuda": ["trl-no-gc", "corerl-hf", "corerl-hf-dynamic"]}
#: corerl contender -> (generation backend, hf KV cache); None: corerl's default
CORERL_SETTINGS = {"corerl": (None, None), "corerl-hf": ("hf", None), "corerl-hf-dynamic": ("hf", "dynamic")}


def prompt_rows(count: int = 64) -> list[dict[str, Any]]:
    return [{"prompt": f"w0 {i % 10} :", "answer": str(i % 10)} for i in range(count)]


def digit_share(completion: str, answer: str) -> float:
    words = completion.split()
    return sum(word == answer for word in words) / len(words) if words else 0.0


def corerl_ignores_eos() -> bool:
    """Whether the installed corerl has ``policy.generation.ignore_eos``."""
    from corerl.config.schema import GenerationConfig

    return "ignore_eos" in {a.name for a in GenerationConfig.__attrs_attrs__}


# -- the contenders, each run in a child process -------------------------------------------------


def run_trl(model_dir: str, steps: int, threads: int, checkpointing: bool, device: str,
            precision: str) -> dict[str, Any]:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    times: list[float] = []
    tokens: list[int] = []

    def reward(prompts: list[str], completions: list[str], answer: list[str], completion_ids: list[list[int]],
               **_: Any) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))  # one call per step: the step's generation batch
        return [digit_share(c, a) for c, a in zip(completions, answer, strict=True)]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_vllm=False, bf16=precision == "bfloat16", gradient_checkpointing=checkpointing,
            use_cpu=device == "cpu", per_device_train_batch_size=PROMPTS * GENERATIONS, num_generations=GENERATIONS,
            max_completion_length=NEW_TOKENS, generation_kwargs={"min_new_tokens": NEW_TOKENS}, max_steps=steps,
            learning_rate=LR, report_to="none", logging_steps=1_000_000, save_strategy="no", seed=7,
            disable_tqdm=True, dataloader_num_workers=0,
        )
        generation: list[float] = []
        # float32 weights, as TRL loads a model given by name; bf16=True adds accelerate's autocast
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), reward_funcs=reward,
            args=config, train_dataset=datasets.Dataset.from_list(prompt_rows()),
            processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[step_clock(times)],
        )
        trainer._generate = _timed(trainer._generate, generation)  # TRL's own generation, timed from outside
        trainer.train()
    return {"step_times": times, "phases": {"generation": generation}, "completion_tokens": tokens}


def _timed(function: Any, seconds: list[float]) -> Any:
    """``function`` appending the wall time of each call to ``seconds``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = function(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return out

    return timed


def corerl_generation(backend: str | None, kv_cache: str | None, threads: int) -> dict[str, Any]:
    """The ``policy.generation`` section of a corerl contender."""
    import importlib.util

    backend = backend or ("vllm" if importlib.util.find_spec("vllm") else "hf")
    generation: dict[str, Any] = {"backend": backend, "max_new_tokens": NEW_TOKENS, "temperature": 1.0}
    if corerl_ignores_eos():
        generation["ignore_eos"] = True
    if kv_cache:
        generation["hf_kv_cache"] = kv_cache
    if backend == "vllm":
        generation["vllm_cfg"] = {"cpu_threads": threads}
    return generation


def run_corerl(model_dir: str, steps: int, threads: int, backend: str | None, kv_cache: str | None,
               precision: str) -> dict[str, Any]:
    import torch

    import corerl

    torch.set_num_threads(threads)
    generation = corerl_generation(backend, kv_cache, threads)
    notes = hf_generation_notes()
    with tempfile.TemporaryDirectory() as out:
        result = corerl.GRPOTrainer({
            "policy": {"model_name": model_dir, "precision": precision, "max_seq_length": 128,
                       "train_micro_batch_size": PROMPTS * GENERATIONS, "optimizer": {"lr": LR}, "generation": generation},
            "algorithm": {"batch_size": PROMPTS, "num_generations_per_prompt": GENERATIONS, "max_steps": steps, "seed": 7},
            "data": {"held_out_size": 8},
            "run": {"output_dir": out, "name": "bench"},
        }, dataset=prompt_rows(), reward_fn=lambda completion, example: digit_share(completion, example["answer"])).train()
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    phases = ("generation", "logprobs", "training", "refit")
    return {"step_times": [r["time/step"] for r in rows], "backend": generation["backend"],
            "kv_cache": generation.get("hf_kv_cache", "auto"), "ignore_eos": generation.get("ignore_eos", False),
            "phases": {p: [r[f"time/{p}"] for r in rows] for p in phases},
            "completion_tokens": [r["generated_tokens"] for r in rows], "notes": notes}


def hf_generation_notes() -> list[str]:
    """A list the hf generation backend's log messages are appended to (it says there when it
    keeps a KV cache other than the one asked for, as under bfloat16 autocast)."""
    import logging

    notes: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            notes.append(record.getMessage())

    logger = logging.getLogger("corerl.generation.hf")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    return notes


def child(args: argparse.Namespace) -> None:
    if args.contender in CORERL_SETTINGS:
        backend, kv_cache = CORERL_SETTINGS[args.contender]
        result = run_corerl(args.model, args.steps, args.threads, backend, kv_cache, args.precision)
    else:
        result = run_trl(args.model, args.steps, args.threads, checkpointing=args.contender == "trl-default",
                         device=args.device, precision=args.precision)
    Path(args.out).write_text(json.dumps(result))


# -- the parent: build the model, run each contender, compare -------------------------------------


def resolve_shape(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, dict[str, Any]]:
    """The shape's label (the preset's name, or hidden x layers where resized) and its build_tiny_model keywords;
    for ``--model``, its name and the shape its config.json states."""
    if args.model:
        return Path(args.model).name.removesuffix(".gguf"), real_model_shape(real_model_folder(args.model, parser))
    if args.shape == "qwen2-1.5b":
        if args.hidden is not None or args.layers is not None:
            parser.error("--shape qwen2-1.5b is a whole shape: --hidden/--layers do not apply to it")
        return args.shape, dict(QWEN2_1_5B)
    hidden, layers = SIZES[args.shape]
    if args.hidden is None and args.layers is None:
        return args.shape, model_shape(MODEL, hidden, layers)
    hidden, layers = args.hidden or hidden, args.layers or layers
    return f"{hidden}x{layers}", model_shape(MODEL, hidden, layers)


def real_model_folder(name: str, parser: argparse.ArgumentParser) -> Path:
    """``--model`` as a Hugging Face folder (a GGUF file or packaged model converted once)."""
    from corerl.errors import CorerlError
    from corerl.models.gguf import ensure_converted, gguf_source

    try:
        source = gguf_source(name, None)
        folder = ensure_converted(source) if source is not None else Path(name)
    except CorerlError as exc:
        parser.error(f"--model: {exc}")
    if not (folder / "config.json").is_file():
        parser.error(f"--model: {name} is not a Hugging Face folder, a .gguf file or a packaged model")
    return folder


def real_model_shape(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "config.json").read_text())
    return {"hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
            "num_heads": config["num_attention_heads"],
            "num_kv_heads": config.get("num_key_value_heads", config["num_attention_heads"]),
            "intermediate_size": config.get("intermediate_size"), "vocab_size": config["vocab_size"],
            "folder": str(folder)}


def parameter_count(model_dir: Path) -> int:
    """The model's parameters (tied embeddings once), counted on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def output_path(args: argparse.Namespace, label: str) -> Path:
    name = "grpo_vs_trl.json" if args.device == "cpu" else f"grpo_vs_trl-{label}-{args.precision}.json"
    if args.model and args.device == "cpu":  # float32 keeps the name it always had
        name = f"grpo_vs_trl-{label}.json" if args.precision == "float32" else f"grpo_vs_trl-{label}-{args.precision}.json"
    if args.out_dir:
        return Path(args.out_dir) / name
    return results_path(name if args.device == "cpu" else f"gpu/{name}")


def run_all(names: list[str], shape: dict[str, Any], args: argparse.Namespace) -> tuple[list[dict[str, Any]], int]:
    """Build the model, run each contender in turn; their rows (error rows for failures) and the parameter count."""
    from corerl.models.tiny import build_tiny_model

    rows = []
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if "folder" in shape:  # --model: a real one
            model = Path(shape["folder"])
        else:
            print(f"building the model ({shape['hidden_size']} x {shape['num_layers']} layers) ...", flush=True)
            model = build_tiny_model(Path(tmp) / "model", **shape)
        params = parameter_count(model)
        for name in names:
            try:
                result, wall = run_contender(__file__, name, str(model), Path(tmp), args, env,
                                             extra=["--precision", args.precision])
            except subprocess.CalledProcessError as exc:
                last = (exc.stderr or "").strip().splitlines() or ["(no stderr)"]
                print(f"{name} failed, exit status {exc.returncode}: {last[-1]}; going on", flush=True)
                rows.append({"contender": name, "error": failure_text(exc)})
                continue
            rows.append(summarise(name, result) | {"wall_s": wall})
    return rows, params


def _timed_median(values: list[float]) -> float:
    return statistics.median(values[1:] or values)  # the first step warms up


def summarise(name: str, result: dict[str, Any]) -> dict[str, Any]:
    counted = result["step_times"][1:] or result["step_times"]
    median = statistics.median(counted)
    tokens = result["completion_tokens"]
    per_step = statistics.mean(tokens[1:] or tokens) if tokens else None
    row: dict[str, Any] = {"contender": name, "steps_timed": len(counted), "median_step_s": median,
                           "samples_per_s": PROMPTS * GENERATIONS / median, "completion_tokens_per_step": per_step,
                           "tokens_per_s": per_step / median if per_step is not None else None}
    row["phases_median_s"] = {p: _timed_median(v) for p, v in result["phases"].items() if v}
    generation = row["phases_median_s"].get("generation")
    row["generation_tokens_per_s"] = per_step / generation if per_step is not None and generation else None
    row["completion_tokens"] = tokens
    names = {"backend": "generation_backend", "kv_cache": "hf_kv_cache", "ignore_eos": "ignore_eos",
             "notes": "generation_notes"}
    row |= {names[k]: v for k, v in result.items() if k in names}  # corerl's generation settings
    return row


def faster_trl(rows: list[dict[str, Any]], key: str, larger: bool) -> dict[str, Any] | None:
    """The TRL row with the best ``key`` (largest where ``larger``), None without a TRL row that has it."""
    trl = [r for r in rows if r["contender"].startswith("trl") and r.get(key)]
    if not trl:
        return None
    return max(trl, key=lambda r: r[key]) if larger else min(trl, key=lambda r: r[key])


def ratios(rows: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    """Each corerl row against the faster TRL: by step time (TRL's / ours) and by tokens/s (ours / TRL's)."""
    by_step, by_tokens = faster_trl(rows, "median_step_s", larger=False), faster_trl(rows, "tokens_per_s", larger=True)
    corerl = [r for r in rows if r["contender"].startswith("corerl") and "error" not in r]
    step = {r["contender"]: by_step["median_step_s"] / r["median_step_s"] for r in corerl} if by_step else {}
    tokens = ({r["contender"]: r["tokens_per_s"] / by_tokens["tokens_per_s"] for r in corerl if r["tokens_per_s"]}
              if by_tokens else {})
    return step, tokens


def _cell(value: Any, spec: str, width: int) -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def print_table(rows: list[dict[str, Any]], step_ratio: dict[str, float], token_ratio: dict[str, float]) -> None:
    heads = [("median step s", 15), ("samples/s", 11), ("tokens/step", 13), ("tokens/s", 10), ("gen tok/s", 11),
             ("gen s", 8), ("wall s", 9), ("vs TRL step", 13), ("vs TRL tok/s", 14)]
    print(f"{'contender':<19}" + "".join(f"{h:>{w}}" for h, w in heads))
    for r in rows:
        if "error" in r:
            continue
        cells = [(r["median_step_s"], ".3f"), (r["samples_per_s"], ".1f"), (r["completion_tokens_per_step"], ".0f"),
                 (r["tokens_per_s"], ".0f"), (r["generation_tokens_per_s"], ".0f"),
                 (r["phases_median_s"].get("generation"), ".3f"), (r["wall_s"], ".1f"),
                 (step_ratio.get(r["contender"]), ".2f"), (token_ratio.get(r["contender"]), ".2f")]
        line = "".join(_cell(v, s, w) for (v, s), (_, w) in zip(cells, heads, strict=True))
        print(f"{r['contender']:<19}{line}")
    for r in rows:
        if "error" in r:
            print(f"{r['contender']} FAILED: {r['error']}")
        else:
            print(f"{r['contender']} median per phase (s): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["phases_median_s"].items()))
            for note in r.get("generation_notes", []):
                print(f"{r['contender']}: {note}")


def _size(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def header(args: argparse.Namespace, label: str, shape: dict[str, Any], params: int, where: str) -> str:
    return (f"{PROMPTS} prompts x {GENERATIONS} generations, {NEW_TOKENS} new tokens (end of sequence ignored), "
            f"{args.steps} steps, {where}, {args.precision}\nshape {label}: hidden {shape['hidden_size']} x "
            f"{shape['num_layers']} layers, {shape['num_heads']} heads, {shape['num_kv_heads']} KV heads, MLP "
            f"{shape.get('intermediate_size') or 2 * shape['hidden_size']}, vocabulary {shape['vocab_size']}; "
            f"{params:,} parameters ({_size(params)})\nvs TRL: the faster TRL variant's median step s / ours; our "
            f"tokens/s / the best TRL tokens/s (above 1: corerl faster)")


def parse_args() -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both sides run; cuda: TRL with use_cpu=False, corerl's ranks take the GPU")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: float32 weights under bfloat16 autocast on both sides (TRL bf16=True)")
    parser.add_argument("--shape", choices=SHAPES, default="tiny",
                        help="tiny 256x4, 76M 1024x8, 605M 2048x16 (128-word vocabulary), or Qwen2-1.5B's shape")
    parser.add_argument("--hidden", type=int, help="resize the --shape preset (not qwen2-1.5b)")
    parser.add_argument("--layers", type=int, help="resize the --shape preset (not qwen2-1.5b)")
    parser.add_argument("--contenders", help=f"comma-separated subset of {', '.join(CONTENDERS)}; default: "
                        f"{', '.join(DEFAULT_CONTENDERS['cpu'])} on cpu, {', '.join(DEFAULT_CONTENDERS['cuda'])} on cuda")
    parser.add_argument("--out-dir", help="folder for the JSON (default bench/results/, bench/results/gpu/ on cuda)")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help="a real model instead of --shape: a Hugging Face folder, a .gguf file or "
                                        "a packaged model (smollm2-135m-instruct)")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    return parser.parse_args(), parser


def main() -> None:
    args, parser = parse_args()
    if args.contender:
        child(args)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no GPU on this machine")
    label, shape = resolve_shape(args, parser)
    names = pick_contenders(args.contenders, CONTENDERS, DEFAULT_CONTENDERS[args.device], parser)
    eos_note = None if corerl_ignores_eos() else (
        "WARNING: this corerl has no policy.generation.ignore_eos: corerl's completions stop at end of sequence, "
        f"TRL's run to {NEW_TOKENS} tokens (compare tokens/s, not step time)")
    if eos_note and any(n in CORERL_SETTINGS for n in names):
        print(eos_note, flush=True)
    rows, params = run_all(names, shape, args)

    step_ratio, token_ratio = ratios(rows)
    info = machine(args.device, args.threads)
    where = f"{args.threads} threads" if args.device == "cpu" else f"{info['gpu']} (CUDA {info['cuda']})"
    print("\n" + header(args, label, shape, params, where))
    if eos_note and any(n in CORERL_SETTINGS for n in names):
        print(eos_note)
    print_table(rows, step_ratio, token_ratio)
    write(output_path(args, label), args, label, shape, params, info, rows, step_ratio, token_ratio)
    if any("error" in r for r in rows):
        sys.exit(1)


def write(path: Path, args: argparse.Namespace, label: str, shape: dict[str, Any], params: int, info: dict[str, Any],
          rows: list[dict[str, Any]], step_ratio: dict[str, float], token_ratio: dict[str, float]) -> None:
    by_step = faster_trl(rows, "median_step_s", larger=False)
    by_tokens = faster_trl(rows, "tokens_per_s", larger=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "setup": {"shape": label, "model": shape, "parameters": params, "prompts": PROMPTS, "generations": GENERATIONS,
                  "new_tokens": NEW_TOKENS, "ignore_eos": True, "corerl_ignore_eos": corerl_ignores_eos(),
                  "steps": args.steps, "threads": args.threads, "precision": args.precision, "lr": LR,
                  "device": info.get("gpu", args.device)},
        "machine": info, "versions": versions(), "command": sys.argv,
        "rows": rows, "faster_trl": by_step and by_step["contender"], "corerl_speedup_vs_faster_trl": step_ratio,
        "faster_trl_by_tokens_per_s": by_tokens and by_tokens["contender"],
        "corerl_tokens_per_s_vs_faster_trl": token_ratio,
    }, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
