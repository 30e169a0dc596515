"""``ParallelTransform``: the one transform that applies a layout's TP, SP, CP and EP to each phase."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from zrt_core.ir.graph import (
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
)
from zrt_core.transforms.parallel.engine import replace_graph
from zrt_core.transforms.parallel.layout import Layout
from zrt_core.transforms.parallel.sharding import _ParallelPass
from zrt_core.transforms.parallel.tp_plan import TPPlan

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel
    from zrt_core.transforms.base import TransformContext


class ParallelTransform:
    """TP (+SP), CP and EP of ``ctx.parallel`` applied to one graph.

    :param plan: the tensor-parallel plan (None: module-name rules).
    :param state: tensor layouts shared across the phases of one capture (prefill before
        decode, forward before backward), so a decode graph's KV cache and a backward
        graph's saved activations keep the layouts their producing phase gave them. Use
        :func:`apply_phases` to run several phases with one state.
    :param roots: the view roots of gathered tensors, shared the same way: a backward
        graph re-gathers the saved views of one forward tensor once (TransformerEngine's
        fused QKV and FC1 linears re-gather their input once for the weight gradient).
    """

    name = "parallel"

    def __init__(self, plan: TPPlan | None = None, *,
                 state: dict[int, Layout] | None = None,
                 extra_seeds: ExtraSeeds | None = None,
                 extra_attrs: ExtraAttrs | None = None,
                 roots: dict[int, int] | None = None) -> None:
        self.plan = plan or TPPlan()
        self.state = state
        self.roots = roots
        self.extra_seeds = extra_seeds
        self.extra_attrs = extra_attrs

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        extra = self.extra_seeds(graph) if self.extra_seeds is not None else None
        attrs = self.extra_attrs(graph) if self.extra_attrs is not None else None
        if p.tp == 1 and p.cp == 1 and p.ep == 1 and p.expert_tp == 1 and extra is None \
                and not attrs:
            return _with_layout_meta(graph, p, ctx.training)
        out = _ParallelPass(graph, p, ctx.dims, self.plan, ctx.host.formulas
                            if ctx.host is not None else None, training=ctx.training,
                            state=self.state, extra=extra, attrs=attrs,
                            roots=self.roots).run()
        return _with_layout_meta(out, p, ctx.training)


#: Given a graph, a function of (tensor, reading node) giving ``{axis: (group, factor)}``
#: to apply to tensors no node produced, besides the parallel layout's own (a rescaled
#: batch or cache length, see :class:`zrt_core.estimate.serving.Rescale`); None for none.
ExtraSeeds = Callable[[OpGraph], Callable[[TensorMeta, OpNode],
                                          Mapping[int, tuple[str, Fraction]] | None] | None]
#: Given a graph, node attrs to move, ``{name: {captured value: new value}}`` (a rescaled
#: cache moves ``start_pos``); None for none.
ExtraAttrs = Callable[[OpGraph], Mapping[str, Mapping[Any, Any]] | None]


def _with_layout_meta(graph: OpGraph, p: Parallel, training: bool) -> OpGraph:
    meta = {**graph.meta, "parallel": p.to_json(),
            "sequence_parallel": p.sequence_parallel(training)}
    return replace_graph(graph, meta=meta)


def apply_phases(graphs: Mapping[str, OpGraph], ctx: TransformContext,
                 plan: TPPlan | None = None) -> dict[str, OpGraph]:
    """Apply :class:`ParallelTransform` to several phases of one capture with shared
    layouts, in capture order (prefill, decode, train_forward, train_backward)."""
    state: dict[int, Layout] = {}
    out = {}
    transform = ParallelTransform(plan, state=state, roots={})
    order = sorted(graphs, key=lambda ph: Phase.ALL.index(ph) if ph in Phase.ALL else 99)
    for phase in order:
        out[phase] = transform.apply(graphs[phase], ctx)
    return {ph: out[ph] for ph in graphs}
