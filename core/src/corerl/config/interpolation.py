"""``${...}`` references in recipes, resolved by OmegaConf (the library NeMo RL's recipes are
written for), with NeMo RL's arithmetic resolvers: ``${mul:a,b}``, ``${div:a,b}``, ``${add:a,b}``,
``${sub:a,b}``, ``${max:a,b}``, ``${min:a,b}``. ``${oc.env:NAME}`` reads the environment as
OmegaConf does, except that Hugging Face's own folders (``HF_HOME``, ``HF_DATASETS_CACHE``,
``HF_HUB_CACHE``), when unset, take the defaults the Hugging Face libraries themselves use
(``~/.cache/huggingface``, under ``XDG_CACHE_HOME`` when that is set): NeMo RL's recipes point
their data files there.

Resolution runs once the recipe, its ``defaults:``, the presets and the overrides are merged, so
``${policy.model_name}`` sees an overridden model name. A tree without ``${`` is returned as is
and OmegaConf is not imported.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from corerl.config.tree import Origins, origin_of
from corerl.errors import ConfigError

_RESOLVERS: dict[str, Any] = {
    "mul": lambda *xs: math.prod(xs),
    "add": lambda *xs: sum(xs),
    "sub": lambda a, b: a - b,
    "div": lambda a, b: a / b,
    "max": lambda *xs: max(xs),
    "min": lambda *xs: min(xs),
}


def huggingface_default(name: str) -> str | None:
    """The folder the Hugging Face libraries use for ``name`` when it is unset (None: not theirs)."""
    home = os.environ.get("HF_HOME") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                            / "huggingface")
    return {"HF_HOME": home, "HF_DATASETS_CACHE": str(Path(home) / "datasets"),
            "HF_HUB_CACHE": str(Path(home) / "hub")}.get(name)


_NO_DEFAULT = object()


def _environment(name: str, default: Any = _NO_DEFAULT) -> Any:
    """``${oc.env:NAME[,default]}``: the variable, else the default given, else Hugging Face's own
    default for its folders; otherwise a KeyError, as OmegaConf's own resolver raises."""
    if name in os.environ:
        return os.environ[name]
    if default is not _NO_DEFAULT:
        return default
    fallback = huggingface_default(name)
    if fallback is None:
        raise KeyError(f"Environment variable '{name}' not found")
    return fallback


def _mentions_reference(node: Any) -> bool:
    if isinstance(node, str):
        return "${" in node
    if isinstance(node, dict):
        return any(_mentions_reference(v) for v in node.values())
    if isinstance(node, list):
        return any(_mentions_reference(v) for v in node)
    return False


def _register() -> None:
    from omegaconf import OmegaConf

    for name, function in _RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_resolver(name, function, annotation_validation="off")
    OmegaConf.register_resolver("oc.env", _environment, replace=True, annotation_validation="off")


def resolve_references(raw: dict[str, Any], origins: Origins) -> dict[str, Any]:
    """``raw`` with every ``${...}`` replaced by its value; a reference that cannot be resolved is
    a one-line :class:`ConfigError` at its key, naming the file or override it came from."""
    if not _mentions_reference(raw):
        return raw
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    _register()
    try:
        tree = OmegaConf.create(raw)
        resolved = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or None
        message = str(exc).splitlines()[0]
        raise ConfigError(f"cannot resolve a ${{...}} reference: {message}", key=key,
                          source=origin_of(key, origins) if key else None,
                          hint="refer to an existing key (${section.key}) or a known resolver "
                               f"({', '.join(_RESOLVERS)})") from None
    assert isinstance(resolved, dict)
    return resolved
