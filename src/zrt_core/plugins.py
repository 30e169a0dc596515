"""Plugin discovery and the registries that plugins fill.

:func:`get_plugin_manager` builds a fresh :class:`PluginHost` each call (there is no
module-global manager): it adds the hookspecs, registers the core's own defaults through
the same hooks third parties use, loads the ``zrt`` entry points, and validates every
implementation against its spec as it registers it, so a bad plugin is named. The host
then collects each contribution hook into a :class:`Registry` on first use, remembering
which distribution gave which value and rejecting a name given twice.

Environment:
    ``ZRT_DISABLE_PLUGIN_AUTOLOAD=1``  load no entry points (the core's defaults stay).
    ``ZRT_DISABLE_PLUGINS=a,b``        skip these entry-point or distribution names.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as md
import inspect
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pluggy
from attrs import field, frozen

from zrt_core import hookspecs
from zrt_core.errors import PluginError, SpecError, UnknownNameError, ZrtError

if TYPE_CHECKING:
    from zrt_core.capture.model_types import ModelType
    from zrt_core.capture.patches import ModelPatch
    from zrt_core.cost.backend import CostBackendSpec
    from zrt_core.cost.measured import MeasuredTable
    from zrt_core.formulas.registry import FormulaRegistry
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelmath.flops import PhaseFlops
    from zrt_core.models import BundledModel
    from zrt_core.transforms.base import TransformSpec
    from zrt_core.transforms.fusion import FusionRulePack

ENTRY_POINT_GROUP = "zrt"
CORE_PLUGIN_NAME = "zrt_core"
CORE_DISTRIBUTION = "zrt-core"
LOCAL_DISTRIBUTION = "<local>"
ENV_DISABLE_AUTOLOAD = "ZRT_DISABLE_PLUGIN_AUTOLOAD"
ENV_DISABLE = "ZRT_DISABLE_PLUGINS"
#: modules holding the core's own hook implementations, registered by name in this order
CORE_CONTRIBUTION_MODULES = ("zrt_core.defaults",)

hookimpl = hookspecs.hookimpl

T = TypeVar("T")

#: Each contribution hook and the class (module, name) its values must be instances of.
CONTRIBUTION_TYPES: Mapping[str, tuple[str, str]] = {
    "zrt_hardware_specs": ("zrt_core.hardware", "HardwareSpec"),
    "zrt_measured_tables": ("zrt_core.cost.measured", "MeasuredTable"),
    "zrt_model_configs": ("zrt_core.models", "BundledModel"),
    "zrt_model_patches": ("zrt_core.capture.patches", "ModelPatch"),
    "zrt_model_types": ("zrt_core.capture.model_types", "ModelType"),
    "zrt_op_formulas": ("zrt_core.formulas.registry", "OpFormula"),
    "zrt_fusion_rules": ("zrt_core.transforms.fusion", "FusionRulePack"),
    "zrt_graph_transforms": ("zrt_core.transforms.base", "TransformSpec"),
    "zrt_cost_backends": ("zrt_core.cost.backend", "CostBackendSpec"),
}
CONTRIBUTION_HOOKS = tuple(CONTRIBUTION_TYPES)

#: Each query (firstresult) hook and the class (module, name) a non-None answer must be.
QUERY_TYPES: Mapping[str, tuple[str, str]] = {
    "zrt_reference_flops": ("zrt_core.modelmath.flops", "PhaseFlops"),
}
QUERY_HOOKS = tuple(QUERY_TYPES)


def _core_version() -> str:
    try:
        return md.version(CORE_DISTRIBUTION)
    except md.PackageNotFoundError:
        return "0+unknown"


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line (tracebacks stay behind ZRT_DEBUG)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@frozen
class PluginInfo:
    """What ``zrt plugins`` shows for one registered plugin.

    :param contributions: hook name → the names of the values this plugin gave it.
    """

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]
    contributions: Mapping[str, tuple[str, ...]] = field(factory=dict)

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

    Names and aliases are matched without regard to case and must be unique across all
    values: a second value claiming a name is a :class:`PluginError` naming both
    distributions.

    :param kind: what the values are, for messages ("hardware id").
    :param key: the value's unique name.
    :param aliases: extra names that resolve to the value.
    :param listing: the command that lists them, for the hint on an unknown name.
    """

    def __init__(
        self,
        kind: str,
        key: Callable[[T], str],
        aliases: Callable[[T], Iterable[str]] = lambda _v: (),
        *,
        listing: str = "zrt plugins",
    ) -> None:
        self.kind = kind
        self.listing = listing
        self._key = key
        self._aliases = aliases
        self._values: dict[str, T] = {}
        self._dist: dict[str, str] = {}
        self._names: dict[str, str] = {}  # every name or alias, lower-cased -> key

    def add(self, value: T, distribution: str) -> None:
        key = self._key(value)
        names = list(dict.fromkeys(n.lower() for n in (key, *self._aliases(value))))
        for name in names:
            if name in self._names:
                owner = self._names[name]
                raise PluginError(
                    f"{self.kind} {name!r} is contributed twice: by {self._dist[owner]!r} "
                    f"and by {distribution!r}",
                    f"uninstall one of them or disable one with {ENV_DISABLE}=<name>",
                )
        self._values[key] = value
        self._dist[key] = distribution
        for name in names:
            self._names[name] = key

    def get(self, name: str) -> T:
        """The value named ``name`` or one of its aliases (case-insensitive).

        :raises UnknownNameError: with the closest names, when none matches.
        """
        key = self._names.get(name.lower())
        if key is None:
            close = difflib.get_close_matches(name.lower(), list(self._names), n=3, cutoff=0.4)
            if close:
                hint = f"closest: {', '.join(close)}; `{self.listing}` lists all"
            else:
                hint = f"{len(self._values)} installed; `{self.listing}` lists them"
            raise UnknownNameError(f"unknown {self.kind} {name!r}", hint)
        return self._values[key]

    def distribution_of(self, name: str) -> str:
        """The distribution that contributed ``name`` (a key or alias)."""
        return self._dist[self.resolve(name)]

    def resolve(self, name: str) -> str:
        """The key that ``name`` (a key or alias) stands for."""
        return self._key(self.get(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._names

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

    Build it with :func:`get_plugin_manager`. Each registry is collected on first use, so
    listing hardware never calls the hooks that build cost backends or formulas.
    """

    def __init__(self, pm: pluggy.PluginManager, distributions: dict[str, tuple[str, str]]):
        self.pm = pm
        # plugin name -> (distribution, version)
        self._distributions = distributions
        self._contributed: dict[str, list[tuple[str, Any]]] = {}

    # -- registration ---------------------------------------------------------------

    def register(self, plugin: object, name: str, distribution: str = LOCAL_DISTRIBUTION,
                 version: str = "") -> None:
        """Register a plugin object (tests, embedding applications) and validate it.

        :raises PluginError: the name is taken, or the plugin does not match the specs
            (it is then left unregistered).
        """
        if self.pm.has_plugin(name):
            raise PluginError(f"plugin {name!r} is already registered",
                              "pick another name, or unregister the first")
        _register_checked(self.pm, plugin, name, f"plugin {name!r} ({distribution})")
        self._distributions[name] = (distribution, version)
        self._reset()

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._distributions.pop(name, None)
        self._reset()

    def _reset(self) -> None:
        self._contributed.clear()
        for attr in ("hardware", "formulas", "models", "model_patches", "fusion_rules",
                     "cost_backends", "measured_tables", "graph_transforms"):
            self.__dict__.pop(attr, None)

    def distribution(self, plugin_name: str) -> str:
        """The distribution a registered plugin came from (``<local>`` when registered in code)."""
        return self._distributions.get(plugin_name, (LOCAL_DISTRIBUTION, ""))[0]

    # -- contributions --------------------------------------------------------------

    def contributions(self, hook_name: str) -> list[tuple[str, Any]]:
        """``[(plugin name, value), ...]`` for one contribution hook, core first.

        Each implementation is called once per host. A plugin that raises, returns
        something other than a list or tuple, or a value of the wrong type is a
        :class:`PluginError` naming the plugin and its distribution.
        """
        if hook_name not in CONTRIBUTION_TYPES:
            raise PluginError(f"{hook_name!r} is not a contribution hook",
                              f"use one of {', '.join(CONTRIBUTION_HOOKS)}")
        cached = self._contributed.get(hook_name)
        if cached is not None:
            return cached
        module_name, class_name = CONTRIBUTION_TYPES[hook_name]
        expected = getattr(importlib.import_module(module_name), class_name)
        out: list[tuple[str, Any]] = []
        caller = getattr(self.pm.hook, hook_name)
        # get_hookimpls() lists implementations in registration order (pluggy calls them
        # last-registered first); keeping this order puts the core's defaults first.
        for impl in caller.get_hookimpls():
            who = f"plugin {impl.plugin_name!r} ({self.distribution(impl.plugin_name)})"
            fix = ("this is a bug in zrt's own data; report it"
                   if impl.plugin_name == CORE_PLUGIN_NAME else
                   f"fix the plugin, or disable it with {ENV_DISABLE}={impl.plugin_name}")
            try:
                values = impl.function()
            except PluginError:
                raise
            except ZrtError as exc:  # bad data in a pack: keep its message and hint
                raise PluginError(f"{who} failed in {hook_name}: {exc.message}",
                                  exc.hint or fix) from exc
            except Exception as exc:  # a plugin bug must name the plugin
                raise PluginError(f"{who} failed in {hook_name}: {_one_line(exc)}",
                                  fix) from exc
            if values is None:
                values = ()
            if not isinstance(values, list | tuple):
                raise PluginError(
                    f"{who}: {hook_name} returned a {type(values).__name__}, "
                    "not a list or tuple",
                    "return a list of values, or [] to contribute nothing",
                )
            for value in values:
                if not isinstance(value, expected):
                    raise PluginError(
                        f"{who}: {hook_name} returned a {type(value).__name__}, "
                        f"expected {class_name}",
                        f"build values with {module_name}.{class_name}",
                    )
                out.append((impl.plugin_name, value))
        self._contributed[hook_name] = out
        return out

    def _collect(self, hook: str, registry: Registry[Any]) -> Registry[Any]:
        for plugin_name, value in self.contributions(hook):
            registry.add(value, self.distribution(plugin_name))
        return registry

    @cached_property
    def hardware(self) -> Registry[HardwareSpec]:
        return self._collect("zrt_hardware_specs",
                             Registry("hardware id", lambda s: s.id, lambda s: s.aliases,
                                      listing="zrt hw list"))

    @cached_property
    def measured_tables(self) -> Registry[MeasuredTable]:
        return self._collect("zrt_measured_tables",
                             Registry("measured table", lambda t: t.name))

    @cached_property
    def models(self) -> Registry[BundledModel]:
        return self._collect("zrt_model_configs",
                             Registry("model", lambda m: m.key, lambda m: m.aliases,
                                      listing="zrt models"))

    @cached_property
    def model_patches(self) -> Registry[ModelPatch]:
        return self._collect("zrt_model_patches", Registry("model patch", lambda p: p.name))

    @cached_property
    def model_types(self) -> Registry[ModelType]:
        return self._collect("zrt_model_types", Registry("model type", lambda t: t.name))

    @cached_property
    def fusion_rules(self) -> Registry[FusionRulePack]:
        return self._collect("zrt_fusion_rules", Registry("fusion rule pack", lambda p: p.name))

    @cached_property
    def graph_transforms(self) -> Registry[TransformSpec]:
        return self._collect("zrt_graph_transforms",
                             Registry("graph transform", lambda t: t.name))

    @cached_property
    def cost_backends(self) -> Registry[CostBackendSpec]:
        return self._collect("zrt_cost_backends", Registry("cost backend", lambda b: b.name))

    @cached_property
    def formulas(self) -> FormulaRegistry:
        from zrt_core.formulas.registry import FormulaRegistry

        registry = FormulaRegistry()
        for plugin_name, value in self.contributions("zrt_op_formulas"):
            registry.register(value, self.distribution(plugin_name))
        return registry

    def hardware_spec(self, name: str) -> HardwareSpec:
        """A spec by id or alias, or a pack YAML file (``./my_hw.yaml``, as ``zrt calibrate``
        writes); an unknown name lists the closest ids."""
        if name.endswith((".yaml", ".yml")):
            from zrt_core.hardware import HardwareSpec

            if not os.path.isfile(name):
                raise SpecError(f"hardware file {name} not found",
                                "give a pack YAML (zrt calibrate -o FILE.yaml) or an id "
                                "(zrt hw list)")
            return HardwareSpec.from_yaml(name)
        return self.hardware.get(name)

    # -- queries ----------------------------------------------------------------------

    def query(self, hook_name: str, **kwargs: Any) -> tuple[Any, str] | None:
        """The first non-None answer of a query hook and the plugin that gave it, asking the
        implementations in pluggy's order (last registered first, ``tryfirst``/``trylast``
        respected); None when none answers.

        :raises PluginError: an implementation raises, or answers with a value of the wrong
            type; the message names the plugin and its distribution (a ``ZrtError`` keeps
            its message and hint).
        """
        if hook_name not in QUERY_TYPES:
            raise PluginError(f"{hook_name!r} is not a query hook",
                              f"use one of {', '.join(QUERY_HOOKS)}")
        module_name, class_name = QUERY_TYPES[hook_name]
        expected = getattr(importlib.import_module(module_name), class_name)
        caller = getattr(self.pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):
            who = f"plugin {impl.plugin_name!r} ({self.distribution(impl.plugin_name)})"
            fix = f"fix the plugin, or disable it with {ENV_DISABLE}={impl.plugin_name}"
            try:
                answer = impl.function(*(kwargs[a] for a in impl.argnames))
            except PluginError:
                raise
            except ZrtError as exc:
                raise PluginError(f"{who} failed in {hook_name}: {exc.message}",
                                  exc.hint or fix) from exc
            except Exception as exc:
                raise PluginError(f"{who} failed in {hook_name}: {_one_line(exc)}",
                                  fix) from exc
            if answer is None:
                continue
            if not isinstance(answer, expected):
                raise PluginError(f"{who}: {hook_name} returned a {type(answer).__name__}, "
                                  f"expected {class_name} or None",
                                  f"build the answer with {module_name}.{class_name}")
            return answer, impl.plugin_name
        return None

    def reference_flops(self, config: Mapping[str, Any], phase: str, batch: int,
                        seq_len: int) -> tuple[PhaseFlops, str] | None:
        """``zrt_reference_flops``: the first plugin's count for a model the core does not
        describe, with the distribution that gave it; None when no plugin does. Callers
        use :func:`zrt_core.modelmath.flops.reference_flops`, which asks the core first."""
        found = self.query("zrt_reference_flops", config=config, phase=phase, batch=batch,
                           seq_len=seq_len)
        if found is None:
            return None
        flops, plugin = found
        if flops.phase != phase or flops.batch != batch or flops.seq_len != seq_len:
            raise PluginError(
                f"plugin {plugin!r} ({self.distribution(plugin)}): zrt_reference_flops "
                f"answered for {flops.phase}/batch {flops.batch}/seq_len {flops.seq_len}, "
                f"asked for {phase}/batch {batch}/seq_len {seq_len}",
                "return the PhaseFlops of the phase, batch and length asked for")
        return flops, self.distribution(plugin)

    # -- listing --------------------------------------------------------------------

    def plugin_infos(self) -> list[PluginInfo]:
        """Every registered plugin with its distribution, hooks and contributions.

        Calls every contribution hook, so a broken plugin shows up here as an error.
        """
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:  # blocked
                continue
            hooks = tuple(sorted(h.name for h in (self.pm.get_hookcallers(plugin) or ())))
            contributions = {
                hook: tuple(_contribution_name(v) for p, v in self.contributions(hook)
                            if p == name)
                for hook in hooks if hook in CONTRIBUTION_TYPES
            }
            dist, version = self._distributions.get(name, (LOCAL_DISTRIBUTION, ""))
            infos.append(PluginInfo(name=name, distribution=dist, version=version,
                                    hooks=hooks, contributions=contributions))
        return infos


def _contribution_name(value: Any) -> str:
    for attr in ("id", "key", "name", "op"):
        v = getattr(value, attr, None)
        if isinstance(v, str):
            return v
    return repr(value)


def _register_checked(pm: pluggy.PluginManager, plugin: object, name: str, who: str) -> None:
    """Register ``plugin`` and check it against the specs at once, so errors name it.

    Rejects: a hook implementation whose arguments do not match its spec, a ``zrt_*``
    function that is no known hook, and a wrapper on a contribution or query hook (the
    core calls implementations one by one, so a wrapper would never run). On failure the plugin is
    unregistered again. A ``zrt_*`` function left without ``@hookimpl`` is an error too:
    pluggy would silently ignore it, and a hardware pack would vanish without a word.
    """
    for attr in sorted(vars(plugin)) if hasattr(plugin, "__dict__") else ():
        value = getattr(plugin, attr, None)
        if (attr.startswith(f"{hookspecs.PROJECT}_") and inspect.isfunction(value)
                and pm.parse_hookimpl_opts(plugin, attr) is None):
            raise PluginError(
                f"{who} defines {attr}() without @hookimpl",
                "decorate it with @zrt_core.hookimpl so zrt can call it",
            )
    try:
        pm.register(plugin, name=name)
    except (pluggy.PluginValidationError, ValueError) as exc:
        raise PluginError(f"{who} is invalid: {_one_line(exc)}",
                          f"fix it, or disable it with {ENV_DISABLE}={name}") from exc
    try:
        for caller in pm.get_hookcallers(plugin) or ():
            if caller.spec is None:
                raise PluginError(
                    f"{who} implements {caller.name!r}, which is not a zrt hook",
                    "check the name against zrt_core.hookspecs (a typo, or a newer zrt)",
                )
            if caller.name in CONTRIBUTION_TYPES or caller.name in QUERY_TYPES:
                kind = "contribution" if caller.name in CONTRIBUTION_TYPES else "query"
                for impl in caller.get_hookimpls():
                    if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                        raise PluginError(
                            f"{who} wraps the {kind} hook {caller.name!r}",
                            "implement it as a plain @hookimpl returning "
                            + ("a list" if kind == "contribution" else "a value or None"),
                        )
    except PluginError:
        pm.unregister(plugin)
        raise


def _disabled_names() -> set[str]:
    raw = os.environ.get(ENV_DISABLE, "")
    return {n.strip() for n in raw.split(",") if n.strip()}


def _autoload_disabled() -> bool:
    return os.environ.get(ENV_DISABLE_AUTOLOAD, "").strip().lower() not in ("", "0", "false", "no")


def get_plugin_manager(*, autoload: bool | None = None) -> PluginHost:
    """Build a new plugin host: specs, the core's defaults, entry points, validation.

    :param autoload: load ``zrt`` entry points; None reads ``ZRT_DISABLE_PLUGIN_AUTOLOAD``.
        Entry points named (or whose distribution is named) in ``ZRT_DISABLE_PLUGINS`` are
        skipped.
    :raises PluginError: an entry point fails to import (naming it and its distribution),
        two distributions use one entry-point name, or an implementation does not match
        its spec.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    distributions: dict[str, tuple[str, str]] = {}

    # the core's own contributions, by module name: the host imports no contributor at
    # module level, so contributors may import anything below them without a cycle
    for module_name in CORE_CONTRIBUTION_MODULES:
        _register_checked(pm, importlib.import_module(module_name), CORE_PLUGIN_NAME,
                          f"the core ({CORE_DISTRIBUTION})")
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
                    f"{dist!r} failed to import: {_one_line(exc)}",
                    f"reinstall or fix it, or skip it with {ENV_DISABLE}={ep.name}",
                ) from exc
            _register_checked(pm, plugin, ep.name, f"plugin {ep.name!r} from {dist!r}")
            distributions[ep.name] = (dist, version)
    return PluginHost(pm, distributions)
