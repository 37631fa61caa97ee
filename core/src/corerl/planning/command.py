"""``corerl plan RECIPE_OR_MODEL [KEY=VALUE ...] [--gpus N --nodes M --gpu-memory GiB] [--json]``:
which backend and layout for a model on some hardware, with the memory each takes per GPU.

A recipe gives the model, sequence length, micro-batch, precision and whether a frozen reference
runs; a bare Hugging Face checkpoint folder is planned with the recipe defaults in bfloat16. Only
``config.json`` is read. Registered by the core's own plugin (``corerl_register_commands``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from corerl.planning.memory import GIB
from corerl.planning.request import DEFAULT_GPU_MEMORY_GIB, needs_reference, request_of

__all__ = ["DEFAULT_GPU_MEMORY_GIB", "add_arguments", "fragment", "load_target", "needs_reference", "render",
           "request_of", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RECIPE_OR_MODEL", help="a recipe YAML file, or a Hugging Face checkpoint "
                                                                  "folder (only its config.json is read)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted-key overrides, as for `corerl run`")
    parser.add_argument("--gpus", type=int, metavar="N", help="GPUs per node (default: cluster.gpus_per_node)")
    parser.add_argument("--nodes", type=int, metavar="M", help="nodes (default: cluster.num_nodes)")
    parser.add_argument("--gpu-memory", type=float, metavar="GiB",
                        help=f"memory of one GPU (default: cluster.gpu_memory_gib, else {DEFAULT_GPU_MEMORY_GIB:g})")
    parser.add_argument("--top", type=int, default=12, metavar="K", help="rows of the ranked table (default 12)")
    parser.add_argument("--json", action="store_true", help="print the whole plan as JSON")


def load_target(target: str, overrides: list[str], host: Any) -> Any:
    """The validated config of a recipe file, or of a bare model folder (recipe defaults, bf16)."""
    from corerl.config import config_from_mapping, load_config
    from corerl.config.overrides import apply_overrides, parse_override
    from corerl.errors import UsageError

    path = Path(target)
    if path.is_file():
        return load_config(path, overrides, host)
    if not (path / "config.json").exists():
        raise UsageError(f"{target} is neither a recipe file nor a Hugging Face checkpoint folder (no config.json)",
                         hint="give a recipe YAML, or a local checkpoint folder; nothing is downloaded")
    tree: dict[str, Any] = {"policy": {"model_name": str(path), "precision": "bfloat16"}}
    apply_overrides(tree, [parse_override(text, host) for text in overrides], {})
    return config_from_mapping(tree, host, source=str(path))


def run(args: argparse.Namespace) -> int:
    from corerl.config.presets import default_host
    from corerl.planning.planner import installed_generation_models, installed_models, make_plan

    host = default_host()
    config = load_target(args.target, list(args.overrides), host)
    request = request_of(config, args.gpus, args.nodes, args.gpu_memory, host=host)
    plan = make_plan(request, installed_models(host), installed_generation_models(host))
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2))
    else:
        render(plan, args.target, args.top)
    return 0 if plan.recommended is not None else 1


def render(plan: Any, target: str, top: int) -> None:
    """The ranked table, the recommendation and why, and the overrides that run it."""
    from rich.table import Table

    from corerl.reporting.console import make_console

    console, r = make_console(), plan.request
    console.print(f"[bold]{r.shape.describe()}[/] on {r.nodes} node(s) x {r.gpus_per_node} GPU(s) of "
                  f"{r.gpu_memory / GIB:g} GiB; {r.precision}, sequence {r.seq_length}, micro-batch {r.micro_batch}"
                  + (", with a frozen reference" if r.reference else "")
                  + (", asynchronous (generation on GPUs of its own)" if r.asynchronous else ""))
    table = Table(show_header=True, header_style="bold", title="per-GPU GiB of each layout, best first")
    for column in ("#", "layout", "generation", "offload", "params+grads+optimizer", "activations", "engine",
                   "reference", "peak", "fits"):
        table.add_column(column, justify="left" if column in ("layout", "generation", "offload") else "right")
    for rank, c in enumerate(plan.candidates[:top], start=1):
        t = c.training
        state = f"{t.parameters / GIB:.1f}+{t.gradients / GIB:.1f}+{t.optimizer / GIB:.1f}"
        table.add_row("*" if plan.recommended is c else str(rank), f"{c.layout.backend} {c.layout.name}",
                      c.generation_label, c.offload, state, f"{t.activations / GIB:.1f}",
                      f"{(c.generation or t.own_generation) / GIB:.1f}", f"{t.reference / GIB:.1f}",
                      f"{c.peak / GIB:.1f}", "yes" if c.fits else "[red]no[/]")
    console.print(table)
    console.print(f"decision tree: {plan.rule.why}")
    if plan.recommended is None:
        console.print(f"[red]no layout fits[/]: {plan.why}")
        return
    best = plan.recommended
    console.print(f"[bold]recommended[/] (*): {best.layout.backend} {best.layout.name} with {best.generation_label}: "
                  f"{plan.why}")
    overrides = " ".join(best.overrides())
    console.print(f"run it: corerl run {target if Path(target).is_file() else 'RECIPE'} {overrides}", soft_wrap=True)
    console.print("or lay this fragment over a recipe (defaults: or a preset file):")
    console.print(fragment(best.overrides()), highlight=False, soft_wrap=True)


def fragment(overrides: list[str]) -> str:
    """The YAML recipe fragment ``overrides`` set."""
    import yaml

    from corerl.config.overrides import apply_overrides, parse_override

    tree: dict[str, Any] = {}
    apply_overrides(tree, [parse_override(text) for text in overrides], {})
    return yaml.safe_dump(tree, sort_keys=False).rstrip()
