"""``${...}`` references in recipes, resolved by OmegaConf (the library NeMo RL's recipes are
written for), with NeMo RL's arithmetic resolvers: ``${mul:a,b}``, ``${div:a,b}``, ``${add:a,b}``,
``${sub:a,b}``, ``${max:a,b}``, ``${min:a,b}``.

Resolution runs once the recipe, its ``defaults:``, the presets and the overrides are merged, so
``${policy.model_name}`` sees an overridden model name. A tree without ``${`` is returned as is
and OmegaConf is not imported.
"""

from __future__ import annotations

import math
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
