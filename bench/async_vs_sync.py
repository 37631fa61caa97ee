"""Asynchronous GRPO against synchronous GRPO: the same recipe, model and number of optimizer
steps on the same cores, in one run.

    .venv/bin/python bench/async_vs_sync.py              # 30 steps each (about 3 minutes on 2 cores)
    .venv/bin/python bench/async_vs_sync.py --steps 3    # a quick look
    .venv/bin/python bench/async_vs_sync.py --backend vllm   # the same with vLLM generating
    .venv/bin/python bench/async_vs_sync.py --workload tools # multi-turn tool episodes (grpo_tools_demo.yaml)
    .venv/bin/python bench/async_vs_sync.py --workload slow_tools   # the same, each turn answered 0.3 s late

A Qwen2-style model (hidden 128, 2 layers by default, the built-in word-level tokenizer) built once;
the digit-echo prompts as rows; the reward is the share of completion words equal to the prompt's
digit. 8 prompts x 8 generations, 64 new tokens, 4 optimizer steps per step (generation and
training take similar time on 2 cores), float32, hf generation (``--backend vllm``: vLLM's engine,
in its own actor for the synchronous run and in the generation worker for the others; results
in bench/results/async_vs_sync-vllm.json). ``--workload tools``: instead, the multi-turn tool task
of examples/configs/grpo_tools_demo.yaml (16 prompts x 8 episodes of up to 3 turns, 20 SFT steps
first), run by ``corerl run`` with the same contenders' overrides (results in
bench/results/async_vs_sync-tools[-vllm].json). ``--workload slow_tools``: the same episodes with
each turn answered ``--tool-latency`` seconds late (0.3 by default), tool calls and final answers
alike (``env.tools.call_latency_s``, a sandbox's or web tool's round trip, and
``env.tools.check_latency_s``, a sandbox running the answer's tests: every episode waits, however
few call a tool, so the waits do not shrink as the policy learns; every episode's wait overlaps
the others', in the synchronous run as in the asynchronous ones), and the asynchronous contenders
generating ``max_staleness + 1`` prompt batches at once (``algorithm.async.max_inflight_prompts``:
the most the staleness bound lets start, so that one batch's tool waits overlap another's
generation); results in bench/results/async_vs_sync-slow_tools[-vllm].json. Contenders, each in a
fresh process, one after the other:

- sync: generation with the training model itself (vllm: its engine beside training), every core
  for each phase in turn (the fastest synchronous layout on one machine: no copy, no refit with hf);
- sync-dedicated: ``algorithm.async`` with ``max_staleness=0`` (a generation worker of its
  own with half the cores, training on the rest, still taking turns: the synchronous schedule
  on the asynchronous layout);
- async-1, async-2: ``max_staleness`` 1 and 2 (generation runs while training does).

The baseline is the faster of the two synchronous ones. The table's last line is the bound
splitting the cores allows on this machine: the baseline's s/step over the slower phase of
sync-dedicated (each phase on its share of the cores, nothing overlapping). The trainer's phase
is all a step does besides waiting for its batch (the logprob pass, the optimizer steps and the
hand-over of the weights: the ``trainer s`` column, a step's time less ``time/wait_for_rollouts``),
the generation phase a batch's rollout (``gen s``). With slow_tools a second bound is printed for
the asynchronous contenders, whose ``max_staleness + 1`` batches in flight overlap one batch's tool
waits with another's generation: the generation phase less its environment waits
(``time/environment``); and each contender's own bound, by Little's law: a batch's turns and waits
come one after another, so with k batches in flight one is done every generation time / k at best;
the contender's bound is the baseline over the slowest of the trainer's step, generation less its
waits, and generation / (max_staleness + 1). Beside each contender's bound, a second one adds to the
trainer's step the rollout's own work in the training process (``time/generation_driver_cpu`` of
sync-dedicated, where training waits while a batch generates: tokenising, decoding, the environment
pool, Ray's calls): in an asynchronous step that work runs beside training on the training
process's share of the cores. Steps after the first two are timed (they
warm up); s/step is the median, tokens/s the completion tokens of a step over it; the held-out
reward is taken after the same number of optimizer steps. Writes bench/results/async_vs_sync.json.
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
from contenders import model_shape, pick_contenders

RESULTS = results_path("async_vs_sync.json")
MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256, vocab_size=128)
PROMPTS, GENERATIONS, NEW_TOKENS, LR, UPDATES = 8, 8, 64, 1e-3, 4
CONTENDERS = {"sync": None, "sync-dedicated": 0, "async-1": 1, "async-2": 2}
TOOL_LATENCY = 0.3  # seconds a slow_tools turn takes to answer (env.tools.call_latency_s and check_latency_s)
TOOLS_BATCH = 16  # grpo_tools_demo.yaml's algorithm.batch_size


def prompt_rows(count: int = 160) -> list[dict[str, Any]]:
    return [{"prompt": f"w0 {i % 10} :", "answer": str(i % 10)} for i in range(count)]


def digit_share(completion: str, answer: str) -> float:
    words = completion.split()
    return sum(word == answer for word in words) / len(words) if words else 0.0


def figures(rows: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    """What a contender's child reports: its steps' metrics (``rows``) and the run's summary."""
    return {"step_times": [r["time/step"] for r in rows], "tokens": [r["generated_tokens"] for r in rows],
            "generation_s": [r["time/generation"] for r in rows], "training_s": [r["time/training"] for r in rows],
            # the trainer's whole phase: the step less its wait for the batch (generation, in a synchronous step)
            "trainer_s": [r["time/step"] - r.get("time/wait_for_rollouts", r["time/generation"]) for r in rows],
            "environment_s": [r.get("time/environment", 0.0) for r in rows],
            # the training process's CPU while the batch generated (at max_staleness 0: the rollout's own work)
            "driver_cpu_s": [r.get("time/generation_driver_cpu", 0.0) for r in rows],
            "staleness_max": max((r.get("async/staleness/max", 0.0) for r in rows), default=0.0),
            "held_out_before": summary["held_out_reward_before"], "held_out_after": summary["held_out_reward_after"]}


