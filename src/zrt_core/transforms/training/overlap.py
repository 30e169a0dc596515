"""Communication overlap hints of the tensor-parallel collectives in the backward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.ir.graph import (
    Category,
    OpGraph,
)

if TYPE_CHECKING:
    from zrt_core.schedule.scheduler import OverlapRules


# -- communication overlap -------------------------------------------------------------------


def tp_overlap_hints(backward: OpGraph, forward: OpGraph, rules: OverlapRules) -> OpGraph:
    """How TransformerEngine overlaps the backward's TP/SP collectives when
    ``--tp-comm-overlap`` is on (``rules.tp_comm_overlap > 0``): the all-gather of an output
    gradient is chunked with the GEMM that reads it (``"consumer"``), a reduce-scatter or
    all-reduce of an input gradient with the GEMM that makes it (``"producer"``), and the
    all-gather of a saved activation for a weight-gradient GEMM runs in bulk beside the
    input-gradient GEMM (``"async"``). Collectives that already carry a hint keep it;
    without TP overlap the scheduler's defaults apply (Megatron's async backward all-reduce).
    """
    if rules.tp_comm_overlap <= 0:
        return backward
    forward_ids = {t.tensor_id for n in forward.nodes for m in (n, *n.fused_from)
                   for t in (*m.inputs, *m.outputs) if t.tensor_id is not None}
    nodes = []
    changed = False
    for n in backward.nodes:
        if n.category == Category.COLLECTIVE and n.attrs.get("group") in ("tp", "etp") \
                and "overlap" not in n.attrs:
            kind = n.attrs.get("collective")
            if kind == "all_gather":
                saved = any(t.tensor_id in forward_ids for t in n.inputs)
                hint = "async" if saved else "consumer"
            elif kind in ("reduce_scatter", "all_reduce"):
                hint = "producer"
            else:
                hint = None
            if hint is not None:
                n = evolve(n, attrs={**n.attrs, "overlap": hint})
                changed = True
        nodes.append(n)
    return backward.with_nodes(nodes, backward.edges) if changed else backward
