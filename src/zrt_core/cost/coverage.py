"""Where predicted times came from: the share of executed ops and of predicted time priced
from exact table hits, interpolation between rows, or the roofline, and the biggest misses
(the ops the roofline priced, largest time first) for the next ``zrt profile`` run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zrt_core.cost.backend import PriceSource

#: misses listed in a report
TOP_MISSES = 10


def coverage(costed: Sequence[Any], top: int = TOP_MISSES) -> dict[str, Any]:
    """Coverage of one or more costed graphs (views and other free ops left out).

    :returns: ``ops`` and ``time``: source → fraction; ``misses``: the roofline-priced
        (op, dtype, shapes) with the largest predicted time, each with its share of time.
    """
    ops: dict[str, float] = {}
    time_by: dict[str, float] = {}
    misses: dict[tuple[Any, ...], list[float]] = {}
    for cg in costed:
        graph = cg.graph
        for node in graph.nodes:
            cost = cg.costs[node.id]
            if cost.source == PriceSource.FREE:
                continue
            m = graph.multiplicity(node)
            seconds = cost.time_s * m
            ops[cost.source] = ops.get(cost.source, 0.0) + m
            time_by[cost.source] = time_by.get(cost.source, 0.0) + seconds
            if cost.source == PriceSource.ROOFLINE:
                key = (node.op, node.inputs[0].dtype if node.inputs else "",
                       tuple(tuple(t.shape) for t in node.inputs))
                acc = misses.setdefault(key, [0.0, 0])
                acc[0] += seconds
                acc[1] += m
    n_ops = sum(ops.values())
    total = sum(time_by.values())
    wanted = (PriceSource.MEASURED, PriceSource.INTERPOLATED, PriceSource.ROOFLINE)
    biggest = sorted(misses.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "ops": {s: ops.get(s, 0.0) / n_ops if n_ops else 0.0 for s in wanted},
        "time": {s: time_by.get(s, 0.0) / total if total else 0.0 for s in wanted},
        "misses": [{"op": op, "dtype": dtype, "shapes": [list(s) for s in shapes],
                    "calls": int(calls), "predicted_s": seconds,
                    "share": seconds / total if total else 0.0}
                   for (op, dtype, shapes), (seconds, calls) in biggest],
    }
