"""Context parallelism as a transform of its own (the sequence split over ``cp`` ranks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.parallel.transform import ParallelTransform

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


class ContextParallel(ParallelTransform):
    """CP alone (ring or Ulysses by ``ctx.parallel.cp_kind``)."""

    name = "cp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        only = evolve(p, tp=1, ep=1, etp=None, sp=False, dp=p.dp * p.tp)
        return super().apply(graph, evolve(ctx, parallel=only))
