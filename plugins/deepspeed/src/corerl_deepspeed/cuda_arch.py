"""``TORCH_CUDA_ARCH_LIST`` in the form DeepSpeed's op builder can parse.

torch accepts architecture-specific entries such as ``9.0a`` (Hopper's wgmma) or ``10.0f``;
DeepSpeed 0.19's op builder reads every part of an entry as an integer and stops with
"invalid literal for int() with base 10: '0a'" when it JIT-builds an op (FusedAdam, CPUAdam).
The suffix only widens the instruction set, so the plain architecture (``9.0``) builds ops that
run on the same GPU.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"^(\d+)\.(\d+)[a-z]*(\+PTX)?$")


def parseable_arch_list(value: str) -> str:
    """``value`` with each entry's architecture suffix dropped (``9.0a`` -> ``9.0``), ``;``-separated,
    duplicates removed; an entry that is not ``MAJOR.MINOR[suffix][+PTX]`` is kept as it is."""
    out: list[str] = []
    for entry in re.split(r"[;\s]+", value.strip()):
        if not entry:
            continue
        match = _ENTRY.match(entry)
        plain = f"{match[1]}.{match[2]}{match[3] or ''}" if match else entry
        if plain not in out:
            out.append(plain)
    return ";".join(out)


def fix_arch_list_for_deepspeed() -> None:
    """Rewrite this process's ``TORCH_CUDA_ARCH_LIST`` for DeepSpeed's op builder, saying so once."""
    value = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not value:
        return
    fixed = parseable_arch_list(value)
    if fixed != value:
        log.warning("TORCH_CUDA_ARCH_LIST=%s rewritten to %s for DeepSpeed's op builder (it cannot parse "
                    "architecture suffixes)", value, fixed)
        os.environ["TORCH_CUDA_ARCH_LIST"] = fixed
