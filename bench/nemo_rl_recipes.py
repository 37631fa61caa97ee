"""How many of NeMo RL's own LLM recipes `corerl validate --recipe-only` accepts (issue 17's acceptance).

Point it at a NeMo RL checkout's ``examples/configs`` folder: every YAML file there whose merged
tree is a GRPO, SFT, DPO, distillation, reward-model (``rm``) or evaluation recipe (PPO's are
counted apart) is validated in this process,
exactly as ``corerl validate --recipe-only FILE`` does (same loader, same selection; the models,
data files and folders a run would need are this machine's business, not the recipe's), and the table prints
each recipe's verdict and, for the refused ones, the one-line reason. The vision-language (VLM)
recipes (``vlm`` in their path) are counted with their algorithm and totalled apart too.

    .venv/bin/python bench/nemo_rl_recipes.py ~/src/RL/examples/configs

Nothing is downloaded: the recipes are read from the folder given. corerl itself is not a
dependency of NeMo RL's files; recipes naming a hub model or dataset are judged as written
(``--recipe-only`` checks the recipe; plain ``validate`` and ``run`` refuse a hub name that cannot be
loaded offline).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import yaml
from bench_output import results_path

#: the recipe kinds counted, by their top-level section (``eval``: NeMo RL's evaluation recipes)
ALGORITHMS = ("grpo", "sft", "dpo", "distillation", "rm", "eval")
#: what would lift a refusal, by the key it names (first match): the feature corerl does not have
FEATURES = (
    ("policy.model_name", "vision-language models outside the Qwen-VL families, audio and omni models"),
    ("generation.model_name", "vision-language models outside the Qwen-VL families, audio and omni models"),
    ("megatron_cfg.enabled", "vision-language models on the megatron backend"),
    ("freeze_vision", "vision-language models on the megatron backend"),
    ("megatron_cfg.freeze_config", "vision-language models on the megatron backend"),
    ("freeze_sound", "vision-language models on the megatron backend"),
    ("radio_force_cpe", "vision-language models on the megatron backend"),
    ("dataset_name", "audio and audio-visual datasets"),
    ("video", "audio and video inputs"),
    ("expert_parallel", "mixture-of-experts models (expert parallelism)"),
    ("expert_model_parallel", "mixture-of-experts models (expert parallelism)"),
    ("router_replay", "router replay (r2 with megatron's context parallelism; r3 with vLLM needs a GPU)"),
    ("moe_", "mixture-of-experts models"),
    ("fp8", "FP8 training (on a GPU: with packed rows, Transformer Engine's packed attention)"),
    ("megatron_cfg.context_parallel", "context parallelism on megatron (Transformer Engine's attention)"),
    ("context_parallel", "context parallelism with packing, tensor or expert parallelism (dtensor)"),
    ("generation.backend", "that generation engine (TensorRT-LLM, Dynamo)"),
    ("mtp_num_layers", "multi-token prediction"),
    ("draft", "speculative decoding with a draft model"),
    ("quant", "quantised training or generation"),
    ("is_mx", "quantised generation"),
    ("kv_cache_dtype", "an FP8 KV cache"),
    ("reward_weights", "GDPO with weights on the reward's parts"),
    ("adv_estimator", "other advantage estimators (OPD)"),
    ("use_cispo", "the CISPO loss"),
    ("invalid_tool_call", "NeMo Gym's tool-call penalties"),
    ("dp_replicate_size", "hybrid sharding (HSDP)"),
    ("env_name", "that environment (NeMo Gym; NeMo RL's mmpr-tiny VLM environment and its geo3k reward), or one "
                 "with distillation (it plays none)"),
    ("async.in_flight", "in-flight weight updates on vLLM (it takes them between calls: in_flight=wait)"),
    ("lora", "LoRA on the megatron backend (megatron-core has no LoRA layers)"),
    ("seq_logprob_error_threshold", "masking sequences by their train/generation logprob gap"),
    ("optimizer_cpu_offload", "megatron's optimizer offloaded to the CPU"),
    ("colocated.enabled", "asynchronous RL with colocated generation (an async-colocated schedule)"),
    ("async_ppo", "asynchronous PPO"),
    ("scheduler", "other learning-rate schedules (a LinearLR warm-up then constant is translated)"),
    ("data.train", "several training datasets at once"),
    ("num_prompts_per_dataloader", "several or custom data loaders"),
    ("custom_dataloader", "several or custom data loaders"),
    ("teacher", "a teacher setting that cannot act (e.g. a sequence shorter than the policy's)"),
    ("gold_loss", "cross-tokenizer off-policy distillation"),
    ("xtoken", "cross-tokenizer off-policy distillation"),
    ("megatron_cfg.sequence_parallel", "sequence parallelism with LoRA or packed rows on megatron (the local layer "
                                       "spec)"),
    ("max_num_steps", "training for a number of epochs (max_num_steps: -1)"),
    ("limit_mm_per_prompt", "audio and video inputs"),
    ("verifier_type", "multiple-choice answer verifiers"),
    ("file_format", "CSV datasets"),
    ("eval.metric", "cons@k (majority vote)"),
    ("bad_words", "banned words at generation (bad_words)"),
    ("chat_template_kwargs", "chat-template arguments (enable_thinking)"),
)
# the corpus's recipes of other algorithms, reported apart
OTHERS = ("ppo",)
# refusals that depend on the machine validating (no GPU here), not on the recipe
MACHINE_ONLY = ("needs a GPU", "ask for a GPU each but the Ray cluster has none")
#: features that only run on a GPU (Transformer Engine, FP8/FP4 kernels, engines without a CPU
#: build): corerl cannot build and verify them on a CPU machine, so they bound what can be accepted
GPU_ONLY_FEATURES = frozenset({"FP8 training (on a GPU: with packed rows, Transformer Engine's packed attention)",
                               "context parallelism on megatron (Transformer Engine's attention)",
                               "quantised generation",
                               "quantised training or generation", "an FP8 KV cache",
                               "that generation engine (TensorRT-LLM, Dynamo)",
                               "speculative decoding with a draft model"})


def algorithm_of(path: Path, seen: tuple[Path, ...] = ()) -> str | None:
    """The NeMo RL algorithm section a recipe (or what it inherits through ``defaults:``) holds."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    for name in ALGORITHMS:
        if name in data:
            return name
    for other in OTHERS:
        if other in data:
            return other
    parents = data.get("defaults")
    for parent in [parents] if isinstance(parents, str) else parents or []:
        target = (path.parent / str(parent)).resolve()
        if target not in seen and target.is_file():
            found = algorithm_of(target, (*seen, target))
            if found:
                return found
    return None


