"""Sequence parallelism as a transform of its own (TP with tokens split between the TP regions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.parallel.transform import ParallelTransform

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


class SequenceParallel(ParallelTransform):
    """TP with sequence parallelism forced on (norms and residuals on seq/tp)."""

    name = "sp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        return super().apply(graph, evolve(ctx, parallel=evolve(ctx.parallel, sp=True)))
