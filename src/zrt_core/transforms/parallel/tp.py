"""Tensor parallelism as a transform of its own (``ParallelTransform`` with only ``tp``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.parallel.transform import ParallelTransform

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


class TensorParallel(ParallelTransform):
    """TP (and SP when the layout asks for it) alone: ``ctx.parallel`` with cp = ep = 1."""

    name = "tp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        only = evolve(ctx.parallel, cp=1, ep=1, dp=ctx.parallel.dp * ctx.parallel.cp)
        return super().apply(graph, evolve(ctx, parallel=only))
