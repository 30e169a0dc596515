"""Helpers shared by the training transforms (node ids, collective nodes, expert parameters)
and the weight-gradient marks on the backward graph.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    TensorMeta,
    dtype_bytes,
)

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel


#: ``attrs["grad"]`` of a backward GEMM computing a weight gradient (zero-bubble W pass) or
#: an input gradient (B pass); the scheduler reads the same mark.
WEIGHT_GRAD, INPUT_GRAD = "weight", "input"
#: ``attrs["recompute"]`` marks forward nodes re-run inside the backward graph.
RECOMPUTE_ATTR = "recompute"
#: ``attrs["quantize"]`` marks the cast (and amax / block-scale) kernels a precision recipe adds.
QUANTIZE_ATTR = "quantize"

_EXPERT_PARAM = re.compile(r"(^|\.)experts\.")
_FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})


# -- small helpers ------------------------------------------------------------------------------


def is_expert_param(name: str) -> bool:
    """A routed expert's weight (``...mlp.experts.gate_up_proj``), not a shared expert's."""
    return bool(_EXPERT_PARAM.search(name))


def _next_id(graph: OpGraph) -> int:
    return max((n.id for n in graph.nodes), default=-1) + 1


def _tensor_ids(graphs: Iterable[OpGraph]) -> int:
    """One past the largest tensor id in the graphs (new tensors are numbered from it)."""
    top = -1
    for g in graphs:
        # fused nodes' members too: their internal tensors have ids as well
        for n in (m for node in g.nodes for m in (node, *node.members)):
            for t in (*n.inputs, *n.outputs):
                if t.tensor_id is not None and t.tensor_id > top:
                    top = t.tensor_id
    return top + 1


def collective_node(
    node_id: int,
    kind: str,
    group: str,
    parallel: Parallel,
    message_bytes: float,
    *,
    phase: str,
    layer_index: int | None = None,
    layer_kind: str | None = None,
    module_path: str = "",
    overlap: str | None = None,
    dtype: str = "bfloat16",
    extra: Mapping[str, Any] | None = None,
    size_span: tuple[int, int] | None = None,
) -> OpNode:
    """A collective node as docs/architecture.md defines it: the group's size and span from
    ``Parallel.span`` (or ``size_span``: a sub-group of ``group``'s ranks, an HSDP shard or
    replica group); ``message_bytes`` per rank (the full buffer of an all-reduce, the
    gathered output of an all-gather, the input of a reduce-scatter)."""
    size, span = size_span if size_span is not None else parallel.span(group)
    elements = max(1, int(message_bytes // dtype_bytes(dtype)))
    attrs: dict[str, Any] = {"collective": kind, "group": group, "group_size": size,
                             "span": span, "bytes": float(message_bytes)}
    if overlap is not None:
        attrs["overlap"] = overlap
    if extra:
        attrs.update(extra)
    buffer = TensorMeta(shape=(elements,), dtype=dtype)
    return OpNode(id=node_id, op=f"comm.{kind}", category=Category.COLLECTIVE, phase=phase,
                  inputs=(buffer,), outputs=(buffer,), module_path=module_path,
                  layer_index=layer_index, layer_kind=layer_kind, formula="collective",
                  attrs=attrs)


# -- weight-gradient marks ----------------------------------------------------------------------


def mark_weight_grads(forward: OpGraph, backward: OpGraph) -> OpGraph:
    """Mark backward GEMMs ``attrs["grad"] = "weight"`` or ``"input"``.

    A backward GEMM that reads a parameter computes an input gradient (``dX = dY·Wᵀ``); one
    that reads none while its forward GEMM (same autograd sequence number) read a parameter
    of the shape it writes computes that parameter's gradient (``dW = Xᵀ·dY``; for grouped
    expert GEMMs ``[E, k, n]``). Zero-bubble schedules move the weight gradients off the
    critical path; the scheduler reads the same mark.
    """
    param_shapes: dict[int, list[tuple[int, ...]]] = {}
    for n in forward.nodes:
        if n.category != Category.MATMUL:
            continue
        seq = n.attrs.get("seq_nr")
        shapes = [t.shape for t in n.inputs if t.param is not None]
        if seq is not None and shapes:
            param_shapes.setdefault(seq, []).extend(shapes)
    nodes = []
    changed = False
    for n in backward.nodes:
        if n.category == Category.MATMUL and "grad" not in n.attrs \
                and not n.attrs.get(RECOMPUTE_ATTR):
            mark = None
            if any(t.param is not None for t in n.inputs):
                mark = INPUT_GRAD
            else:
                shapes = param_shapes.get(n.attrs.get("fwd_seq_nr"), ())
                out = n.outputs[0].shape if n.outputs else ()
                if any(out == s or out == tuple(reversed(s)) or
                       (len(s) == 3 and out == (s[0], s[2], s[1])) for s in shapes):
                    mark = WEIGHT_GRAD
                elif shapes:
                    mark = INPUT_GRAD
            if mark is not None:
                n = evolve(n, attrs={**n.attrs, "grad": mark})
                changed = True
        nodes.append(n)
    return backward.with_nodes(nodes, backward.edges) if changed else backward
