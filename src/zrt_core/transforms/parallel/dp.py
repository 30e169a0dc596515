"""Data parallelism: replicas of a stage graph."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.parallel.engine import replace_graph

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


class DataParallelReplicas:
    """Serving replicas: the graph is what one replica runs; ``meta["dp"]`` records how
    many run side by side (throughput multiplies, latency does not). Gradient
    synchronisation for training is the training transforms' (ZeRO, DP all-reduce)."""

    name = "dp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        return replace_graph(graph, meta={**graph.meta, "dp": ctx.parallel.dp})
