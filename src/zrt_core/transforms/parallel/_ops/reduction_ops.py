"""Sharding rule of reductions (sum, mean, max, softmax's reductions, topk, sort, cumsum)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import _rule_broadcast
from zrt_core.transforms.parallel.layout import PARALLEL_GROUPS, Layout, _layout
from zrt_core.transforms.parallel.op_families import op_base

if TYPE_CHECKING:
    pass


def _rule_reduce(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Reductions over ``dim``: reduced axes lose their factors; a sum over an axis split
    by a parallel group is a partial sum over that group."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, lay = metas[0], ins[0]
    nd = len(src.shape)
    base = op_base(node.op)
    dims = node.attrs.get("dim")
    if dims is None:
        dims = tuple(range(nd)) if base not in ("topk", "sort", "cumsum") else (-1,)
    if isinstance(dims, int):
        dims = (dims,)
    reduced = {int(d) % nd for d in dims} if nd else set()
    if base == "nll_loss_forward":
        reduced = set(range(nd))
    partial = set(lay.partial)
    if base in ("sum", "mean", "nll_loss_forward", "norm", "linalg_vector_norm", "logsumexp"):
        for i in reduced:
            partial |= {g for g in lay.groups(i) if g in PARALLEL_GROUPS}
    outs = []
    for out in node.outputs:
        if base in ("cumsum", "sort") and len(out.shape) == nd:
            # the axis keeps its entries (OPT's positions: a cumsum over the mask's keys)
            outs.append(_layout(out.shape, lay.axes, partial))
            continue
        if len(out.shape) == nd:
            axes = [() if i in reduced else a for i, a in enumerate(lay.axes)]
            # topk keeps the axis (k entries): no factors on it
        else:
            axes = [a for i, a in enumerate(lay.axes) if i not in reduced]
            if len(axes) != len(out.shape):
                axes = [()] * len(out.shape)
        outs.append(_layout(out.shape, axes, partial))
    return outs
