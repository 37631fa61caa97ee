"""Generation tokens/s: vllm (each engine layout) vs hf, plus refit time, idle-engine cost and
vLLM's n-gram speculative decoding against the same engine without it.

    .venv/bin/python bench/generation.py            # the full run (several minutes on 2 cores)
    .venv/bin/python bench/generation.py --quick    # small model, float32 only
    .venv/bin/python bench/generation.py --smoke    # the smallest setting: that every path runs, no figures to keep
    .venv/bin/python bench/generation.py --layouts multi_process   # one vllm engine layout

64 prompts x 4 samples x 64 new tokens, for a ~2.6M and a ~25M parameter Qwen2-style model,
in float32 and bfloat16. Every backend runs through corerl's own generation contract (the
engine in a Ray actor for vllm, as the plugin runs it by default). The training-phase
slowdown is the time of a fixed training phase in this process with an idle engine alive
(right after it generated) against the same phase with no engine. Speculative decoding
(``policy.generation.vllm_cfg.speculative_config``, method ngram: drafts looked up in the prompt
and the text so far, 3 tokens a step) is timed on the smallest model in float32, greedy, on prompts
that repeat a pattern (what n-gram lookup drafts from), against the engine without it in the same
run; its greedy tokens must equal the plain engine's (the target model decides every token). All
in one run; writes bench/results/generation.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from bench_output import results_path

from corerl.config import load_config
from corerl.generation.contract import SamplingSettings
from corerl.models.tiny import build_tiny_model
from corerl.plugin_manager import PluginHost
from corerl.testing import write_recipe

RESULTS = results_path("generation.json")
SIZES = {  # name -> tiny-model arguments
    "0.2M": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256),  # --smoke
    "2.6M": dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512),
    "25M": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=1536),
}
VOCAB = 512
LAYOUTS = ("in_process", "multi_process")  # vllm's engine layouts (policy.generation.vllm_cfg.engine_layout)


def parameter_count(model_dir: str) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


#: vLLM's n-gram drafter (no draft model): what the speculative row runs
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def make_backend(backend: str, model_dir: str, work: Path, dtype: str, layout: str = "auto",
                 speculative: dict[str, Any] | None = None) -> Any:
    name = f"{backend}-{layout}-{dtype}{'-spec' if speculative else ''}"
    recipe = write_recipe(work / f"{name}.yaml", {"policy": {
        "model_name": model_dir, "precision": dtype, "max_seq_length": 128,
        "generation": {"backend": backend, "vllm_cfg": {"engine_layout": layout, "cpu_kvcache_space_gib": 2,
                                                        "speculative_config": speculative}}}})
    host = PluginHost(env={})
    config = load_config(recipe, [], host)
    engine = host.generation_backends.get(backend).create(config=config)
    engine.load_hf(model_dir)
    return engine


def timed_generate(engine: Any, prompts: list[list[int]], sampling: SamplingSettings, reps: int) -> float:
    """Median tokens/s over ``reps`` runs (after one warm-up)."""
    engine.generate(prompts[:8], SamplingSettings(temperature=1.0, max_new_tokens=8, seed=0), n=1)
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        groups = engine.generate(prompts, sampling, n=4)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(s.completion_ids) for g in groups for s in g) / elapsed)
    return statistics.median(rates)


def speculative_row(model_dir: str, work: Path, count: int, new_tokens: int, reps: int) -> dict[str, Any]:
    """Greedy tokens/s of the in-process vllm engine with n-gram drafting (:data:`NGRAM`) and
    without, on prompts that repeat a pattern, and whether both give the same tokens."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, VOCAB, (6,), generator=gen).tolist() * 4 for _ in range(count)]
    greedy = SamplingSettings(temperature=0.0, max_new_tokens=new_tokens)
    found = {}
    for label, speculative in (("plain", None), ("ngram", NGRAM)):
        engine = make_backend("vllm", model_dir, work, "float32", "in_process", speculative)
        engine.generate(prompts[:2], greedy)
        rates, tokens = [], None
        for _ in range(reps):
            start = time.perf_counter()
            groups = engine.generate(prompts, greedy)
            rates.append(sum(len(g[0].completion_ids) for g in groups) / (time.perf_counter() - start))
            tokens = [list(g[0].completion_ids) for g in groups]
        engine.shutdown()
        found[label] = (statistics.median(rates), tokens)
    return {"name": "vllm ngram speculative vs vllm", "ours": round(found["ngram"][0], 1),
            "theirs": round(found["plain"][0], 1), "ratio": round(found["ngram"][0] / found["plain"][0], 3),
            "unit": "tokens/s", "same_greedy_tokens": found["ngram"][1] == found["plain"][1],
            "speculative_config": NGRAM}


