"""The ``corerl`` command: ``run``, ``validate``, ``plugins``, and what plugins add (``convert``).

Only the standard library is imported at module level so that ``corerl --help`` starts
fast; each command imports what it needs. Errors a user can cause print one line each
(exit 2 for config and usage errors, 1 for failures while running); ``CORERL_DEBUG=1``
shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

EPILOG = """\
environment:
  CORERL_DISABLE_PLUGINS=a,b   never import these plugins
  CORERL_LOAD_PLUGINS=a,b      import only these plugins (empty: none but the core's own)
  CORERL_TRACE_PLUGINS=1       print each hook call and its implementations
  CORERL_DEBUG=1               show tracebacks
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other usage error
        from corerl.errors import UsageError

        raise UsageError(f"{message} (see `{self.prog} --help`)")


BUILT_IN_COMMANDS = ("run", "validate", "plugins")


def build_parser(host: Any = None) -> argparse.ArgumentParser:
    from corerl import __version__

    parser = _Parser(
        prog="corerl",
        description="Reinforcement-learning post-training for language models, with pluggable engines.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"corerl {__version__}")
    from corerl.config import presets
    from corerl.config.dialects import DIALECTS

    preset_help = f"lay a preset over the recipe, under the overrides: {', '.join(presets.names(host))} (repeatable)"
    dialect_help = ("the recipe's dialect; unset: recognised from its sections (nemo-rl: a grpo:/sft:/dpo: section) or "
                    "its name (skyrl: a SkyRL launch script, *.sh, or an entry point's module such as "
                    "skyrl.train.entrypoints.main_base; --dialect skyrl with key=value overrides alone starts main_base)")
    strict_help = ("refuse, in one line each, the keys of a recipe in another dialect that corerl does not know "
                   "(unset: they are left out with one warning)")
    config_help = ("recipe YAML file, or a SkyRL launch script (run_*.sh: its shell defaults read from the "
                   "environment, the KEY=VALUEs its $@, applied last)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser("run", help="run a recipe (no CONFIG: the built-in demo)")
    run.add_argument("config", nargs="?", metavar="CONFIG", help=config_help)
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted-key overrides")
    run.add_argument("--preset", action="append", default=[], metavar="NAME", help=preset_help)
    run.add_argument("--dialect", choices=DIALECTS, help=dialect_help)
    run.add_argument("--strict", action="store_true", help=strict_help)
    run.add_argument("-v", "--verbose", action="store_true",
                     help="show other libraries' warnings and the engines' output on the terminal too (they are always "
                          "in the run directory's run.log)")

    validate = commands.add_parser("validate", help="check a recipe, and what it names on this machine, and show what "
                                                    "would be selected and why (no CONFIG: the built-in demo)")
    validate.add_argument("config", nargs="?", metavar="CONFIG", help=config_help)
    validate.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted-key overrides")
    validate.add_argument("--json", action="store_true", help="print a JSON report")
    validate.add_argument("--preset", action="append", default=[], metavar="NAME", help=preset_help)
    validate.add_argument("--dialect", choices=DIALECTS, help=dialect_help)
    validate.add_argument("--strict", action="store_true", help=strict_help)
    validate.add_argument("--explain", action="store_true",
                          help="list what each key of a recipe in another dialect does in corerl, or why it is inert")
    validate.add_argument("--recipe-only", action="store_true",
                          help="check the recipe alone, not the data files, models and run directory it names "
                               "(a recipe for another machine)")

    plugins = commands.add_parser("plugins", help="list installed plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="print JSON")

    for command in host.commands if host is not None else ():  # what plugins add (corerl_register_commands)
        command.add_arguments(commands.add_parser(command.id, help=command.description))
    return parser


def _split_run_args(config: str | None, overrides: list[str], dialect: str | None = None) -> tuple[str, list[str]]:
    """The recipe and the overrides of ``corerl run`` and ``corerl validate``: no CONFIG (``corerl
    run key=value ...``) means the built-in demo recipe with the overrides; with ``--dialect
    skyrl``, SkyRL's main entry point (``skyrl.train.entrypoints.main_base``) with them."""
    from corerl.recipes import DEMO_RECIPE

    bare = config is None or ("=" in config and not os.path.exists(config))
    if dialect == "skyrl" and bare:
        from corerl.config.dialects.skyrl.entry_points import DEFAULT_MODULE

        return DEFAULT_MODULE, [*([config] if config is not None else []), *overrides]
    if config is not None and "=" in config and not os.path.exists(config):
        return str(DEMO_RECIPE), [config, *overrides]
    return (str(DEMO_RECIPE) if config is None else config), overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``corerl`` console script; returns the exit status."""
    from corerl.errors import EXIT_FAILURE, CorerlError

    debug = os.environ.get("CORERL_DEBUG", "") not in ("", "0")
    args_list = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args_list
    try:
        host = _command_host(args_list)
        args = build_parser(host).parse_args(args_list)
        if args.command not in BUILT_IN_COMMANDS:
            return int(host.commands.get(args.command).load()(args))
        if args.command == "plugins":
            return _cmd_plugins(args)
        if args.command == "validate":
            return _cmd_validate(args)
        return _cmd_run(args)
    except CorerlError as exc:
        if debug:
            raise
        if json_mode and args_list[:1] == ["validate"]:
            _print_json({"valid": False, **_empty_selection(), "errors": _error_dicts(exc), "warnings": []})
        else:
            _print_errors(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print("corerl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`corerl plugins --json | head`): nothing left to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return 1
    except Exception as exc:
        if debug:
            raise
        from corerl.run.out_of_memory import out_of_memory_line

        if (line := out_of_memory_line(exc)) is not None:
            print(f"corerl: error: {line}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"corerl: internal error: {_internal_error_line(exc)} "
              "(this is a bug; rerun with CORERL_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return EXIT_FAILURE


def _internal_error_line(exc: BaseException) -> str:
    """``Type: first line of the message``, and where it was raised (in a Ray actor too) when the
    message says nothing (a bare ``assert``)."""
    import traceback

    from corerl.distributed.remote_errors import remote_origin
    from corerl.failures import first_line

    if str(exc).strip():
        return first_line(exc)
    origin = remote_origin(exc)
    if origin is None and exc.__traceback__ is not None:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        origin = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{type(exc).__name__} raised at {origin}" if origin else type(exc).__name__


def _error_dicts(exc: Exception) -> list[dict[str, Any]]:
    from corerl.errors import ConfigErrors

    errors = exc.errors if isinstance(exc, ConfigErrors) else [exc]
    return [e.as_dict() for e in errors]


def _print_errors(exc: Exception) -> None:
    from corerl.errors import ConfigErrors
    from corerl.reporting.quiet import last_log

    log = last_log()  # a run that started: what else it printed is in its log file
    for error in exc.errors if isinstance(exc, ConfigErrors) else [exc]:
        print(f"corerl: error: {error}" + (f" (the run's log: {log})" if log else ""), file=sys.stderr)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def _empty_selection() -> dict[str, None]:
    return {"training_backend": None, "generation_backend": None, "sequence_packer": None, "offload_policy": None,
            "task": None, "reward": None, "environment": None}


def _cmd_plugins(args: argparse.Namespace) -> int:
    from corerl.component_kinds import KINDS
    from corerl.plugin_manager import process_host

    rows = process_host().describe()
    if args.json:
        _print_json(rows)
        return 0
    from rich.table import Table

    from corerl.reporting.console import make_console

    table = Table(title="corerl plugins", show_lines=True)
    any_error = any(row["error"] or row["notice"] for row in rows)
    columns = ("name", "distribution", "version", "contract", "status", "registers", *(("error",) if any_error else ()))
    for column in columns:
        table.add_column(column, overflow="fold")
    labels = {kind.registry: kind.label for kind in KINDS}
    def shown(row: dict[str, Any], kind: str) -> str:
        """Each id, with its priority where it competes by priority, and its section where it owns one."""
        parts = []
        for item in (c for c in row["components"] if c["kind"] == kind):
            extra = [f"priority {item['priority']}"] if kind == "training_backends" else []
            extra += [item["config_section"]] if item["config_section"] else []
            parts.append(item["id"] + (f" ({', '.join(extra)})" if extra else ""))
        return ", ".join(parts)

    for row in rows:
        registers = "\n".join(f"{label}: {shown(row, key)}" for key, label in labels.items() if row[key])
        status_style = {"loaded": "green", "failed": "red", "disabled": "yellow"}[row["status"]]
        table.add_row(
            row["name"], row["distribution"] or "-", row["version"] or "-", _contract_cell(row),
            f"[{status_style}]{row['status']}[/]", registers or "-",
            *((row["error"] or (f"notice: {row['notice']}" if row["notice"] else ""),) if any_error else ()),
        )
    make_console().print(table)
    return 0


def _contract_cell(row: dict[str, Any]) -> str:
    """The plugin contract a plugin states (the core's own plugin offers this release's)."""
    from corerl.hookspecs import CONTRACT_VERSION
    from corerl.plugin_manager import CORE_PLUGIN

    if row["name"] == CORE_PLUGIN:
        return f"{CONTRACT_VERSION} (offered)"
    return row["contract"] or "none stated"


def _load_and_select(config_path: str, overrides: list[str], presets: list[str],
                     dialect: str | None = None, strict: bool = False) -> tuple[Any, Any, Any]:
    from corerl.config import load_config
    from corerl.config.selection import select
    from corerl.plugin_manager import process_host

    host = process_host()
    config = load_config(config_path, overrides, host, presets, dialect, strict)
    return host, config, select(config, host)


def _cmd_validate(args: argparse.Namespace) -> int:
    """``corerl validate``: the recipe checked as ``run`` checks it before it starts (what it names
    on this machine too, unless ``--recipe-only``), and what would be selected and why. A recipe
    whose inputs are missing here is reported with its selection, then its errors (exit 2)."""
    config_path, overrides = _split_run_args(args.config, args.overrides, args.dialect)
    host, config, selection = _load_and_select(config_path, overrides, args.preset, args.dialect, args.strict)
    from corerl.errors import EXIT_USAGE, ConfigError, ConfigErrors
    from corerl.planning.planner import fit_warning

    warning = fit_warning(config, selection.training_backend.id, host)
    if warning is not None:
        selection.warnings.append(warning)
    refused: ConfigError | ConfigErrors | None = None
    if not args.recipe_only:
        from corerl.run.inputs import check_run_inputs

        try:
            check_run_inputs(config, selection, host)
        except (ConfigError, ConfigErrors) as exc:
            refused = exc
    fates = [{"key": f.key, "fate": f.fate, "detail": f.detail} for f in config.fates]
    if args.json:
        _print_json({"valid": refused is None, **selection.as_dict(),
                     "errors": _error_dicts(refused) if refused is not None else [],
                     "warnings": config.warnings + selection.warnings,
                     "dialect": config.dialect, **({"keys": fates} if args.explain else {})})
        return 0 if refused is None else EXIT_USAGE
    _print_selection(config, selection, verdict="valid" if refused is None else
                     "the recipe is valid, what it names on this machine is not (below; --recipe-only checks the "
                     "recipe alone)")
    if args.explain:
        _print_fates(config)
    if refused is not None:
        _print_errors(refused)
        return EXIT_USAGE
    return 0


def _print_fates(config: Any) -> None:
    if config.dialect == "corerl":
        print("a corerl recipe: every key means what docs/reference/configuration.md says; nothing to explain")
        return
    acting = [f for f in config.fates if f.fate == "acts"]
    inert = [f for f in config.fates if f.fate == "inert"]
    print(f"\nacts ({len(acting)} keys): the {config.dialect} key -> the corerl key it sets")
    for fate in acting:
        print(f"  {fate.key} -> {fate.detail}")
    print(f"\ninert ({len(inert)} keys): accepted, no effect in corerl, and why")
    for fate in inert:
        print(f"  {fate.key}: {fate.detail}")
    unknown = [f for f in config.fates if f.fate == "unknown"]
    if unknown:
        print(f"\nunknown ({len(unknown)} keys): nothing in corerl maps them; left out (--strict refuses them)")
        for fate in unknown:
            print(f"  {fate.key} ({fate.detail})")


def _print_selection(config: Any, selection: Any, verdict: str) -> None:
    """The recipe's verdict (with its dialect where it has one), what was selected and why, and
    the warnings of the dialect and of selection."""
    from rich.table import Table

    from corerl.reporting.console import make_console

    console = make_console()
    dialect = f" ({config.dialect} dialect)" if config.dialect != "corerl" else ""
    console.print(f"[bold]{config.source}[/]: {verdict}{dialect}")
    table = Table(show_header=True, header_style="bold")
    table.add_column("component")
    table.add_column("selected")
    table.add_column("why", overflow="fold")
    critic = [("critic backend", selection.critic_backend)] if selection.critic_backend is not None else []
    for label, choice in (
        ("algorithm", selection.algorithm),
        ("training backend", selection.training_backend),
        *critic,
        ("generation backend", selection.generation_backend),
        ("sequence packer", selection.sequence_packer),
        ("offload policy", selection.offload_policy),
        ("task", selection.task),
        ("reward", selection.reward),
        *([("environment", selection.environment)] if selection.environment.id is not None else []),
        ("chat template", selection.chat_template),
    ):
        if not selection.samples and label in ("generation backend", "offload policy", "reward"):
            table.add_row(label, "unused", f"{selection.algorithm.id} samples nothing: no engine samples, nothing is scored")
            continue
        if label == "reward" and choice.id is None and selection.environment.id is not None:
            table.add_row(label, "off", f"the environment {selection.environment.id!r} scores the episodes "
                                        "(data.reward, when set, is the reward it is given)")
            continue
        table.add_row(label, choice.id or "off", choice.reason)
    console.print(table)
    for warning in [*config.warnings, *selection.warnings]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def _command_host(args_list: list[str]) -> Any:
    """The plugins that add commands, loaded only when the command line may name one of theirs
    (not for run, validate or plugins, which load them themselves); a first-party command whose
    plugin is not installed is a one-line usage error saying how to install it."""
    first = next((a for a in args_list if not a.startswith("-")), None)
    if first in BUILT_IN_COMMANDS or (first is None and "--version" in args_list):
        return None
    from corerl.errors import UsageError
    from corerl.known_plugins import FIRST_PARTY
    from corerl.plugin_manager import process_host

    host = process_host()
    owner = next((p for p in FIRST_PARTY if first in p.commands), None)
    if owner is not None and first not in host.commands:
        raise UsageError(f"corerl {first} is a command of the {owner.name} plugin, which is not loaded here",
                         hint=f"install it ({owner.install}); `corerl plugins` says why one does not load")
    return host


def _cmd_run(args: argparse.Namespace) -> int:
    from corerl import start_up
    from corerl.run.loop import run_recipe

    # few garbage collections until the first step (the run ends it there: corerl.run.loop.Run.run)
    with start_up.starting():
        config_path, overrides = _split_run_args(args.config, args.overrides, args.dialect)
        host, config, selection = _load_and_select(config_path, overrides, args.preset, args.dialect, args.strict)
        if config.core.eval.only:  # the model as it is, evaluated: no run directory, no training
            from corerl.evaluation.command import evaluate_model

            _print_selection(config, selection, verdict="evaluating (eval.only)")
            return evaluate_model(config, selection, host)
        _print_selection(config, selection, verdict="running")
        return run_recipe(config, selection, host, verbose=args.verbose)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
