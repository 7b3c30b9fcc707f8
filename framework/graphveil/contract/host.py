"""The plugin host: discovers plugins, validates them, and builds components by name.

Discovery is one entry-point scan of the group ``graphveil``. ``GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD=1``
skips third-party entry points (the built-ins still load); ``block`` skips named plugins except
the essential ones. Registration is all-or-nothing: a plugin's components are collected and
checked before anything is recorded, and a name clash names both plugins.

Hooks follow pluggy's rule: only functions marked ``@hookimpl`` count, component hooks are
called through a pluggy hook caller, and an implementation without a spec is refused naming
plugin and hook. Lifecycle hooks are called with :func:`read_only` views of what the caller
then writes, so an observing plugin cannot change a run's record.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from graphveil.contract import hookspecs
from graphveil.contract.accountant import Accountant
from graphveil.contract.clipper import Clipper
from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import ConfigError, PluginError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method
from graphveil.contract.model import Encoder, Model
from graphveil.contract.options import NoParams, describe, format_validation_error
from graphveil.contract.sampler import Sampler
from graphveil.contract.task import Task

ENTRY_POINT_GROUP = "graphveil"
#: Entry points into these packages ship with GraphVeil (built-in plugins, connectors): they
#: load even with autoload off.
BUILTIN_PREFIXES = ("graphveil.plugins.", "graphveil.connectors.")
#: Built-in plugins that cannot be blocked: the DP-SGD basics every run may need.
ESSENTIAL_PLUGINS = frozenset({"standard"})
AUTOLOAD_OFF_ENV = "GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD"

#: family name → (hook name, base class)
FAMILIES: dict[str, tuple[str, type]] = {
    "sampler": ("graphveil_samplers", Sampler),
    "clipper": ("graphveil_clippers", Clipper),
    "accountant": ("graphveil_accountants", Accountant),
    "encoder": ("graphveil_encoders", Encoder),
    "model": ("graphveil_models", Model),
    "task": ("graphveil_tasks", Task),
    "mechanism": ("graphveil_mechanisms", Mechanism),
    "method": ("graphveil_methods", Method),
    "data_source": ("graphveil_data_sources", DataSource),
}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class ComponentInfo:
    family: str
    name: str
    plugin: str
    factory: Any

    @property
    def description(self) -> str:
        return describe(self.factory)

    @property
    def params_model(self) -> type[BaseModel]:
        return getattr(self.factory, "Params", NoParams)


class PluginWarning(UserWarning):
    """A plugin does something that is probably not what its author meant (it still loads)."""


class PluginHost:
    """Registry of plugins and their components.

    :param autoload: scan the ``graphveil`` entry-point group.
    :param block: plugin names to skip (essential plugins cannot be blocked).
    """

    def __init__(self, *, autoload: bool = True, block: Iterable[str] = ()) -> None:
        self.pm = _manager()
        self._components: dict[tuple[str, str], ComponentInfo] = {}
        blocked = set(block)
        essential_blocked = blocked & ESSENTIAL_PLUGINS
        if essential_blocked:
            raise PluginError(f"plugin(s) {sorted(essential_blocked)} are essential and cannot be blocked")
        if autoload:
            self.load_entry_points(blocked)

    # ---------------------------------------------------------------------------- discovery
    def load_entry_points(self, blocked: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        third_party_off = os.environ.get(AUTOLOAD_OFF_ENV, "") not in ("", "0")
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in blocked or self.pm.has_plugin(ep.name):
                continue
            builtin = ep.value.startswith(BUILTIN_PREFIXES)
            if third_party_off and not builtin:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must say who it is
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
            self.register(plugin, ep.name)

    def register(self, plugin: Any, name: str) -> None:
        """Register ``plugin`` under ``name``; validates everything before changing any state.

        Only functions marked ``@hookimpl`` are hooks (pluggy's rule): an unmarked function
        named like a hook is ignored, with a :class:`PluginWarning`. The plugin is first
        registered on a scratch manager, which checks every implementation against its spec
        and rejects implementations with no spec; its component hooks are then called through
        that manager's hook caller, and the components checked for names, base classes and
        clashes. Only when all of that passes is the plugin registered on :attr:`pm`.

        :param plugin: a module, an object with hook methods, or a module's dotted name.
        :param name: the plugin's name (an entry point's name for discovered plugins).
        :raises PluginError: naming the plugin (and the hook, or the other plugin on a clash).
        """
        if self.pm.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered")
        if isinstance(plugin, str):
            try:
                plugin = importlib.import_module(plugin)
            except Exception as exc:  # a broken plugin must say who it is
                raise PluginError(f"plugin {name!r} ({plugin}) failed to import: {exc}") from exc
        if self.pm.is_registered(plugin):
            other = self.pm.get_name(plugin)
            raise PluginError(f"plugin {name!r} is already registered as plugin {other!r}")
        scratch = _manager()
        try:
            scratch.register(plugin, name)
        except pluggy.PluginValidationError as exc:  # names hook and signature, over several lines
            detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"plugin {name!r}: {detail}") from exc
        _check_specs(scratch, name)
        _warn_unmarked(scratch, plugin, name)
        new = self._collect(scratch, name)
        self.pm.register(plugin, name)
        self._components.update(new)

    def _collect(self, scratch: pluggy.PluginManager, plugin_name: str) -> dict[tuple[str, str], ComponentInfo]:
        """Call the component hooks of the one plugin on ``scratch`` and check what they return."""
        found: dict[tuple[str, str], ComponentInfo] = {}
        for family, (hook_name, base) in FAMILIES.items():
            caller = getattr(scratch.hook, hook_name)
            impls = caller.get_hookimpls()
            if not impls:
                continue
            if any(impl.wrapper or impl.hookwrapper for impl in impls):
                raise PluginError(
                    f"plugin {plugin_name!r}: {hook_name} is a component hook and cannot be a "
                    "wrapper; return a mapping of name → factory instead"
                )
            try:
                results = caller()
            except Exception as exc:
                raise PluginError(
                    f"plugin {plugin_name!r}: {hook_name}() raised {type(exc).__name__}: {exc}"
                ) from exc
            # pluggy drops None results, so a missing result is an implementation returning None.
            bad = next((r for r in results if not isinstance(r, Mapping)), None)
            if bad is not None or len(results) != len(impls):
                got = "None" if bad is None else type(bad).__name__
                raise PluginError(
                    f"plugin {plugin_name!r}: {hook_name}() must return a mapping of name → factory "
                    f"(got {got})"
                )
            for provided in results:
                for comp_name, factory in provided.items():
                    if not isinstance(comp_name, str) or not _NAME.match(comp_name):
                        raise PluginError(
                            f"plugin {plugin_name!r}: {family} name {comp_name!r} must be lowercase "
                            "letters, digits and underscores, starting with a letter"
                        )
                    if isinstance(factory, type) and not issubclass(factory, base):
                        raise PluginError(
                            f"plugin {plugin_name!r}: {family} {comp_name!r} must subclass {base.__name__}"
                        )
                    key = (family, comp_name)
                    if key in found:  # two implementations of the hook (``specname``) in one plugin
                        raise PluginError(f"plugin {plugin_name!r}: {family} {comp_name!r} is provided twice")
                    other = self._components.get(key)
                    if other is not None:
                        raise PluginError(
                            f"{family} {comp_name!r} is registered by both plugin {other.plugin!r} "
                            f"and plugin {plugin_name!r}"
                        )
                    found[key] = ComponentInfo(family, comp_name, plugin_name, factory)
        return found

    # ---------------------------------------------------------------------------- lookup
    def components(self, family: str | None = None) -> list[ComponentInfo]:
        infos = [c for c in self._components.values() if family in (None, c.family)]
        return sorted(infos, key=lambda c: (list(FAMILIES).index(c.family), c.name))

    def get(self, family: str, name: str) -> ComponentInfo:
        if family not in FAMILIES:
            raise ConfigError(f"unknown component family {family!r}")
        info = self._components.get((family, name))
        if info is None:
            known = ", ".join(c.name for c in self.components(family)) or "none"
            raise ConfigError(f"unknown {family} {name!r}; available: {known}")
        return info

    def create(self, family: str, name: str, params: Mapping[str, Any] | None = None,
               *, where: str = "") -> Any:
        """Validate ``params`` against the component's ``Params`` model and build it.

        :param where: prefix for error messages (e.g. ``"run.yaml: clipper"``).
        """
        return self.get(family, name).factory(self.validate(family, name, params, where=where))

    def validate(self, family: str, name: str, params: Mapping[str, Any] | None = None,
                 *, where: str = "") -> BaseModel:
        """``params`` validated against the component's ``Params`` model, without building it
        (:meth:`create`'s check, for callers that refuse bad options before running anything)."""
        info = self.get(family, name)
        try:
            return info.params_model.model_validate(dict(params or {}))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(where or family, exc, sep=".")) from exc

    @property
    def hook(self) -> Any:
        return self.pm.hook


