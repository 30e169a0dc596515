"""Transforms: ordered passes over an :class:`OpGraph`, each a small object with a name.

A transform never mutates its input; it returns a new graph (``graph.with_nodes(...)`` or
``attrs.evolve``). :func:`apply_all` runs a sequence and records their names in
``graph.meta["transforms"]`` so every report can say what was applied.

Plugins add transforms to both estimators' pipelines with :class:`TransformSpec` values
(the ``zrt_graph_transforms`` hook); :func:`plugin_transforms` returns those that apply to
a context at one point of the pipeline, and :func:`around_fusion` is what the estimators
call: the contributed transforms of both points with the fusion pass between them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from attrs import evolve, field, frozen

from zrt_core.errors import SpecError
from zrt_core.ir.graph import Phase

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.ir.graph import OpGraph
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost
    from zrt_core.strategy import InferSpec, Parallel, TrainSpec

#: The kernel platforms a hardware vendor maps to (``TransformContext.platform``).
PLATFORMS = ("cuda", "ascend", "generic")

#: Where a contributed transform runs in both estimators' pipelines:
#: ``before_fusion`` — on the per-rank graphs (after TP/SP/CP/EP sharding and, in serving,
#: the rescale to the step's batch and context and the quantisation), before the
#: platform's fusion rules: ops still carry their captured names;
#: ``after_fusion`` — right after the fusion rules, before the estimator's own rewrites
#: (serving: paged KV-cache writes, data-parallel replicas; training: precision recipe,
#: recompute, ZeRO gathers, gradient synchronisation) and pricing.
POINTS = ("before_fusion", "after_fusion")


@frozen
class TransformContext:
    """What a transform may read: the model, the machine, the layout and the workload."""

    dims: ModelDims
    hardware: HardwareSpec
    parallel: Parallel
    host: PluginHost
    train: TrainSpec | None = None
    infer: InferSpec | None = None

    @property
    def platform(self) -> str:
        """The fusion/kernel platform of the hardware: ``cuda``, ``ascend`` or ``generic``."""
        return {"nvidia": "cuda", "huawei": "ascend", "ascend": "ascend"}.get(
            self.hardware.vendor.lower(), "generic")

    @property
    def training(self) -> bool:
        return self.train is not None


class Transform(Protocol):
    name: str

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph: ...


def _check_names(spec: str, values: tuple[str, ...], allowed: tuple[str, ...], what: str
                 ) -> None:
    bad = [v for v in values if v not in allowed]
    if bad:
        raise SpecError(f"graph transform {spec!r}: unknown {what} {bad[0]!r}",
                        f"use one of {', '.join(allowed)}")


@frozen
class TransformSpec:
    """A graph transform a plugin adds to both estimators' pipelines.

    :param name: unique across plugins; what ``meta["transforms"]`` and reports record.
    :param factory: ``(context) -> transform | None``, called once per estimate (per layout
        and hardware) where the spec applies; None when the transform has nothing to do for
        that context. The transform follows :class:`Transform`: ``name`` and
        ``apply(graph, ctx) -> OpGraph``, never mutating its input.
    :param point: where it runs, one of :data:`POINTS`.
    :param platforms: the kernel platforms (:data:`PLATFORMS`) whose hardware it runs for;
        empty: every platform.
    :param phases: the graph phases it is applied to (``prefill``, ``decode``,
        ``train_forward``, ``train_backward``); empty: every phase. Other phases' graphs pass
        through unchanged.
    :param order: transforms of one point run in ascending ``order``, then by name.
    """

    name: str
    factory: Callable[[TransformContext], Transform | None]
    point: str = field(default="after_fusion")
    platforms: tuple[str, ...] = field(default=(), converter=tuple)
    phases: tuple[str, ...] = field(default=(), converter=tuple)
    order: int = 0
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.name:
            raise SpecError("graph transform without a name", "give the TransformSpec a name")
        if self.point not in POINTS:
            raise SpecError(f"graph transform {self.name!r}: unknown point {self.point!r}",
                            f"use one of {', '.join(POINTS)}")
        _check_names(self.name, self.platforms, PLATFORMS, "platform")
        _check_names(self.name, self.phases, Phase.CAPTURED, "phase")

    def applies_to(self, ctx: TransformContext) -> bool:
        """Whether the spec runs for this context's platform (phases are checked per graph)."""
        return not self.platforms or ctx.platform in self.platforms


@frozen
class PhaseScoped:
    """``transform`` applied to the graphs of ``phases`` only; others pass unchanged."""

    transform: Transform
    phases: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.transform.name

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        if graph.phase not in self.phases:
            return graph
        return self.transform.apply(graph, ctx)


def plugin_transforms(ctx: TransformContext, point: str) -> list[Transform]:
    """The contributed transforms (``zrt_graph_transforms``) that run at ``point`` for
    ``ctx``, in order: those whose platforms include ``ctx.platform``, built by their
    factories (a None result is left out), scoped to their phases.

    :raises SpecError: ``point`` is not one of :data:`POINTS`.
    :raises PluginError: a factory fails or returns something without ``apply``; the
        message names the transform and its distribution.
    """
    from zrt_core.errors import PluginError, ZrtError

    if point not in POINTS:
        raise SpecError(f"unknown transform point {point!r}", f"use one of {', '.join(POINTS)}")
    registry = ctx.host.graph_transforms
    specs = sorted((s for s in registry if s.point == point and s.applies_to(ctx)),
                   key=lambda s: (s.order, s.name))
    out: list[Transform] = []
    for spec in specs:
        who = f"graph transform {spec.name!r} ({registry.distribution_of(spec.name)})"
        try:
            transform = spec.factory(ctx)
        except ZrtError:
            raise
        except Exception as exc:
            raise PluginError(f"{who} failed to build: {type(exc).__name__}: {exc}",
                              "fix the plugin, or disable it with ZRT_DISABLE_PLUGINS") from exc
        if transform is None:
            continue
        if not callable(getattr(transform, "apply", None)) or not getattr(transform, "name",
                                                                          None):
            raise PluginError(f"{who}: its factory returned a {type(transform).__name__}, "
                              "not a transform", "return an object with name and apply(graph, "
                              "ctx), or None")
        out.append(PhaseScoped(transform, spec.phases) if spec.phases else transform)
    return out


def around_fusion(ctx: TransformContext, fusion: Transform | None) -> list[Transform]:
    """The fusion pass with the contributed transforms of both points around it: what the
    estimators run between sharding and their own rewrites."""
    return [*plugin_transforms(ctx, "before_fusion"),
            *([fusion] if fusion is not None else []),
            *plugin_transforms(ctx, "after_fusion")]


def apply_all(graph: OpGraph, transforms: Iterable[Transform], ctx: TransformContext
              ) -> OpGraph:
    """Run transforms in order, appending each name to ``meta["transforms"]``."""
    for t in transforms:
        graph = t.apply(graph, ctx)
        applied = (*graph.meta.get("transforms", ()), t.name)
        graph = evolve(graph, meta={**graph.meta, "transforms": applied})
    return graph