def validate(path: Path) -> tuple[bool, str, frozenset[str]]:
    """(accepted, the reason when refused, the keys of every refusal): the same steps as
    ``corerl validate --recipe-only``."""
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.errors import ConfigErrors, CorerlError
    from corerl.plugin_manager import PluginHost

    try:
        host = PluginHost()
        config = load_config(str(path), [], host, [], None)
        select(config, host)
    except ConfigErrors as exc:
        first = exc.errors[0].one_line() if exc.errors else exc.one_line()
        return False, first, frozenset(key for error in exc.errors  # a refused section lists its keys
                                       for key in getattr(error, "keys", [error.key or ""]))
    except CorerlError as exc:
        return False, exc.one_line(), frozenset()
    except Exception as exc:  # noqa: BLE001 - a crash on someone's recipe is a finding, reported as such
        return False, f"CRASH {type(exc).__name__}: {exc}", frozenset()
    return True, "", frozenset()


def needs_gpu_only_feature(refused_keys: frozenset[str]) -> bool:
    """Whether any refusal of a recipe names a feature that only runs on a GPU."""
    return any(feature_of(key) in GPU_ONLY_FEATURES for key in refused_keys)


def machine_only(reason: str) -> bool:
    """Whether a refusal says only that this machine has no GPU."""
    return any(m in reason for m in MACHINE_ONLY)


def feature_of(key: str) -> str | None:
    """What would lift a refusal at ``key``: the feature corerl does not have (None: not listed)."""
    return next((feature for pattern, feature in FEATURES if pattern in key), None)


def counts(rows: list[tuple[Path, bool, str]]) -> dict[str, int]:
    """Recipes, accepted, refused for want of a GPU here, and refused otherwise."""
    machine = sum(not ok and machine_only(reason) for _, ok, reason in rows)
    accepted = sum(ok for _, ok, _ in rows)
    return {"recipes": len(rows), "accepted": accepted, "refused_no_gpu_here": machine,
            "refused": len(rows) - accepted - machine}


def is_vlm(relative: Path) -> bool:
    """Whether a recipe is one of the corpus's vision-language (or audio-visual) ones."""
    return "vlm" in relative.parts or "vlm" in relative.name