def _manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _check_specs(scratch: pluggy.PluginManager, plugin_name: str) -> None:
    """Reject hook implementations without a spec: pluggy's ``check_pending``, naming the fix.

    A ``graphveil_*`` implementation must match a spec even if marked ``optionalhook``: the
    project owns that prefix and plugins cannot add specs, so it can only be a typo.
    """
    for hook_name, caller in vars(scratch.hook).items():
        if hook_name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook and not hook_name.startswith(f"{hookspecs.PROJECT}_"):
                continue
            close = difflib.get_close_matches(hook_name, _SPEC_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known hooks: {', '.join(_SPEC_NAMES)}"
            raise PluginError(
                f"plugin {plugin_name!r}: {impl.function.__qualname__} is marked @hookimpl for hook "
                f"{hook_name!r}, which has no specification{hint}"
            )


def _warn_unmarked(scratch: pluggy.PluginManager, plugin: Any, plugin_name: str) -> None:
    """Warn about functions named like a hook but not marked ``@hookimpl`` (they are not hooks)."""
    for attr in dir(plugin):
        if attr not in _SPEC_NAMES or scratch.parse_hookimpl_opts(plugin, attr) is not None:
            continue
        if getattr(scratch.hook, attr).get_hookimpls():  # implemented under another name (specname)
            continue
        if callable(inspect.getattr_static(plugin, attr, None)):
            warnings.warn(
                f"plugin {plugin_name!r}: {attr} is not marked @hookimpl, so it is not a hook and is "
                "ignored; decorate it with graphveil.contract.hookspecs.hookimpl",
                PluginWarning, stacklevel=3,
            )


_SPEC_NAMES = sorted(
    name for name in dir(hookspecs)
    if name.startswith(f"{hookspecs.PROJECT}_") and callable(getattr(hookspecs, name))
)


def read_only(value: Any) -> Any:
    """A deep read-only copy of ``value``: what lifecycle hooks receive.

    Mappings become :class:`types.MappingProxyType` views of fresh dicts, lists and tuples
    become tuples, sets frozensets; anything else is deep-copied. A plugin therefore cannot
    change what the caller writes afterwards (``metrics.jsonl``, ``rounds.jsonl``, the privacy
    report); trying raises ``TypeError``. ``json.dumps(view, default=dict)`` serialises a view.

    >>> view = read_only({"loss": 0.5, "sites": [{"site": "a", "epsilon": 1.0}]})
    >>> view["sites"][0]["epsilon"]
    1.0
    >>> view["loss"] = 0.0
    Traceback (most recent call last):
    ...
    TypeError: 'mappingproxy' object does not support item assignment
    >>> import json; json.dumps(view, default=dict)
    '{"loss": 0.5, "sites": [{"site": "a", "epsilon": 1.0}]}'
    """
    if isinstance(value, Mapping):
        return MappingProxyType({k: read_only(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(read_only(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(read_only(v) for v in value)
    return copy.deepcopy(value)


_default: PluginHost | None = None


def default_host() -> PluginHost:
    """The process-wide host with every installed plugin loaded."""
    global _default
    if _default is None:
        _default = PluginHost()
    return _default
