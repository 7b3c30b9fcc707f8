"""The plugin host: discovers plugins, validates them, and builds components by name.

Discovery is one entry-point scan of the group ``graphveil``. ``GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD=1``
skips third-party entry points (the built-ins still load); ``block`` skips named plugins except
the essential ones. Registration is all-or-nothing: a plugin's components are collected and
checked before anything is recorded, and a name clash names both plugins.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pluggy
from pydantic import BaseModel, ValidationError

from graphveil import hookspecs
from graphveil.components import Accountant, Clipper, Encoder, NoParams, Sampler, describe
from graphveil.errors import ConfigError, PluginError

ENTRY_POINT_GROUP = "graphveil"
BUILTIN_PREFIX = "graphveil.plugins."
#: Built-in plugins that cannot be blocked: the DP-SGD basics every run may need.
ESSENTIAL_PLUGINS = frozenset({"standard"})
AUTOLOAD_OFF_ENV = "GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD"

#: family name → (hook name, base class)
FAMILIES: dict[str, tuple[str, type]] = {
    "sampler": ("graphveil_samplers", Sampler),
    "clipper": ("graphveil_clippers", Clipper),
    "accountant": ("graphveil_accountants", Accountant),
    "encoder": ("graphveil_encoders", Encoder),
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


class PluginHost:
    """Registry of plugins and their components.

    :param autoload: scan the ``graphveil`` entry-point group.
    :param block: plugin names to skip (essential plugins cannot be blocked).
    """

    def __init__(self, *, autoload: bool = True, block: Iterable[str] = ()) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
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
            builtin = ep.value.startswith(BUILTIN_PREFIX)
            if third_party_off and not builtin:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken plugin must say who it is
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}") from exc
            self.register(plugin, ep.name)

    def register(self, plugin: Any, name: str) -> None:
        """Register ``plugin`` under ``name``; validates everything before changing any state."""
        if self.pm.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered")
        if isinstance(plugin, str):
            plugin = importlib.import_module(plugin)
        new = self._collect(plugin, name)
        # Validate the hook signatures on a scratch manager so a bad plugin leaves no trace.
        scratch = pluggy.PluginManager(hookspecs.PROJECT)
        scratch.add_hookspecs(hookspecs)
        try:
            scratch.register(plugin, name)
            scratch.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r}: {exc}") from exc
        self.pm.register(plugin, name)
        self._components.update(new)

    def _collect(self, plugin: Any, plugin_name: str) -> dict[tuple[str, str], ComponentInfo]:
        found: dict[tuple[str, str], ComponentInfo] = {}
        for family, (hook_name, base) in FAMILIES.items():
            impl = getattr(plugin, hook_name, None)
            if impl is None:
                continue
            provided = impl()
            if not isinstance(provided, Mapping):
                raise PluginError(f"plugin {plugin_name!r}: {hook_name}() must return a mapping of name → factory")
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
        info = self.get(family, name)
        try:
            validated = info.params_model.model_validate(dict(params or {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(params)"
            value = first.get("input")
            label = where or family
            raise ConfigError(f"{label}.{field}: {first['msg']} (got {value!r})") from exc
        return info.factory(validated)

    @property
    def hook(self) -> Any:
        return self.pm.hook


_default: PluginHost | None = None


def default_host() -> PluginHost:
    """The process-wide host with every installed plugin loaded."""
    global _default
    if _default is None:
        _default = PluginHost()
    return _default
