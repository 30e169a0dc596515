"""Sharding rules of matmuls, attention and their gradients (the contracting axis leaves partial sums)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import _rule_broadcast
from zrt_core.transforms.parallel.layout import Layout, _layout
from zrt_core.transforms.parallel.op_families import op_base

if TYPE_CHECKING:
    pass


def _rule_conv_backward(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                        ) -> list[Layout]:
    """``convolution_backward(grad_out, input, weight)`` → the gradients of the input, the
    weight and the bias ``[c_out]`` (the weight's first axis), each laid out like its
    forward tensor."""
    if len(ins) < 3:
        return _rule_broadcast(node, metas, ins)
    like = (ins[1], ins[2])
    outs = []
    for k, out in enumerate(node.outputs):
        if k < 2 and len(out.shape) == len(like[k].axes):
            outs.append(_layout(out.shape, like[k].axes))
        elif k == 2 and len(out.shape) == 1 and ins[2].axes:
            outs.append(_layout(out.shape, [ins[2].axes[0]]))
        else:
            outs.append(Layout.plain(out))
    return outs


def _rule_matmul(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``[.., M, K] @ [.., K, N]``: M from the left, N from the right, batch axes from
    either; a contraction over an axis split by a parallel group on either side is a
    partial sum over it (the hooks gathered SP/CP-split contractions first)."""
    base = op_base(node.op)
    out = node.outputs[0]
    a_i, b_i = _matmul_operands(node, metas)
    if a_i is None:
        return _rule_broadcast(node, metas, ins)
    a, b = metas[a_i], metas[b_i]
    la, lb = ins[a_i], ins[b_i]
    partial = set(la.partial) | set(lb.partial)
    grouped = base in ("_grouped_mm", "_scaled_grouped_mm", "grouped_mm_fallback")
    if base == "linear":  # x [.., K] · w[N, K]ᵀ
        k_a, k_b = la.axes[-1], lb.axes[-1]
        axes = [*list(la.axes[:-1]), lb.axes[0]]
    elif grouped and len(a.shape) == 2 and len(b.shape) == 2:
        # dW of grouped experts: [K, M] x [M, N] -> [G, K, N], groups along M (rows)
        k_a, k_b = (), ()
        axes = [(), la.axes[0], lb.axes[1]]
    elif grouped and len(a.shape) == 2 and len(b.shape) == 3:
        k_a, k_b = la.axes[1], lb.axes[1]
        axes = [la.axes[0], lb.axes[2]]
    else:
        k_a, k_b = la.axes[-1], lb.axes[-2] if len(b.shape) >= 2 else lb.axes[-1]
        batch_nd = len(out.shape) - 2
        axes = []
        for j in range(batch_nd):
            ka = j - (batch_nd - (len(a.shape) - 2))
            kb = j - (batch_nd - (len(b.shape) - 2))
            fa = la.axes[ka] if ka >= 0 else ()
            fb = lb.axes[kb] if kb >= 0 else ()
            axes.append(fa if len(fa) >= len(fb) else fb)
        axes.append(la.axes[-2] if len(a.shape) >= 2 else ())
        axes.append(lb.axes[-1] if len(b.shape) >= 2 else ())
    for g, _ in (*k_a, *k_b):
        if g in ("tp", "etp", "ep"):
            partial.add(g)
        elif g in ("sp", "cp") and {x for x, _ in k_a} & {x for x, _ in k_b} & {g}:
            partial.add("tp" if g == "sp" else g)
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, partial)] + [Layout.plain(t) for t in node.outputs[1:]]


def _matmul_operands(node: OpNode, metas: list[TensorMeta]) -> tuple[int | None, int | None]:
    base = op_base(node.op)
    shaped = [i for i, m in enumerate(metas) if len(m.shape) >= 2]
    if base in ("addmm", "baddbmm"):
        shaped = [i for i in shaped if i > 0] or shaped
        if len(metas) >= 3:
            return 1, 2
    if base == "linear":
        return (0, 1) if len(metas) >= 2 else (None, None)
    if len(shaped) >= 2:
        return shaped[0], shaped[1]
    return None, None


def _rule_attention(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                    ) -> list[Layout]:
    """Attention ``q [b, h, s_q, d], k/v [b, h_kv, s_kv, d]`` → ``o [b, s_q, h, d_v]`` and
    ``lse [b, h, s_q]``; backward gives dq, dk, dv like q, k, v. Keys split over CP
    without the queries (decode against a split cache) leave a partial output."""
    base = op_base(node.op)
    first = 1 if base == "attention_backward" else 0
    if len(metas) < first + 3 or any(len(m.shape) != 4 for m in metas[first:first + 3]):
        return _rule_broadcast(node, metas, ins)
    lq, lk, lv = ins[first:first + 3]
    partial = set(lq.partial) | set(lk.partial) | set(lv.partial)
    if "cp" in lk.groups(2) and "cp" not in lq.groups(2):
        partial.add("cp")
    outs = []
    if first:  # backward: dq, dk, dv, then extras
        for k, out in enumerate(node.outputs):
            src = ins[first + k] if k < 3 else None
            if src is not None and len(out.shape) == 4:
                outs.append(_layout(out.shape, src.axes))
            else:
                outs.append(Layout.plain(out))
        return outs
    for out in node.outputs:
        if len(out.shape) == 4:  # [b, s_q, h, d_v]
            axes = [lq.axes[0], lq.axes[2], lq.axes[1], lv.axes[3]]
        elif len(out.shape) == 3:  # lse [b, h, s_q]
            axes = [lq.axes[0], lq.axes[1], lq.axes[2]]
        else:
            outs.append(Layout.plain(out))
            continue
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_query_attention(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                          ) -> list[Layout]:
    """A plugin's attention kernel: outputs follow the query ``[b, h, s_q, d]`` (input 0)
    alone — ``[b, s_q, h, d]`` and ``[b, h, s_q]`` — whatever the keys look like (a latent
    cache, window and compressed entries, top-k indices)."""
    if not ins or len(metas[0].shape) != 4:
        return _rule_broadcast(node, metas, ins)
    lq = ins[0]
    partial: set[str] = set()
    for lay in ins:
        partial |= lay.partial
    outs = []
    for out in node.outputs:
        if len(out.shape) == 4:
            axes = [lq.axes[0], lq.axes[2], lq.axes[1], ()]
        elif len(out.shape) == 3:
            axes = [lq.axes[0], lq.axes[1], lq.axes[2]]
        else:
            outs.append(Layout.plain(out))
            continue
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_leading(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Row-wise kernels: each output's leading axes follow input 0's axes but its last (the
    rows: batch, tokens); the outputs' own trailing axes stay whole."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    lead = ins[0].axes[:-1]
    outs = []
    for out in node.outputs:
        axes = [lead[j] if j < len(lead) else () for j in range(len(out.shape))]
        outs.append(_layout(out.shape, axes, ins[0].partial))
    return outs


def _rule_gradients(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                    ) -> list[Layout]:
    """A plugin kernel's backward: each output (a gradient) takes the layout of the last
    input of its captured shape (the forward input it is the gradient of)."""
    outs = []
    for out in node.outputs:
        match = None
        for m, lay in zip(metas, ins, strict=True):
            if m.shape == out.shape:
                match = lay
        outs.append(_layout(out.shape, match.axes) if match is not None
                    else Layout.plain(out))
    return outs
