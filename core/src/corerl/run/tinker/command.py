"""``corerl serve [RECIPE] [KEY=VALUE ...] [--base-model NAME]``: a training service speaking the
Tinker API, for the official ``tinker`` SDK (issue 76; docs/serve.md).

The base model is the recipe's ``policy.model_name`` (and its ``policy.precision``), or
``--base-model``; each training client is a LoRA adapter on it. With a recipe, the recipe is
selected as ``corerl run`` selects it and the selected training backend builds the base model
(:mod:`corerl.run.tinker.selection`; a backend that cannot is refused in one line, exit 2); with
``--base-model`` alone, :mod:`corerl.run.tinker.peft_engine` loads it itself. Sampling is the
recipe's generation backend's where it takes an adapter per request (vllm), else in this process.
Served with FastAPI and uvicorn on 127.0.0.1 unless ``--host`` says otherwise; every
request needs one of the API keys held by the environment variable ``--api-key-env`` names.
Served by :func:`corerl.environments.http_serving.serve`, the one HTTP stack; registered by the
core's own plugin (``corerl_register_commands``), imported only when run.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from typing import Any

DEFAULT_KEY_ENV = "CORERL_SERVE_API_KEY"
#: the prefixes the SDK accepts in a key (it refuses to send any other)
KEY_PREFIXES = ("tml-", "eyJ")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from corerl.run.tinker.service import Limits

    limits = Limits()
    parser.add_argument("config", metavar="RECIPE", nargs="?",
                        help="a corerl recipe: its policy.model_name is the base model (unset: --base-model)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted-key overrides, as for `corerl run`")
    parser.add_argument("--base-model", metavar="NAME", default=None,
                        help="the base model (a Hugging Face folder, a packaged or built-in model name); "
                             "overrides the recipe's policy.model_name")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for others)")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (default 8000)")
    parser.add_argument("--api-key-env", metavar="VAR", default=DEFAULT_KEY_ENV,
                        help=f"the environment variable holding the API key, or several separated by commas, one per "
                             f"client that must not reach another's weights (default {DEFAULT_KEY_ENV}; keys start "
                             "with tml-, as the SDK requires)")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="where saved states and sampler weights go, kept across restarts (default: a temporary "
                             "folder, removed at exit)")
    parser.add_argument("--max-adapters", type=int, default=16, metavar="N",
                        help="training adapters held at once, all clients together (default 16)")
    parser.add_argument("--max-lora-rank", type=int, default=None, metavar="R",
                        help="the largest adapter rank a client may ask for where the recipe's generation backend "
                             "samples the adapters (its engine is sized for it; default 32); in-process sampling "
                             "takes any rank the model can")
    parser.add_argument("--precision", choices=("float32", "bfloat16", "float16"), default=None,
                        help="the base model's weights and compute (default: the recipe's policy.precision, else "
                             "float32)")
    parser.add_argument("--max-body-mb", type=float, default=limits.max_body_bytes / 2**20, metavar="MB",
                        help=f"the largest request body taken (default {limits.max_body_bytes // 2**20})")
    parser.add_argument("--max-sample-tokens", type=int, default=limits.max_sample_tokens, metavar="N",
                        help=f"a sample's max_tokens at most, and when left out (default {limits.max_sample_tokens})")
    parser.add_argument("--session-timeout", type=float, default=limits.session_timeout, metavar="SECONDS",
                        help="a session that sends nothing (not even its heartbeat) this long ends and its adapters "
                             f"are freed (default {limits.session_timeout:.0f})")


def api_keys(variable: str, environ: Any = None) -> list[str]:
    """The keys the variable holds (comma-separated); one line when there are none or one the SDK
    would never send."""
    from corerl.errors import UsageError

    value = (os.environ if environ is None else environ).get(variable, "")
    keys = [k.strip() for k in value.split(",") if k.strip()]
    if not keys:
        raise UsageError(f"corerl serve needs an API key and ${variable} is unset or empty",
                         hint=f"export {variable}=tml-<a secret of your own>, and give clients the same key as "
                              "TINKER_API_KEY (or name another variable with --api-key-env)")
    for key in keys:
        if not key.startswith(KEY_PREFIXES):
            raise UsageError(f"${variable} holds a key that does not start with tml-; the tinker SDK refuses to send "
                             "any other", hint=f"use keys like tml-<a secret of your own> in ${variable}")
    return keys


def base_model_of(args: argparse.Namespace) -> tuple[str, str]:
    """(base model name, precision) from --base-model / --precision and the recipe."""
    from corerl.errors import UsageError

    if args.config is None:
        if args.overrides:
            raise UsageError("KEY=VALUE overrides apply to a recipe, and none was given",
                             hint="give the recipe first: corerl serve RECIPE KEY=VALUE ...")
        if args.base_model is None:
            raise UsageError("corerl serve needs a base model: give a RECIPE (its policy.model_name) or --base-model",
                             hint="e.g. corerl serve --base-model builtin:tiny-qwen2")
        return args.base_model, args.precision or "float32"
    from corerl.config import load_config
    from corerl.plugin_manager import process_host

    config = load_config(args.config, list(args.overrides), process_host())
    policy = config.core.policy
    return args.base_model or policy.model_name, args.precision or policy.precision


def run(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from corerl.environments.http_serving import require_server_stack, serve
    from corerl.errors import UsageError

    require_server_stack("corerl serve")
    try:
        from tinker.proto import tinker_public_pb2  # noqa: F401
    except ImportError:
        raise UsageError("corerl serve reads the tinker SDK's wire types, and tinker is not installed",
                         hint="pip install tinker==0.38.0 (or corerl's serve extra)") from None
    keys = api_keys(args.api_key_env)
    for name, value, least in (("--port", args.port, 0), ("--max-adapters", args.max_adapters, 1),
                               ("--max-body-mb", args.max_body_mb, 0.001),
                               ("--max-sample-tokens", args.max_sample_tokens, 1),
                               ("--session-timeout", args.session_timeout, 1),
                               ("--max-lora-rank", 1 if args.max_lora_rank is None else args.max_lora_rank, 1)):
        if value < least:
            raise UsageError(f"{name} must be at least {least}, not {value}")
    if args.config is None:
        base_model_of(args)  # the usage errors of a missing base model, or overrides without a recipe
    from corerl.run.tinker.server import build_app
    from corerl.run.tinker.service import Limits, Service

    limits = Limits(max_body_bytes=int(args.max_body_mb * 2**20), max_sample_tokens=args.max_sample_tokens,
                    session_timeout=args.session_timeout)
    with tempfile.TemporaryDirectory(prefix="corerl-serve-") as scratch:
        state_dir = Path(args.state_dir) if args.state_dir else Path(scratch) / "state"
        state_dir.mkdir(parents=True, exist_ok=True)
        opened = open_engine(args, Path(scratch) / "model")
        app = build_app(Service(opened.engine, state_dir, limits), keys)
        where = f"http://{args.host}:{args.port}"
        for line in opened.lines:
            print(f"corerl serve: {line}", flush=True)
        print(f"corerl serve: the Tinker API on {where}, training LoRA adapters on {opened.base_model} "
              f"({opened.precision}, at most {args.max_adapters}); saved weights in {state_dir}", flush=True)
        if not _loopback(args.host):
            print(f"corerl serve: listening on {args.host}, reachable from other machines over plain HTTP; the API "
                  "key is all that guards it", flush=True)
        try:
            serve(app, host=args.host, port=args.port)
        finally:
            close = getattr(opened.engine, "close", None)
            if callable(close):
                close()
    return 0


def open_engine(args: argparse.Namespace, work_dir: Any) -> Any:
    """The adapter engine the arguments ask for (:class:`corerl.run.tinker.selection.Opened`): the
    recipe's selected training backend's (a recipe given), else a :class:`PeftEngine` on
    ``--base-model``."""
    from corerl.run.tinker.selection import Opened
    from corerl.run.tinker.selection import open_engine as from_recipe

    if args.config is not None:
        from corerl.run.tinker.selection import DEFAULT_MAX_RANK

        return from_recipe(args.config, list(args.overrides), base_model=args.base_model, precision=args.precision,
                           max_adapters=args.max_adapters, work_dir=work_dir,
                           max_rank=getattr(args, "max_lora_rank", None) or DEFAULT_MAX_RANK)
    from corerl.run.tinker.peft_engine import PeftEngine

    base_model, precision = base_model_of(args)
    engine = PeftEngine(base_model, precision=precision, max_adapters=args.max_adapters, work_dir=work_dir)
    return Opened(engine, base_model, precision)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