def write_figures(target: Path, corpus: Path, counted: dict[str, list[tuple[Path, bool, str]]],
                  others: dict[str, list[tuple[Path, bool, str]]], reasons: collections.Counter[str],
                  gpu_bound: int) -> None:
    """The tables' figures as JSON at ``target``."""
    every = [row for a in ALGORITHMS for row in counted.get(a, [])]
    result = {"corpus": str(corpus), "algorithms": {a: counts(counted.get(a, [])) for a in ALGORITHMS},
              "all": counts(every), "vlm": counts([row for row in every if is_vlm(row[0])]),
              "refusals": [{"key": key, "recipes": count, "feature": feature_of(key)}
                           for key, count in reasons.most_common()],
              "others": {name: counts(rows) for name, rows in others.items()},
              "need_gpu_only_feature": gpu_bound}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", type=Path, help="a NeMo RL checkout's examples/configs folder")
    parser.add_argument("--show", type=int, default=40, help="refused recipes to list (default 40)")
    parser.add_argument("--json", type=Path, default=None,
                        help="where the figures go (default bench/results/nemo_rl_recipes.json, or the folder "
                             "CORERL_BENCH_RESULTS names)")
    args = parser.parse_args(argv)
    if not args.configs.is_dir():
        parser.error(f"{args.configs}: not a folder; give a NeMo RL checkout's examples/configs")

    counted: dict[str, list[tuple[Path, bool, str]]] = collections.defaultdict(list)
    gpu_bound: list[Path] = []  # counted recipes with a refusal that needs a GPU-only feature
    skipped = 0
    for path in sorted(args.configs.rglob("*.yaml")):
        relative = path.relative_to(args.configs)
        algorithm = algorithm_of(path)
        if algorithm is None:
            skipped += 1
            continue
        accepted, reason, refused_keys = validate(path)
        counted[algorithm].append((relative, accepted, reason))
        if algorithm in ALGORITHMS and needs_gpu_only_feature(refused_keys):
            gpu_bound.append(relative)

    from rich.table import Table

    from corerl.reporting.console import make_console

    table = Table(title=f"corerl validate on NeMo RL recipes in {args.configs}")
    for column in ("algorithm", "recipes", "accepted", "refused: no GPU here", "refused", "accepted %"):
        table.add_column(column, justify="left" if column == "algorithm" else "right")
    every = [row for algorithm in ALGORITHMS for row in counted.get(algorithm, [])]
    vlm = [row for row in every if is_vlm(row[0])]
    for label, rows in [*((a, counted.get(a, [])) for a in ALGORITHMS), ("all", every), ("of which vlm", vlm)]:
        c = counts(rows)
        share = f"{100 * c['accepted'] / c['recipes']:.0f}" if rows else "-"
        table.add_row(label, str(c["recipes"]), str(c["accepted"]), str(c["refused_no_gpu_here"]), str(c["refused"]),
                      share, style="bold" if label == "all" else None)
    console = make_console()
    console.print(table)
    others = {name: counted.pop(name, []) for name in OTHERS}
    console.print(f"{skipped} other YAML files (defaults without an algorithm section) not counted")
    refused = [(algorithm, *row) for algorithm in ALGORITHMS for row in counted.get(algorithm, []) if not row[1]]
    reasons = collections.Counter(reason.split(":")[0] for *_, reason in refused if not machine_only(reason))
    why = Table(title="refused (not for want of a GPU): the key of the first refusal, and what would lift it")
    for column in ("key", "recipes", "the feature corerl does not have"):
        why.add_column(column)
    for key, count in reasons.most_common():
        why.add_row(key, str(count), feature_of(key) or "-")
    console.print(why)
    ceiling = len(every) - len(gpu_bound)
    # a lower bound: the checks after the dialect's translation stop at their first refusal
    console.print(f"at least {len(gpu_bound)} of {len(every)} recipes need a feature that only runs on a GPU "
                  f"({', '.join(sorted(GPU_ONLY_FEATURES))}): without one, at most {ceiling} "
                  f"({100 * ceiling / max(len(every), 1):.0f}%) can be accepted on this machine", markup=False)
    other = Table(title="the corpus's other recipes")
    for column in ("algorithm", "recipes", "accepted", "refused: no GPU here"):
        other.add_column(column)
    for name, rows in others.items():
        c = counts(rows)
        other.add_row(name, str(c["recipes"]), str(c["accepted"]), str(c["refused_no_gpu_here"]))
    console.print(other)
    target = args.json or results_path("nemo_rl_recipes.json")
    write_figures(target, args.configs, counted, others, reasons, len(gpu_bound))
    console.print(f"wrote {target}")
    for algorithm, relative, _, reason in refused[: args.show]:
        console.print(f"refused [{algorithm}] {relative}: {reason}", markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