def refit_seconds(engine: Any, model_dir: str, reps: int = 3) -> float:
    from transformers import AutoModelForCausalLM

    weights = list(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict().items())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        engine.update_weights(weights)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_phase(model: Any, batch: torch.Tensor, steps: int) -> float:
    """Seconds for ``steps`` forward+backward passes of ``model`` on ``batch`` in this process."""
    start = time.perf_counter()
    for _ in range(steps):
        model(input_ids=batch, labels=batch).loss.backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2.6M float32 only, one timed run")
    parser.add_argument("--smoke", action="store_true", help="the smallest setting (tests): a 0.2M model, 16 prompts "
                                                              "x 4 samples x 8 new tokens, one timed run")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"comma-separated vllm engine layouts of {', '.join(LAYOUTS)} (default: both)")
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    if unknown := sorted(set(layouts) - set(LAYOUTS)):
        parser.error(f"--layouts: no layout {unknown}; vllm has {list(LAYOUTS)}")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    sizes = ["0.2M"] if args.smoke else ["2.6M"] if args.quick else [size for size in SIZES if size != "0.2M"]
    dtypes = ["float32"] if args.quick or args.smoke else ["float32", "bfloat16"]
    reps = 1 if args.quick or args.smoke else args.reps
    count, new_tokens, phase_steps = (16, 8, 2) if args.smoke else (64, 64, 6)
    work = Path(tempfile.mkdtemp(prefix="corerl-genbench-"))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, VOCAB, (int(torch.randint(16, 33, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(count)]
    sampling = SamplingSettings(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    rows: list[dict[str, Any]] = []
    slowdown: dict[str, float] = {}
    speculative: dict[str, Any] = {}
    for size in sizes:
        model_dir = str(build_tiny_model(work / size, vocab_size=VOCAB, max_positions=128, **SIZES[size]))
        params = parameter_count(model_dir)
        if size == sizes[0]:  # the in-process engine, whatever --layouts times
            speculative = {"size": size, "parameters": params, "dtype": "float32",
                           **speculative_row(model_dir, work, count, new_tokens, reps)}
        for dtype in dtypes:
            point = {"size": size, "parameters": params, "dtype": dtype}
            hf = make_backend("hf", model_dir, work, dtype)
            hf_rate = timed_generate(hf, prompts, sampling, reps)
            hf.shutdown()
            for layout in (layout for layout in LAYOUTS if layout in layouts):
                engine = make_backend("vllm", model_dir, work, dtype, layout)
                rate = timed_generate(engine, prompts, sampling, reps)
                refit = refit_seconds(engine, model_dir)
                if size == sizes[0] and dtype == "float32":
                    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                    batch = torch.randint(4, VOCAB, (8, 128), generator=gen)
                    training_phase(model, batch, 1)
                    engine.generate(prompts[:4], sampling, n=1)  # the engine has just worked, now idles
                    busy = training_phase(model, batch, phase_steps)
                    engine.shutdown()
                    engine = None
                    alone = training_phase(model, batch, phase_steps)
                    slowdown[layout] = busy / alone - 1.0
                else:
                    engine.shutdown()
                rows.append({"name": f"vllm {layout} vs hf", **point, "layout": layout, "ours": round(rate, 1),
                             "theirs": round(hf_rate, 1), "ratio": round(rate / hf_rate, 3), "unit": "tokens/s",
                             "refit_s": round(refit, 4)})
    from rich.table import Table

    from corerl.reporting.console import make_console

    table = Table(title=f"generation: {count} prompts x 4 samples x {new_tokens} new tokens, "
                        f"{torch.get_num_threads()} threads")
    for column in ("model", "dtype", "vllm layout", "vllm tok/s", "hf tok/s", "ratio", "refit s"):
        table.add_column(column)
    for row in rows:
        default = " (default)" if row["layout"] == "in_process" else ""
        table.add_row(f"{row['size']} ({row['parameters'] / 1e6:.2f}M)", row["dtype"], row["layout"] + default,
                      f"{row['ours']:,.0f}", f"{row['theirs']:,.0f}", f"{row['ratio']:.2f}", f"{row['refit_s']:.3f}")
    console = make_console()
    console.print(table)
    for layout, value in slowdown.items():
        console.print(f"training phase next to an idle {layout} engine: {value * 100:+.1f}% time")
    if speculative:
        console.print(f"n-gram speculative decoding ({speculative['size']}, greedy, {count} repeating prompts): "
                      f"{speculative['ours']:,.0f} tok/s vs {speculative['theirs']:,.0f} without, ratio "
                      f"{speculative['ratio']:.2f}; same greedy tokens: {speculative['same_greedy_tokens']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows, "idle_engine_training_slowdown": slowdown,
                                   "speculative": speculative}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
