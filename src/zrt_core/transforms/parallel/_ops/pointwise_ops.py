"""Sharding rules of elementwise ops: broadcasting, same-layout and shape-only (``*_like``) ops."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel.layout import Factors, Layout, _layout, _product
from zrt_core.transforms.parallel.op_families import op_base

if TYPE_CHECKING:
    pass


def _rule_fresh(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``*_like``: the input's per-rank shape, never its partial sums."""
    return [Layout(o.shape, o.axes) for o in _rule_broadcast(node, metas, ins)]


def _rule_same(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    if ins and len(node.outputs) == 1 and len(ins[0].shape) == len(node.outputs[0].shape):
        lay = ins[0]
        return [_layout(node.outputs[0].shape, lay.axes, lay.partial,
                        dict(enumerate(lay.shape)))]
    return [Layout.plain(t) for t in node.outputs]


def _rule_broadcast(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Elementwise and everything else: each output axis takes the factors of the inputs'
    right-aligned axes of the same size (broadcast axes carry none); the most-split input
    wins (a replicated operand is sliced locally, which costs nothing)."""
    tensors = [(m, lay) for m, lay in zip(metas, ins, strict=True) if m.shape]
    partial: set[str] = set()
    for _, lay in tensors:
        partial |= lay.partial
    outs = []
    for out in node.outputs:
        nd = len(out.shape)
        axes: list[Factors] = []
        for j in range(nd):
            best: Factors = ()
            best_ratio = Fraction(1)
            for m, lay in tensors:
                k = j - (nd - len(m.shape))
                if k < 0 or m.shape[k] != out.shape[j] or not lay.axes[k]:
                    continue
                ratio = _product(lay.axes[k])
                if not best or ratio < best_ratio:
                    best, best_ratio = lay.axes[k], ratio
            axes.append(best)
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_complex(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``view_as_complex`` drops the trailing pair axis, ``view_as_real`` adds one (Llama 4's
    rotary embedding); the other axes keep their factors."""
    lay, out = ins[0], node.outputs[0]
    axes = list(lay.axes[:-1]) if op_base(node.op) == "view_as_complex" else [*lay.axes, ()]
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]
