"""The hooks a zrt plugin may implement.

Every hook is a *contribution* hook: it takes no arguments and returns a list or tuple of
frozen values of one type (an empty one to contribute nothing). The core calls each
implementation at most once per plugin host, checks every value's type, records which
distribution gave it, and rejects a duplicate name with a message naming both
distributions. Anything else returned, or an exception raised, is a
:class:`~zrt_core.errors.PluginError` naming the plugin. Wrappers (``hookwrapper=True``,
``wrapper=True``) are refused on these hooks. The core registers its own defaults through
these same hooks.

A plugin is a module (or object) with functions marked by :data:`zrt_core.hookimpl`,
exposed through an entry point in the group ``zrt``::

    # pyproject.toml
    [project.entry-points.zrt]
    my_pack = "my_pack.plugin"

    # my_pack/plugin.py
    from zrt_core import hookimpl
    from zrt_core.hardware import HardwareSpec

    @hookimpl
    def zrt_hardware_specs():
        return [HardwareSpec.from_yaml(p) for p in ...]

``docs/hardware-packs.md`` walks through a complete third-party pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from zrt_core.capture.patches import ModelPatch
    from zrt_core.cost.backend import CostBackendSpec
    from zrt_core.cost.measured import MeasuredTable
    from zrt_core.formulas.registry import OpFormula
    from zrt_core.hardware import HardwareSpec
    from zrt_core.models import BundledModel
    from zrt_core.transforms.fusion import FusionRulePack

PROJECT = "zrt"

hookspec = pluggy.HookspecMarker(PROJECT)


# -------------------------------------------------------------------------------------
# Hardware
# -------------------------------------------------------------------------------------


@hookspec
def zrt_hardware_specs() -> Sequence[HardwareSpec]:
    """Hardware this plugin ships.

    :return: a list or tuple of :class:`zrt_core.hardware.HardwareSpec`, usually loaded from the
        package's YAML files with :meth:`HardwareSpec.from_yaml`. Ids and aliases must be
        unique across all installed plugins; a clash is an error naming both
        distributions. Return an empty sequence to contribute nothing.
    """


@hookspec
def zrt_measured_tables() -> Sequence[MeasuredTable]:
    """Measured kernel times for a hardware id (op, shapes, dtype → seconds).

    :return: a list or tuple of :class:`zrt_core.cost.measured.MeasuredTable`, each naming its
        hardware id and a unique table name. The measured-table cost backend looks ops up in
        every table of the hardware being priced, exactly or interpolated. Table names
        must be unique.
    """


# -------------------------------------------------------------------------------------
# Models and capture
# -------------------------------------------------------------------------------------


@hookspec
def zrt_model_configs() -> Sequence[BundledModel]:
    """Model configs bundled by this plugin, reachable by name (``zrt models``).

    :return: a list or tuple of :class:`zrt_core.models.BundledModel`. Keys and aliases must
        be unique (case-insensitive) across all installed plugins.
    """


@hookspec
def zrt_model_patches() -> Sequence[ModelPatch]:
    """Scoped patches applied while a model is built and captured.

    :return: a list or tuple of :class:`zrt_core.capture.patches.ModelPatch`. A patch says which
        configs it applies to and returns a context manager; the harness enters it around
        build and capture and exits it afterwards, so nothing stays patched. Names must be
        unique.
    """


@hookspec
def zrt_op_formulas() -> Sequence[OpFormula]:
    """FLOP and byte formulas for operators, as pure functions of shapes.

    :return: a list or tuple of :class:`zrt_core.formulas.registry.OpFormula`, one per operator
        name (``aten.mm`` for every overload, or ``aten.mm.default`` for one). Registering a
        name twice is an error naming both distributions.
    """


# -------------------------------------------------------------------------------------
# Transforms and cost
# -------------------------------------------------------------------------------------


@hookspec
def zrt_fusion_rules() -> Sequence[FusionRulePack]:
    """Fusion rule packs: patterns of ops inside one module scope that become one fused op.

    :return: a list or tuple of :class:`zrt_core.transforms.fusion.FusionRulePack`, each with a
        unique name and the platform it targets (``cuda``, ``ascend``, ``generic``).
    """


@hookspec
def zrt_cost_backends() -> Sequence[CostBackendSpec]:
    """Cost backends that price graph nodes on a hardware spec.

    :return: a list or tuple of :class:`zrt_core.cost.backend.CostBackendSpec`. Backends are
        asked in descending priority; the first that prices a node wins, and the built-in
        roofline (lowest priority) prices the rest. Names must be unique.
    """