def run_child(model_dir: str, steps: int, staleness: int | None, new_tokens: int, lr: float,
              prompts: int, updates: int, backend: str = "hf") -> dict[str, Any]:
    import corerl

    generation: dict[str, Any] = {"backend": backend, "max_new_tokens": new_tokens, "temperature": 1.0}
    algorithm: dict[str, Any] = {"batch_size": prompts, "num_generations_per_prompt": GENERATIONS,
                                 "max_steps": steps, "seed": 7,
                                 "optimizer_batch_size": prompts * GENERATIONS // updates}
    if staleness is not None:
        generation["colocated"] = {"enabled": False, "resources": {"gpus_per_node": 1}}
        algorithm["async"] = {"enabled": True, "max_staleness": staleness}
    with tempfile.TemporaryDirectory() as out:
        result = corerl.GRPOTrainer({
            "policy": {"model_name": model_dir, "precision": "float32", "max_seq_length": 16 + new_tokens,
                       "train_micro_batch_size": prompts * GENERATIONS, "optimizer": {"lr": lr},
                       "generation": generation},
            "algorithm": algorithm,
            "data": {"held_out_size": 40},
            "run": {"output_dir": out, "name": "bench", "tensorboard": False},
        }, dataset=prompt_rows(), reward_fn=lambda completion, example: digit_share(completion, example["answer"])).train()
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((result.run_dir / "summary.json").read_text())
    return figures(rows, summary)


def run_tools_child(steps: int, staleness: int | None, backend: str, latency: float = 0.0) -> dict[str, Any]:
    """The multi-turn tool demo under ``corerl run`` with this contender's overrides; ``latency``:
    each turn answered that many seconds late, and the asynchronous contenders generating
    every batch their staleness bound lets start."""
    recipe = Path(__file__).resolve().parent.parent / "examples" / "configs" / "grpo_tools_demo.yaml"
    overrides = [f"algorithm.max_steps={steps}", "sft.max_steps=20", f"policy.generation.backend={backend}",
                 "run.tensorboard=false", "checkpointing.enabled=false"]
    if latency:
        overrides += [f"env.tools.call_latency_s={latency}", f"env.tools.check_latency_s={latency}"]
    if staleness is not None:
        overrides += ["algorithm.async.enabled=true", f"algorithm.async.max_staleness={staleness}",
                      "policy.generation.colocated.enabled=false",
                      "policy.generation.colocated.resources.gpus_per_node=1"]
        if latency:
            overrides.append(f"algorithm.async.max_inflight_prompts={TOOLS_BATCH * (staleness + 1)}")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([str(Path(sys.executable).parent / "corerl"), "run", str(recipe), f"run.output_dir={out}",
                        "run.name=bench", *overrides], check=True, stdout=subprocess.DEVNULL)
        run_dir = Path(out) / "bench"
        rows = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["phase"] == "grpo"]
        summary = json.loads((run_dir / "summary.json").read_text())
    return figures(rows, summary)


