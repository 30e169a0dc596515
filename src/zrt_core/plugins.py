"""Plugin discovery and the registries that plugins fill.

:func:`get_plugin_manager` builds a fresh :class:`PluginHost` each call (there is no
module-global manager): it adds the hookspecs, registers the core's own defaults through
the same hooks third parties use, loads the ``zrt`` entry points, and validates every
implementation against its spec. The host then collects each contribution hook into a
:class:`Registry`, remembering which distribution gave which value.

Environment:
    ``ZRT_DISABLE_PLUGIN_AUTOLOAD=1``  load no entry points (the core's defaults stay).
    ``ZRT_DISABLE_PLUGINS=a,b``        skip these entry-point or distribution names.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import os
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pluggy
from attrs import field, frozen

from zrt_core import hookspecs
from zrt_core.errors import PluginError, UnknownNameError

if TYPE_CHECKING:
    from zrt_core.capture.patches import ModelPatch
    from zrt_core.cost.backend import CostBackendSpec
    from zrt_core.cost.measured import MeasuredTable
    from zrt_core.formulas.registry import FormulaRegistry
    from zrt_core.hardware import HardwareSpec
    from zrt_core.models import BundledModel
    from zrt_core.transforms.fusion import FusionRulePack

ENTRY_POINT_GROUP = "zrt"
CORE_PLUGIN_NAME = "zrt_core"
CORE_DISTRIBUTION = "zrt-core"
ENV_DISABLE_AUTOLOAD = "ZRT_DISABLE_PLUGIN_AUTOLOAD"
ENV_DISABLE = "ZRT_DISABLE_PLUGINS"

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT)

T = TypeVar("T")

CONTRIBUTION_HOOKS = (
    "zrt_hardware_specs",
    "zrt_measured_tables",
    "zrt_model_configs",
    "zrt_model_patches",
    "zrt_op_formulas",
    "zrt_fusion_rules",
    "zrt_cost_backends",
)


def _core_version() -> str:
    try:
        return md.version(CORE_DISTRIBUTION)
    except md.PackageNotFoundError:
        return "0+unknown"


@frozen
class PluginInfo:
    """What ``zrt plugins`` shows for one registered plugin."""

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]
    contributions: dict[str, tuple[str, ...]] = field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "hooks": list(self.hooks),
            "contributions": {k: list(v) for k, v in self.contributions.items()},
        }


class Registry(Generic[T]):
    """Named contributions of one kind, each remembering its distribution.

    :param kind: what the values are, for messages ("hardware spec").
    :param key: the value's unique name.
    :param aliases: extra names that resolve to the value; they must be unique too.
    """

    def __init__(
        self,
        kind: str,
        key: Callable[[T], str],
        aliases: Callable[[T], Iterable[str]] = lambda _v: (),
    ) -> None:
        self.kind = kind
        self._key = key
        self._aliases = aliases
        self._values: dict[str, T] = {}
        self._dist: dict[str, str] = {}
        self._names: dict[str, str] = {}  # every name or alias -> key

    def add(self, value: T, distribution: str) -> None:
        key = self._key(value)
        for name in (key, *self._aliases(value)):
            if name in self._names:
                owner = self._names[name]
                raise PluginError(
                    f"{self.kind} {name!r} is contributed twice: by {self._dist[owner]!r} "
                    f"and by {distribution!r}",
                    f"uninstall one of them or disable it with {ENV_DISABLE}=<name>",
                )
        self._values[key] = value
        self._dist[key] = distribution
        for name in (key, *self._aliases(value)):
            self._names[name] = key

    def get(self, name: str) -> T:
        """The value named ``name`` or one of its aliases (case-insensitive)."""
        key = self._names.get(name) or self._names.get(name.lower())
        if key is None:
            close = difflib.get_close_matches(name.lower(), list(self._names), n=3, cutoff=0.4)
            hint = (f"did you mean {', '.join(close)}?" if close
                    else f"{len(self._values)} are installed")
            raise UnknownNameError(f"unknown {self.kind} {name!r}",
                                   f"{hint} (list them with the matching `zrt` listing command)")
        return self._values[key]

    def distribution_of(self, name: str) -> str:
        return self._dist[self._names.get(name, name)]

    def resolve(self, name: str) -> str:
        """The key that ``name`` (a key or alias) stands for."""
        return self._key(self.get(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._names or name.lower() in self._names)

    def __iter__(self) -> Iterator[T]:
        return iter(self._values.values())

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._values)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._values.items())


class PluginHost:
    """The typed facade over one pluggy manager: registries, plugin listing.

    Build it with :func:`get_plugin_manager`. Registries are collected on first use.
    """

    def __init__(self, pm: pluggy.PluginManager, distributions: dict[str, tuple[str, str]]):
        self.pm = pm
        # plugin name -> (distribution, version)
        self._distributions = distributions

    # -- registration ---------------------------------------------------------------

    def register(self, plugin: object, name: str, distribution: str = "<local>",
                 version: str = "") -> None:
        """Register a plugin object (tests, embedding applications); validates it."""
        if self.pm.has_plugin(name):
            raise PluginError(f"plugin {name!r} is already registered")
        self.pm.register(plugin, name=name)
        self.pm.check_pending()
        self._distributions[name] = (distribution, version)
        self._reset()

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._distributions.pop(name, None)
        self._reset()

    def _reset(self) -> None:
        for attr in ("hardware", "formulas", "models", "model_patches", "fusion_rules",
                     "cost_backends", "measured_tables", "_contributions"):
            self.__dict__.pop(attr, None)

    def distribution(self, plugin_name: str) -> str:
        return self._distributions.get(plugin_name, ("<local>", ""))[0]

    # -- contributions --------------------------------------------------------------

    @cached_property
    def _contributions(self) -> dict[str, list[tuple[str, Any]]]:
        """hook name -> [(plugin name, value), ...], in registration order."""
        out: dict[str, list[tuple[str, Any]]] = {h: [] for h in CONTRIBUTION_HOOKS}
        for hook_name in CONTRIBUTION_HOOKS:
            caller = getattr(self.pm.hook, hook_name)
            # pluggy calls the last registered first; reverse so the core comes first.
            for impl in reversed(caller.get_hookimpls()):
                try:
                    values = impl.function()
                except Exception as exc:  # a plugin bug must name the plugin
                    raise PluginError(
                        f"plugin {impl.plugin_name!r} "
                        f"({self.distribution(impl.plugin_name)}) failed in {hook_name}: "
                        f"{type(exc).__name__}: {exc}",
                        "fix or disable the plugin "
                        f"({ENV_DISABLE}={impl.plugin_name})",
                    ) from exc
                for value in values or ():
                    out[hook_name].append((impl.plugin_name, value))
        return out

    def _collect(self, hook: str, registry: Registry[Any]) -> Registry[Any]:
        for plugin_name, value in self._contributions[hook]:
            registry.add(value, self.distribution(plugin_name))
        return registry

    @cached_property
    def hardware(self) -> Registry[HardwareSpec]:
        return self._collect("zrt_hardware_specs",
                             Registry("hardware id", lambda s: s.id, lambda s: s.aliases))

    @cached_property
    def measured_tables(self) -> Registry[MeasuredTable]:
        return self._collect("zrt_measured_tables",
                             Registry("measured table", lambda t: t.name))

    @cached_property
    def models(self) -> Registry[BundledModel]:
        return self._collect("zrt_model_configs",
                             Registry("model", lambda m: m.key, lambda m: m.aliases))

    @cached_property
    def model_patches(self) -> Registry[ModelPatch]:
        return self._collect("zrt_model_patches", Registry("model patch", lambda p: p.name))

    @cached_property
    def fusion_rules(self) -> Registry[FusionRulePack]:
        return self._collect("zrt_fusion_rules", Registry("fusion rule pack", lambda p: p.name))

    @cached_property
    def cost_backends(self) -> Registry[CostBackendSpec]:
        return self._collect("zrt_cost_backends", Registry("cost backend", lambda b: b.name))

    @cached_property
    def formulas(self) -> FormulaRegistry:
        from zrt_core.formulas.registry import FormulaRegistry

        registry = FormulaRegistry()
        for plugin_name, value in self._contributions["zrt_op_formulas"]:
            registry.register(value, self.distribution(plugin_name))
        return registry

    def hardware_spec(self, name: str) -> HardwareSpec:
        """A spec by id or alias; an unknown name lists the closest ids."""
        return self.hardware.get(name)

    # -- listing --------------------------------------------------------------------

    def plugin_infos(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            hooks = tuple(sorted(
                h.name for h in (self.pm.get_hookcallers(plugin) or ())
            ))
            contributions: dict[str, tuple[str, ...]] = {}
            for hook in hooks:
                if hook in CONTRIBUTION_HOOKS:
                    names = tuple(_contribution_name(v) for p, v in self._contributions[hook]
                                  if p == name)
                    contributions[hook] = names
            dist, version = self._distributions.get(name, ("<local>", ""))
            infos.append(PluginInfo(name=name, distribution=dist, version=version,
                                    hooks=hooks, contributions=contributions))
        return infos


def _contribution_name(value: Any) -> str:
    for attr in ("id", "key", "name", "op"):
        v = getattr(value, attr, None)
        if isinstance(v, str):
            return v
    return repr(value)


def _disabled_names() -> set[str]:
    raw = os.environ.get(ENV_DISABLE, "")
    return {n.strip() for n in raw.split(",") if n.strip()}


def _autoload_disabled() -> bool:
    return os.environ.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() not in ("", "0", "false", "no")


def get_plugin_manager(*, autoload: bool | None = None) -> PluginHost:
    """Build a new plugin host: specs, the core's defaults, entry points, validation.

    :param autoload: load ``zrt`` entry points; None reads ``ZRT_DISABLE_PLUGIN_AUTOLOAD``.
    :raises PluginError: an entry point fails to import (naming it and its distribution),
        or an implementation does not match its spec.
    """
    from zrt_core import defaults

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    distributions: dict[str, tuple[str, str]] = {}

    pm.register(defaults, name=CORE_PLUGIN_NAME)
    distributions[CORE_PLUGIN_NAME] = (CORE_DISTRIBUTION, _core_version())

    if autoload is None:
        autoload = not _autoload_disabled()
    if autoload:
        disabled = _disabled_names()
        for ep in sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            dist = ep.dist.name if ep.dist is not None else "<unknown distribution>"
            version = ep.dist.version if ep.dist is not None else ""
            if ep.name in disabled or dist in disabled:
                continue
            if pm.has_plugin(ep.name):
                if distributions.get(ep.name, ("",))[0] == dist:
                    continue  # the same distribution seen twice on sys.path
                raise PluginError(
                    f"plugin name {ep.name!r} is used by {distributions[ep.name][0]!r} "
                    f"and by {dist!r}",
                    f"uninstall one, or disable one with {ENV_DISABLE}",
                )
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin entry point {ep.name!r} = {ep.value!r} from distribution "
                    f"{dist!r} failed to import: {type(exc).__name__}: {exc}",
                    f"reinstall or fix it, or skip it with {ENV_DISABLE}={ep.name}",
                ) from exc
            try:
                pm.register(plugin, name=ep.name)
            except (pluggy.PluginValidationError, ValueError) as exc:
                raise PluginError(
                    f"plugin {ep.name!r} from {dist!r} is invalid: {exc}",
                    f"fix it, or skip it with {ENV_DISABLE}={ep.name}",
                ) from exc
            distributions[ep.name] = (dist, version)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"a plugin implements an unknown hook: {exc}",
                          "check the hook name against `zrt_core.hookspecs`") from exc
    return PluginHost(pm, distributions)
