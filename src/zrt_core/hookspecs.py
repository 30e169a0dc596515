"""The hooks a zrt plugin may implement.

Two kinds:

- *Contribution* hooks take no arguments and return a list or tuple of frozen values of
  one type (an empty one to contribute nothing). The core calls each implementation at
  most once per plugin host, checks every value's type, records which distribution gave
  it, and rejects a duplicate name with a message naming both distributions. The core
  registers its own defaults through these same hooks.
- *Query* hooks (``firstresult``) take arguments and answer for them, or return None to
  let the next plugin answer; the first non-None result wins. The core asks them only
  where its own knowledge ends (each spec says where).

For both, anything else returned, or an exception raised, is a
:class:`~zrt_core.errors.PluginError` naming the plugin. Wrappers (``hookwrapper=True``,
``wrapper=True``) are refused: the core calls implementations one by one to name them.
``docs/plugins.md`` has a section per hook.

A plugin is a module (or object) with functions marked by :data:`zrt_core.hookimpl`,
exposed through an entry point in the group ``zrt``::

    # pyproject.toml
    [project.entry-points.zrt]
    my_pack = "my_pack.plugin"

    # my_pack/plugin.py
    from zrt_core.plugin import HardwareSpec, hookimpl

    @hookimpl
    def zrt_hardware_specs():
        return [HardwareSpec.from_yaml(p) for p in ...]

``docs/hardware-packs.md`` walks through a complete third-party pack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from zrt_core.capture.model_types import ModelType
    from zrt_core.capture.patches import ModelPatch
    from zrt_core.cost.backend import CostBackendSpec
    from zrt_core.cost.measured import MeasuredTable
    from zrt_core.formulas.registry import OpFormula
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelmath.flops import PhaseFlops
    from zrt_core.models import BundledModel
    from zrt_core.transforms.base import TransformSpec
    from zrt_core.transforms.fusion import FusionRulePack

PROJECT = "zrt"

hookspec = pluggy.HookspecMarker(PROJECT)
#: marks a plugin's hook implementations (re-exported as zrt_core.hookimpl and
#: zrt_core.plugin.hookimpl); defined beside the specs so that contributors need not import
#: the plugin host
hookimpl = pluggy.HookimplMarker(PROJECT)


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
def zrt_model_types() -> Sequence[ModelType]:
    """Model families (``model_type``) that transformers does not build, built by this plugin.

    :return: a list or tuple of :class:`zrt_core.capture.model_types.ModelType`: the type's
        name and callables returning its config class and causal-LM class. The core asks for
        them only when a config's ``model_type`` is not built into transformers; nothing is
        registered with transformers. Names must be unique across plugins.
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
def zrt_graph_transforms() -> Sequence[TransformSpec]:
    """Graph transforms both estimators run on every priced graph (serving and training).

    :return: a list or tuple of :class:`zrt_core.transforms.base.TransformSpec`: a unique
        name, a factory ``(TransformContext) -> transform | None``, the point of the
        pipeline where it runs (``before_fusion``: per-rank graphs with their captured op
        names; ``after_fusion``: fused graphs, before the estimator's own rewrites and
        pricing), the kernel platforms (``cuda``, ``ascend``, ``generic``; empty: all) and
        graph phases (empty: all) it applies to, and its ``order`` among the transforms of
        that point (ascending, then by name). Names must be unique.
    """


@hookspec
def zrt_cost_backends() -> Sequence[CostBackendSpec]:
    """Cost backends that price graph nodes on a hardware spec.

    :return: a list or tuple of :class:`zrt_core.cost.backend.CostBackendSpec`. Backends are
        asked in descending priority; the first that prices a node wins, and the built-in
        roofline (lowest priority) prices the rest. Names must be unique.
    """


# -------------------------------------------------------------------------------------
# Analytic references (query hooks)
# -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def zrt_reference_flops(config: Mapping[str, Any], phase: str, batch: int,
                        seq_len: int) -> PhaseFlops | None:
    """The analytic FLOPs of one phase of a model the core's reference does not describe.

    The core's own count (:mod:`zrt_core.modelmath.flops`) is authoritative for the families
    it describes and is used first; this hook is asked only when the core raises
    :class:`~zrt_core.errors.ModelError` for the config (a family it has no model of), so a
    plugin that rewrites a family's capture can never move the reference that capture is
    checked against. Stops at first non-None result.

    :param config: the model's HuggingFace config as a mapping (``text_config`` nested for
        multimodal configs); read it, never change it.
    :param phase: ``prefill``, ``decode``, ``train_forward`` or ``train_backward``.
    :param batch: sequences.
    :param seq_len: tokens per sequence; for ``decode`` the cached length (the new token
        attends to ``seq_len + 1`` keys).
    :return: a :class:`zrt_core.modelmath.flops.PhaseFlops` for the whole model (every
        layer), with ``phase``, ``batch`` and ``seq_len`` as given and the core's
        conventions (causal attention; logits of the last position for prefill/decode,
        of every position for training; ``train_backward`` twice ``train_forward``), or
        None when this plugin does not describe the model.
    """