def summarise(name: str, result: dict[str, Any], wall: float) -> dict[str, Any]:
    timed = slice(2, None) if len(result["step_times"]) > 3 else slice(None)
    step = statistics.median(result["step_times"][timed])
    tokens = statistics.median(t / s for t, s in zip(result["tokens"][timed], result["step_times"][timed], strict=True))
    return {"contender": name, "max_staleness": CONTENDERS[name], "median_step_s": step, "tokens_per_s": tokens,
            "generation_median_s": statistics.median(result["generation_s"][timed]),
            "training_median_s": statistics.median(result["training_s"][timed]),
            "trainer_median_s": statistics.median(result["trainer_s"][timed]),
            "environment_median_s": statistics.median(result["environment_s"][timed]),
            "generation_driver_cpu_median_s": statistics.median(result["driver_cpu_s"][timed]),
            "staleness_seen_max": result["staleness_max"], "held_out_before": result["held_out_before"],
            "held_out_after": result["held_out_after"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=MODEL["hidden_size"])
    parser.add_argument("--layers", type=int, default=MODEL["num_layers"])
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--updates", type=int, default=UPDATES, help="optimizer steps per step (mini-batches)")
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf", help="the generation backend of every contender")
    parser.add_argument("--workload", choices=["digits", "tools", "slow_tools"], default="digits",
                        help="digits: single-turn digit echo (default); tools: the multi-turn tool demo; "
                             "slow_tools: the same with each turn answered --tool-latency seconds late")
    parser.add_argument("--tool-latency", type=float, default=TOOL_LATENCY,
                        help="slow_tools: seconds a turn's tool calls and a final answer's check take "
                             "(env.tools.call_latency_s, env.tools.check_latency_s)")
    parser.add_argument("--contenders", help=f"comma-separated subset of {', '.join(CONTENDERS)} with a sync one; "
                                             "default: all")
    parser.add_argument("--contender", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tools = args.workload in ("tools", "slow_tools")
    latency = args.tool_latency if args.workload == "slow_tools" else 0.0
    if args.contender and tools:
        Path(args.out).write_text(json.dumps(run_tools_child(args.steps, CONTENDERS[args.contender], args.backend,
                                                             latency)))
        return
    if args.contender:
        Path(args.out).write_text(json.dumps(run_child(args.model, args.steps, CONTENDERS[args.contender],
                                                           args.new_tokens, args.lr, args.prompts, args.updates,
                                                           args.backend)))
        return

    names = pick_contenders(args.contenders, list(CONTENDERS), list(CONTENDERS), parser)
    if not any(name.startswith("sync") for name in names):
        parser.error("--contenders: name sync or sync-dedicated (the baseline every speed-up is taken against)")
    from corerl.models.tiny import build_tiny_model

    shape = model_shape(MODEL, args.hidden, args.layers)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = str(build_tiny_model(Path(tmp) / "model", **shape))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        for name in names:
            out = Path(tmp) / f"{name}.json"
            print(f"running {name} ({args.steps} steps) ...", flush=True)
            start = time.perf_counter()
            subprocess.run([sys.executable, __file__, "--contender", name, "--model", model, "--out", str(out),
                            "--steps", str(args.steps), "--new-tokens", str(args.new_tokens), "--lr", str(args.lr),
                            "--prompts", str(args.prompts), "--updates", str(args.updates), "--backend", args.backend,
                            "--workload", args.workload, "--tool-latency", str(args.tool_latency)],
                           check=True, stdout=subprocess.DEVNULL, env=env)
            rows.append(summarise(name, json.loads(out.read_text()), time.perf_counter() - start))

    baseline = min((r for r in rows if r["contender"].startswith("sync")), key=lambda r: r["median_step_s"])
    for r in rows:
        r["speedup_vs_sync"] = baseline["median_step_s"] / r["median_step_s"]
        r["held_out_vs_sync_points"] = 100 * (r["held_out_after"] - baseline["held_out_after"])
    cores = os.cpu_count()
    if tools:
        slow = (f", every turn answered {latency:g} s late, async: max_staleness + 1 batches in flight" if latency else "")
        print(f"\nexamples/configs/grpo_tools_demo.yaml (16 prompts x 8 episodes, up to 3 turns{slow}), {args.steps} "
              f"GRPO steps, {cores} cores, {args.backend} generation; baseline: {baseline['contender']}")
    else:
        print(f"\n{args.prompts} prompts x {GENERATIONS} generations, {args.new_tokens} new tokens, {args.steps} "
              f"optimizer steps, {cores} cores, float32, hidden {args.hidden} x {args.layers} layers, {args.backend} "
              f"generation; baseline: {baseline['contender']}")
    print(f"{'contender':<16}{'s/step':>8}{'tokens/s':>10}{'gen s':>8}{'env s':>7}{'train s':>9}{'trainer s':>11}"
          f"{'vs sync':>9}{'held-out after':>16}{'vs sync':>10}{'max staleness':>15}")
    for r in rows:
        print(f"{r['contender']:<16}{r['median_step_s']:>8.3f}{r['tokens_per_s']:>10,.0f}{r['generation_median_s']:>8.3f}"
              f"{r['environment_median_s']:>7.3f}{r['training_median_s']:>9.3f}{r['trainer_median_s']:>11.3f}"
              f"{r['speedup_vs_sync']:>8.2f}x{r['held_out_after']:>16.3f}"
              f"{r['held_out_vs_sync_points']:>+9.1f}p{r['staleness_seen_max']:>15.0f}")
    dedicated = next((r for r in rows if r["contender"] == "sync-dedicated"), None)
    bound = overlapped = None  # need sync-dedicated's phase times
    bounds: dict[str, float] = {}
    rollout_bounds: dict[str, float] = {}
    if dedicated is not None:
        trainer, generation = dedicated["trainer_median_s"], dedicated["generation_median_s"]
        bound = baseline["median_step_s"] / max(generation, trainer)
        print(f"bound on this machine: {bound:.2f}x (sync s/step over the slower phase of sync-dedicated, each on "
              f"half the cores: generation {generation:.3f} s, the trainer's step {trainer:.3f} s)")
        if latency:  # every asynchronous contender has max_staleness + 1 batches in flight: their waits overlap
            generating = generation - dedicated["environment_median_s"]
            overlapped = baseline["median_step_s"] / max(generating, trainer)
            print(f"with batches overlapping their tool waits: at most {overlapped:.2f}x (generation less its tool "
                  f"waits {generating:.3f} s); with k batches in flight a batch is done every generation s / k "
                  "at best (a batch's turns and waits come one after another), so each contender's own bound is "
                  "the baseline over the slowest of the trainer's step, generation less its waits, and "
                  "generation / (max_staleness + 1)")
        # the rollout's own work in the training process (sync-dedicated: training waits meanwhile); beside
        # training in an asynchronous step it takes that process's core from training
        rollout_cpu = dedicated["generation_driver_cpu_median_s"]
        for r in rows:
            if r["max_staleness"]:
                in_flight = r["max_staleness"] + 1 if latency else 1
                waits = dedicated["environment_median_s"] if latency else 0.0
                own = baseline["median_step_s"] / max(trainer, generation - waits, generation / in_flight)
                with_rollout = baseline["median_step_s"] / max(trainer + rollout_cpu, generation - waits,
                                                               generation / in_flight)
                bounds[r["contender"]] = own
                rollout_bounds[r["contender"]] = with_rollout
                print(f"{r['contender']}: {r['speedup_vs_sync'] / own:.0%} of its bound ({own:.2f}x, "
                      f"{in_flight} batch(es) in flight); {r['speedup_vs_sync'] / with_rollout:.0%} of "
                      f"{with_rollout:.2f}x, the bound with the rollout's own work in the training process "
                      f"({rollout_cpu:.3f} CPU s a batch in sync-dedicated) added to the trainer's step")
    suffix = (f"-{args.workload}" if tools else "") + ("" if args.backend == "hf" else f"-{args.backend}")
    results = RESULTS.with_name(f"async_vs_sync{suffix}.json")
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps({
        "setup": {"model": "builtin:tiny-qwen2 (grpo_tools_demo.yaml)" if tools else shape,
                  "tool_latency_s": latency, "prompts": args.prompts, "generations": GENERATIONS, "new_tokens": args.new_tokens, "optimizer_steps_per_step": args.updates,
                  "steps": args.steps, "cores": cores, "precision": "float32", "lr": args.lr, "generation": args.backend,
                  "workload": args.workload},
        "baseline": baseline["contender"], "rows": rows, "bound_on_this_machine": bound,
        "bound_overlapping_tool_waits": overlapped,
        "bound_of_each": bounds,
        "bound_of_each_with_rollout_cpu": rollout_bounds,
        "share_of_bound": {r["contender"]: r["speedup_vs_sync"] / bounds[r["contender"]] for r in rows
                           if r["contender"] in bounds},
    }, indent=2) + "\n")
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
