"""``corerl convert``: Hugging Face <-> Megatron checkpoints from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from corerl.sdk import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``corerl convert``."""
    parser.add_argument("direction", choices=["hf-to-megatron", "megatron-to-hf"], help="which way")
    parser.add_argument("source", metavar="SOURCE", help="checkpoint folder to read")
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="folder to write (hf-to-megatron without it: the conversion cache runs use)")
    parser.add_argument("--converter-type", metavar="ARCH",
                        help="architecture table, e.g. Qwen2ForCausalLM (default: from config.json)")
    parser.add_argument("--force", action="store_true", help="convert again / replace a non-empty TARGET")


def main(args: argparse.Namespace) -> int:
    """``corerl convert``: convert, then say where the result is."""
    written = run_convert(args.direction, args.source, args.target, converter_type=args.converter_type,
                          force=args.force)
    print(f"wrote {written}")
    return 0


def run_convert(direction: str, source: str, target: str | None, *, converter_type: str | None = None,
                force: bool = False) -> Path:
    """Convert ``source`` in ``direction`` and return the folder written.

    ``hf-to-megatron`` without ``target`` converts into the cache a run would use (see
    :mod:`corerl_megatron.conversion.store`), so the next run finds the conversion done."""
    from corerl_megatron.conversion.store import convert_into, ensure_converted, export_conversion

    origin = Path(source)
    if not origin.is_dir():
        raise ConfigError(f"no checkpoint folder at {source}", key="SOURCE", hint="pass the folder that holds config.json")
    if direction == "hf-to-megatron":
        if not (origin / "config.json").exists():
            raise ConfigError(f"{source} is not a Hugging Face checkpoint (no config.json)", key="SOURCE")
        if target is None:
            return ensure_converted(origin, force=force, converter_type=converter_type)
        destination = Path(target)
        if destination.exists() and any(destination.iterdir()) and not force:
            raise ConfigError(f"{target} exists and is not empty", key="TARGET", hint="pass --force to replace it")
        return convert_into(origin, destination, converter_type)
    if target is None:
        raise ConfigError("megatron-to-hf needs a TARGET folder", key="TARGET",
                          hint="corerl convert megatron-to-hf CONVERTED TARGET")
    export_conversion(origin, Path(target))
    return Path(target)
