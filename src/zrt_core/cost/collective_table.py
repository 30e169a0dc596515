"""Which algorithm each collective of a priced graph takes, summed per group and kind: the
table the training report shows (docs/collectives.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from zrt_core.ir.graph import Category

if TYPE_CHECKING:
    from zrt_core.cost.backend import NodeCost
    from zrt_core.ir.graph import OpGraph


def collective_table(phases: Iterable[tuple[str, OpGraph, Mapping[int, NodeCost]]]
                     ) -> dict[str, dict[str, Any]]:
    """``"phase/group/kind"`` → the collectives of one micro-batch over the whole model (every
    layer, every pipeline stage): ``calls``, ``bytes`` and ``time_s`` summed, ``group_size``,
    ``algorithms`` (calls per algorithm the tuner picked) and ``algorithm`` (the one most
    calls took). Groups of one rank (nothing to exchange) are left out.

    :param phases: ``(name, graph, node costs by id)`` for each priced graph.
    """
    out: dict[str, dict[str, Any]] = {}
    for phase, graph, costs in phases:
        for node in graph.nodes:
            kind = node.attrs.get("collective")
            if node.category != Category.COLLECTIVE and kind is None:
                continue
            cost = costs.get(node.id)
            size = int(node.attrs.get("group_size") or 1)
            if cost is None or size < 2:
                continue
            calls = graph.multiplicity(node)
            key = f"{phase}/{node.attrs.get('group')}/{kind or node.op}"
            entry = out.setdefault(key, {"group_size": size, "calls": 0, "bytes": 0.0,
                                         "time_s": 0.0, "algorithms": {}})
            entry["calls"] += calls
            entry["bytes"] += float(node.attrs.get("bytes") or 0) * calls
            entry["time_s"] += cost.time_s * calls
            algorithm = str(cost.detail.get("algorithm", cost.rule))
            entry["algorithms"][algorithm] = entry["algorithms"].get(algorithm, 0) + calls
    for entry in out.values():
        algorithms = entry["algorithms"]
        entry["algorithm"] = max(sorted(algorithms), key=algorithms.__getitem__)
    return out
