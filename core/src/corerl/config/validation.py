"""Validation as a table: the checks across the chosen components, each where its feature lives.

A check is a function ``check(config, chosen)`` (``chosen``: a :class:`Chosen`, what selection
picked so far and the plugin host) that refuses with :class:`~corerl.errors.ConfigError` (or
``SelectionError``, or several as ``ConfigErrors``) in one line naming the key, and returns
nothing when the recipe is fine. Each feature writes its checks in its own module (LoRA in
:mod:`corerl.lora.checks`, asynchronous GRPO in :mod:`corerl.asynchronous.settings`, ...); a plugin
states the ones it contributes as a sequence of :class:`Check` (or import paths, or functions)
named ``corerl_checks`` on its plugin object, as it states ``corerl_contract``; the core's own
are :data:`corerl.builtin_plugin.corerl_checks`. The plugin host gathers them
(:meth:`corerl.plugin_manager.PluginHost.checks`, the core's first), and
:func:`corerl.config.selection.select`, which ``corerl validate`` and ``corerl run`` both call,
runs them: the picker imports no feature module.

A check runs at one of two phases:

- ``"algorithm"``: once the algorithm is chosen (``chosen`` holds it alone, None when
  ``algorithm.name`` names none installed); each check's refusal is said together with the
  selection errors;
- ``"chosen"`` (the default): once every component is chosen and each registration's own
  support check passed; the first refusal stops validation, with the origin of its key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from corerl.errors import ConfigError, ConfigErrors, CorerlError, PluginError, SelectionError
from corerl.failures import first_line
from corerl.import_paths import resolve
from corerl.plugin_manager import CORE_PLUGIN

#: when a check runs (see the module's docstring)
PHASES = ("algorithm", "chosen")


@attrs.frozen
class Check:
    """One row of the table: the check (a function, or its import path ``pkg.module:fn``, imported
    when validation runs), the phase it runs at and what it checks (said where it fails)."""

    function: str | Callable[[Any, Chosen], None]
    phase: str = attrs.field(default="chosen", validator=attrs.validators.in_(PHASES))
    name: str = ""

    def load(self) -> Callable[[Any, Chosen], None]:
        """The function itself."""
        found = resolve(self.function, what="check", owner=f"check {self.label!r}")
        if not callable(found):
            raise TypeError(f"check {self.label!r}: {self.function!r} is not a function")
        return found

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        function = self.function
        return function if isinstance(function, str) else getattr(function, "__qualname__", repr(function))


@attrs.frozen
class Chosen:
    """What a check may read besides the config: the plugin host (what is installed, for hints
    that list the components that would do) and the components chosen so far, by name
    (``algorithm``, ``training_backend``, ``generation_backend``, ``sequence_packer``,
    ``offload_policy``, ``task``, ``reward``, ``environment``: each a choice with ``id``,
    ``reason`` and ``registration``)."""

    host: Any
    choices: Mapping[str, Any] = attrs.field(factory=dict)

    def registration(self, name: str) -> Any:
        """The registration chosen as ``name``, None when none is (the feature is off, or its
        selection failed)."""
        choice = self.choices.get(name)
        return None if choice is None else choice.registration

    @property
    def algorithm(self) -> Any:
        return self.registration("algorithm")

    @property
    def training_backend(self) -> Any:
        return self.registration("training_backend")

    @property
    def samples(self) -> bool:
        """Whether the algorithm samples (unknown counts as sampling), so the generation backend is used."""
        algorithm = self.algorithm
        return algorithm is None or bool(algorithm.generation)

    @property
    def generation_backend(self) -> Any:
        """The generation backend chosen, None where the algorithm samples nothing."""
        return self.registration("generation_backend") if self.samples else None


def as_check(entry: Any) -> Check:
    """A row of the table from what a plugin states: a :class:`Check`, an import path or a function."""
    if isinstance(entry, Check):
        return entry
    if isinstance(entry, str) or callable(entry):
        return Check(entry)
    raise TypeError(f"a check is a corerl.config.validation.Check, an import path or a function, not {entry!r}")


def table(host: Any) -> list[tuple[str, Check]]:
    """Every check the loaded plugins state, as (plugin, check), the core's own first."""
    return [(plugin, as_check(entry)) for plugin, entry in host.checks()]


def _run(plugin: str, check: Check, config: Any, chosen: Chosen) -> None:
    """One check; anything but a corerl error that a plugin's check raises is a
    :class:`PluginError` naming the plugin (the core's own: a bug, raised as it is)."""
    try:
        check.load()(config, chosen)
    except CorerlError:
        raise
    except Exception as exc:
        if plugin in ("", CORE_PLUGIN):
            raise
        raise PluginError(f"raised {first_line(exc)}", plugin=plugin, function=f"check {check.label!r}",
                          hint="a check refuses with corerl.sdk.ConfigError in one line naming the key") from exc


def run_checks(config: Any, chosen: Chosen, phase: str, checks: Iterable[tuple[str, Check]] | None = None) -> list[CorerlError]:
    """Run the checks of ``phase`` (``checks``: :func:`table` of ``chosen.host`` unless given), in order.

    ``"algorithm"``: every check runs; the refusals (``SelectionError``) are returned, to be said
    with the selection errors. ``"chosen"``: the first refusal is raised, as the caller's
    :func:`corerl.config.selection.origins_said` block turns it into ``ConfigErrors``."""
    rows = table(chosen.host) if checks is None else list(checks)
    refused: list[CorerlError] = []
    for plugin, check in rows:
        if check.phase != phase:
            continue
        if phase == "chosen":
            _run(plugin, check, config, chosen)
            continue
        try:
            _run(plugin, check, config, chosen)
        except ConfigErrors as exc:
            refused += exc.errors
        except (SelectionError, ConfigError) as exc:
            refused.append(exc)
    return refused
