"""Loading plugins safely, and the one generic lookup over the registration hooks.

:class:`PluginHost` wraps a ``pluggy.PluginManager``: it loads the core's own plugin by its
module path and discovers the others through the ``corerl.plugins`` entry-point group, honours
``CORERL_DISABLE_PLUGINS``, ``CORERL_LOAD_PLUGINS`` and ``CORERL_TRACE_PLUGINS``, records a plugin
that fails to import (or to register) instead of failing, and collects one registry per kind of
component (:mod:`corerl.component_kinds`) on first use: ``host.registry(TrainingBackend)``, or
``host.training_backends`` by the kind's registry name.
"""

from __future__ import annotations

import functools
import importlib.metadata as importlib_metadata
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any, TextIO, TypeVar, overload

import attrs
import pluggy

from corerl import hookspecs
from corerl.component_kinds import ComponentKind, kinds_in
from corerl.import_paths import UnimportablePath, resolve
from corerl.registry import Registration, Registry

ENTRY_POINT_GROUP = "corerl.plugins"
CORE_PLUGIN = "corerl"
#: the core's own plugin, loaded by its module path as an entry point's plugin is
CORE_PLUGIN_PATH = "corerl.builtin_plugin"

R = TypeVar("R", bound=Registration)


@attrs.define
class PluginInfo:
    """One plugin as ``corerl plugins`` reports it."""

    name: str
    distribution: str | None = None
    version: str | None = None
    module: str | None = None
    status: str = "loaded"  # loaded | failed | disabled
    error: str | None = None
    #: the plugin contract version it states (``corerl_contract``), None when it states none
    contract: str | None = None
    #: what its author should change, while it still loads (a deprecation)
    notice: str | None = None


def _names(value: str) -> set[str]:
    return {part.strip() for part in value.split(",") if part.strip()}


def _describe_exception(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class PluginHost:
    """The plugin manager corerl runs with: discovery, safe loading and the registries.

    ``discover=False`` starts with the core's own plugin only (what tests want);
    ``env`` replaces ``os.environ`` when reading the ``CORERL_*`` variables.
    """

    def __init__(
        self,
        *,
        discover: bool = True,
        env: Mapping[str, str] | None = None,
        trace_stream: TextIO | None = None,
    ) -> None:
        self.env = os.environ if env is None else env
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._plugins: dict[str, PluginInfo] = {}
        self._registries: dict[str, Registry[Any]] | None = None
        self._kinds: dict[str, ComponentKind] = {}
        self.add_hookspecs(hookspecs)
        self._trace = trace_stream if trace_stream is not None else (
            sys.stderr if self.env.get("CORERL_TRACE_PLUGINS", "") not in ("", "0") else None
        )
        if self._trace is not None:
            self.pm.add_hookcall_monitoring(self._trace_before, self._trace_after)
        core = self.load_plugin(CORE_PLUGIN, CORE_PLUGIN_PATH, distribution="corerl", version=_version("corerl"))
        if core.status != "loaded":
            raise RuntimeError(f"the core's own plugin {CORE_PLUGIN_PATH} did not load: {core.error}")
        if discover:
            self.load_entry_points()

    def add_hookspecs(self, specs: object) -> tuple[ComponentKind, ...]:
        """Add the hook specs of ``specs`` (a module or class, as ``pluggy`` takes them); each
        registration hook among them brings its kind (:func:`corerl.component_kinds.kinds_in`),
        whose registry the host then collects too. Returns those kinds."""
        kinds = kinds_in(specs)
        taken = [kind.registry for kind in kinds if kind.registry in self._kinds]
        if taken:
            raise ValueError(f"registry {taken[0]!r} is already collected by {self._kinds[taken[0]].hook}")
        self.pm.add_hookspecs(specs)
        self._kinds.update((kind.registry, kind) for kind in kinds)
        self._registries = None  # recollect on next use
        return kinds

    @property
    def kinds(self) -> tuple[ComponentKind, ...]:
        """The kinds of component this host collects, in the order their hook specs are written."""
        return tuple(self._kinds.values())

    # -- loading -----------------------------------------------------------------------

    def _log(self, message: str) -> None:
        if self._trace is not None:
            print(f"corerl trace: {message}", file=self._trace)

    def _trace_before(self, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        plugins = ", ".join(impl.plugin_name for impl in hook_impls) or "no implementations"
        self._log(f"call {hook_name}({', '.join(kwargs)}) -> {plugins}")

    def _trace_after(self, outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        exc = outcome.exception
        self._log(f"done {hook_name}" + (f" (raised {_describe_exception(exc)})" if exc else ""))

    @property
    def plugins(self) -> dict[str, PluginInfo]:
        """Every plugin seen, by name, with its status after registration (failed ones included)."""
        self.registries()
        return self._plugins

    def blocked(self, name: str, distribution: str | None = None) -> bool:
        """Whether the environment keeps plugin ``name`` from being imported."""
        names = {name} | ({distribution} if distribution else set())
        if names & _names(self.env.get("CORERL_DISABLE_PLUGINS", "")):
            return True
        only = self.env.get("CORERL_LOAD_PLUGINS")
        return only is not None and not (names & _names(only))

    def load_entry_points(self) -> None:
        """Import and register every plugin in the ``corerl.plugins`` entry-point group."""
        seen: set[tuple[str, str]] = set()
        for ep in sorted(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = getattr(ep, "dist", None)
            dist_name = dist.name if dist is not None else None
            version = dist.version if dist is not None else None
            if (ep.name, ep.value) in seen:  # one distribution visible twice on sys.path
                continue
            seen.add((ep.name, ep.value))
            info = PluginInfo(ep.name, dist_name, version, module=ep.value)
            if ep.name in self._plugins:
                holder = self._plugins[ep.name]
                info.status, info.error = "failed", (
                    f"plugin name {ep.name!r} is already taken by {holder.distribution or holder.module}"
                )
                self._plugins[f"{ep.name} ({dist_name})"] = info
                continue
            self._plugins[ep.name] = info
            if self.blocked(ep.name, dist_name):
                info.status = "disabled"
                self._log(f"plugin {ep.name!r} disabled by CORERL_DISABLE_PLUGINS/CORERL_LOAD_PLUGINS; not imported")
                continue
            self._load(info, f"{ep.module}:{ep.attr}" if ep.attr else ep.module)

    def load_plugin(
        self, name: str, path: str, *, distribution: str | None = None, version: str | None = None
    ) -> PluginInfo:
        """Import the plugin at ``path`` (``"package.module"``, or ``"package.module:object"``) and
        register it as ``name``; a plugin that fails to import is recorded as failed, not raised.

        ``name`` already held: the plugin at the same ``path`` again is a deprecated no-op
        (:meth:`_held_again`), anything else a ``ValueError``."""
        if name in self._plugins:
            held = self._plugins[name]
            if held.module == path or self._is_held(name, path=path):
                return self._held_again(held, f"load_plugin({name!r}, {path!r})")
            raise ValueError(f"a plugin named {name!r} is already registered")
        info = PluginInfo(name, distribution, version, module=path)
        self._plugins[name] = info
        self._load(info, path)
        return info

    def _load(self, info: PluginInfo, path: str) -> None:
        self._log(f"import plugin {info.name!r} from {path} ({info.distribution} {info.version})")
        try:
            plugin = resolve(path, what="plugin", owner=f"plugin {info.name!r}")
        except Exception as exc:  # a broken plugin must not break anything that does not need it
            cause = exc.__cause__ if isinstance(exc, UnimportablePath) and exc.__cause__ is not None else exc
            info.status, info.error = "failed", _describe_exception(cause)
            self._log(f"plugin {info.name!r} failed to import: {info.error}")
            return
        self._register_module(plugin, info)

    def register(
        self, plugin: object, name: str, *, distribution: str | None = None, version: str | None = None
    ) -> PluginInfo:
        """Register an already imported plugin object (a module or any object with hookimpls).

        ``name`` already held: the very same object again is a deprecated no-op
        (:meth:`_held_again`), another object a ``ValueError``."""
        if name in self._plugins:
            if self._is_held(name, plugin=plugin):
                return self._held_again(self._plugins[name], f"register(..., name={name!r})")
            raise ValueError(f"a plugin named {name!r} is already registered")
        info = PluginInfo(name, distribution, version, module=getattr(plugin, "__name__", type(plugin).__name__))
        self._plugins[name] = info
        self._register_module(plugin, info)
        return info

    def _is_held(self, name: str, *, plugin: object = None, path: str | None = None) -> bool:
        """Whether the plugin this host holds as ``name`` is ``plugin``, or the object ``path``
        names (imported to compare; a path that does not import is not the one held)."""
        held = self.pm.get_plugin(name)
        if held is None:
            return False
        if path is not None:
            try:
                plugin = resolve(path, what="plugin", owner=f"plugin {name!r}")
            except Exception:
                return False
        return plugin is held

    def _held_again(self, held: PluginInfo, call: str) -> PluginInfo:
        """The plugin asked for is the one this host already holds under that name: nothing to do.

        Deprecated (contract 2.14; an error from contract 3.0): tests written to contract 2.9 or
        earlier, when ``corerl_host`` held the core's own plugin alone, register the installed
        first-party plugins (``dtensor``, ...) they train with, which ``corerl_host`` holds since
        contract 2.10."""
        warnings.warn(
            f"{call}: this host already holds that plugin as {held.name!r} (corerl_host holds the installed "
            f"first-party plugins since plugin contract 2.10); registering it again does nothing: remove the "
            f"call (deprecated: from plugin contract 3.0 it raises ValueError)",
            DeprecationWarning, stacklevel=3,
        )
        return held

    def _register_module(self, plugin: object, info: PluginInfo) -> None:
        if info.name != CORE_PLUGIN:
            info.contract = getattr(plugin, "corerl_contract", None)
            refusal = contract_refusal(info.name, info.contract)
            if refusal is not None:
                info.status, info.error = "failed", refusal
                return
            if info.contract is None:
                info.notice = (f"plugin {info.name!r} states no plugin contract version: add "
                               f"corerl_contract = \"{hookspecs.CONTRACT_VERSION}\" to {info.module} "
                               "(from contract 3.0 a plugin that states none is refused)")
        try:
            self.pm.register(plugin, name=info.name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            info.status, info.error = "failed", f"invalid hook implementation: {exc}"
            return
        self._registries = None  # recollect on next use

    # -- registries --------------------------------------------------------------------

    def _collect(self) -> dict[str, Registry[Any]]:
        registries: dict[str, Registry[Any]] = {name: Registry(kind.registration) for name, kind in self._kinds.items()}
        for name, kind in self._kinds.items():
            registry = registries[name]
            hook = getattr(self.pm.hook, kind.hook)
            for impl in hook.get_hookimpls():  # registration order: the core's own plugin first
                info = self._plugins[impl.plugin_name]
                if info.status != "loaded":
                    continue
                others = [p for p in self.pm.get_plugins() if p is not impl.plugin]
                pending: list[Registration] = []
                try:
                    self.pm.subset_hook_caller(kind.hook, remove_plugins=others)(register=pending.append)
                except Exception as exc:
                    info.status, info.error = "failed", f"{kind.hook} raised {_describe_exception(exc)}"
                    continue
                for item in pending:
                    try:
                        registry.add(item, impl.plugin_name)
                    except Exception as exc:
                        info.error = _describe_exception(exc) if info.error is None else info.error
                        info.status = "failed"
        return registries

    @overload
    def registry(self, kind: type[R]) -> Registry[R]: ...

    @overload
    def registry(self, kind: str) -> Registry[Any]: ...

    def registry(self, kind: type[Registration] | str) -> Registry[Any]:
        """The registry of one kind, collected on first use: by registration class
        (``host.registry(TrainingBackend)``) or by registry name (``host.registry("training_backends")``)."""
        name = kind if isinstance(kind, str) else kind.registry_name
        found = self._kinds.get(name)
        if found is None or not (isinstance(kind, str) or issubclass(kind, found.registration)):
            raise LookupError(f"no kind of registration {getattr(kind, '__name__', kind)!r} here; this host collects "
                              f"{', '.join(self._kinds)}")
        if self._registries is None:
            self._registries = self._collect()
        return self._registries[name]

    def __getattr__(self, name: str) -> Registry[Any]:
        """``host.training_backends`` and its siblings: the registry of the kind with that registry name."""
        kinds = self.__dict__.get("_kinds")
        if name.startswith("_") or kinds is None or name not in kinds:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.registry(name)

    def section_aliases(self) -> dict[str, str]:
        """Other spellings of the registered config sections: alias -> canonical key path."""
        return {alias: r.config_section for r in self.registrations() if r.config_section
                for alias in r.section_aliases}

    def registries(self) -> dict[str, Registry[Any]]:
        """All registries by registry name, collected once."""
        if self._registries is None:
            self._registries = self._collect()
        return dict(self._registries)

    def registrations(self) -> list[Registration]:
        """Every registration of every kind."""
        return [item for registry in self.registries().values() for item in registry]

    def checks(self) -> list[tuple[str, Any]]:
        """The checks across components each loaded plugin states (``corerl_checks`` on its plugin
        object, a sequence; the core's own first), as (plugin name, entry): the validation table
        (:mod:`corerl.config.validation` reads the entries and runs them)."""
        found: list[tuple[str, Any]] = []
        for name, info in self.plugins.items():
            plugin = self.pm.get_plugin(name)
            if info.status == "loaded" and plugin is not None:
                found += [(name, entry) for entry in getattr(plugin, "corerl_checks", None) or ()]
        return found

    def failed_plugins(self) -> list[PluginInfo]:
        self.registries()
        return [p for p in self._plugins.values() if p.status == "failed"]

    def describe(self) -> list[dict[str, Any]]:
        """The ``corerl plugins --json`` listing: per plugin, the ids it registers by kind, and
        ``components``: each registration's kind, id, priority and config section."""
        registries = self.registries()
        rows = []
        for info in self._plugins.values():
            row: dict[str, Any] = {"name": info.name, "distribution": info.distribution, "version": info.version}
            components = []
            for attr, registry in registries.items():
                row[attr] = registry.by_plugin(info.name)
                for item in registry:
                    if item.plugin == info.name:
                        components.append({"kind": attr, "id": item.id, "priority": item.priority,
                                           "config_section": item.config_section})
            row.update(components=components, status=info.status, error=info.error, contract=info.contract,
                       notice=info.notice)
            rows.append(row)
        return rows


@functools.lru_cache(maxsize=1)
def process_host() -> PluginHost:
    """The plugin host of this process (every installed plugin), built once. The ``corerl``
    command and the Python API build nothing else; code below them takes the host it is given."""
    return PluginHost()


def version_key(version: str) -> tuple[int, int]:
    """A contract version ``"2.10"`` as ``(2, 10)``: versions compare by number, not as text
    (``ValueError`` for anything but ``MAJOR.MINOR``)."""
    major, minor = (int(part) for part in str(version).split("."))
    return major, minor


def contract_refusal(plugin: str, stated: str | None) -> str | None:
    """Why a plugin stating contract version ``stated`` cannot load here, in one line (None: it can)."""
    if stated is None:
        return None
    offered = hookspecs.CONTRACT_VERSION
    try:
        major, minor = version_key(stated)
    except ValueError:
        return f"plugin {plugin!r} states plugin contract {stated!r}; expected MAJOR.MINOR such as {offered!r}"
    offered_major, offered_minor = version_key(offered)
    if major != offered_major:
        what = "an older" if major < offered_major else "a newer"
        return (f"plugin {plugin!r} implements plugin contract {stated}, and this corerl offers {offered} "
                f"({what} major version: see the contract changelog in docs/plugins.md, then update the plugin "
                f"or install a corerl that offers {major}.x)")
    if minor > offered_minor:
        return (f"plugin {plugin!r} implements plugin contract {stated}, newer than the {offered} this corerl "
                "offers: upgrade corerl")
    return None


def _version(distribution: str) -> str | None:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return None

