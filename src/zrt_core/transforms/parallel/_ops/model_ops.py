"""Sharding rules of model-specific ops: embedding, the MoE dispatch/combine, SSM scans, the
sparse-attention indexer.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import _rule_broadcast
from zrt_core.transforms.parallel.layout import PARALLEL_GROUPS, Factors, Layout, _layout, _without
from zrt_core.transforms.parallel.op_families import op_base

if TYPE_CHECKING:
    pass


def _rule_ssm(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Mamba-2's kernels, split by heads as Megatron and vLLM split them:
    ``ssd_chunk_scan(x [b, s, h, p], dt, A, B [b, s, g, n], ...)`` → ``y`` like ``x`` and
    the final states ``[b, h, p, n]``; ``ssm_state_update(state [b, h, p, n], x [b, h, p],
    ...)`` → ``y`` like ``x`` (the state takes ``x``'s split: :meth:`ShapePass.run`)."""
    base = op_base(node.op)
    xi = 0 if base == "ssd_chunk_scan" else 1
    if len(ins) <= xi or len(metas[xi].shape) != (4 if xi == 0 else 3):
        return _rule_broadcast(node, metas, ins)
    lx = ins[xi]
    outs = []
    for k, out in enumerate(node.outputs):
        if k == 0 and len(out.shape) == len(lx.axes):  # y
            outs.append(_layout(out.shape, lx.axes, lx.partial))
        elif k == 1 and xi == 0 and len(out.shape) == 4:  # final states [b, h, p, n]
            outs.append(_layout(out.shape, [lx.axes[0], lx.axes[2], lx.axes[3], ()]))
        else:
            outs.append(Layout.plain(out))
    return outs


def _rule_delta(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Gated DeltaNet's kernels, split by heads as Megatron and vLLM split them:
    ``gated_delta_chunk`` / ``gated_delta_recurrent(q, k [b, s, h_k, d_k], v [b, s, h_v,
    d_v], g, beta, ...)`` → ``o`` like ``v`` and the state ``[b, h_v, d_k, d_v]`` with
    ``v``'s batch and heads."""
    if len(ins) < 3 or len(metas[2].shape) != 4:
        return _rule_broadcast(node, metas, ins)
    lv = ins[2]
    outs = []
    for k, out in enumerate(node.outputs):
        if k == 0 and len(out.shape) == 4:  # o
            outs.append(_layout(out.shape, lv.axes, lv.partial))
        elif k == 1 and len(out.shape) == 4:  # the final / new state
            outs.append(_layout(out.shape, [lv.axes[0], lv.axes[2], (), ()]))
        else:
            outs.append(Layout.plain(out))
    return outs


def _rule_indexer(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """A top-k selection kernel ``(q [b, s_q, ...], keys [b, t, ...], ...) → indices
    [b, s_q, k]`` with ``k = min(attrs["topk"], t)`` (DSA's and CSA's lightning indexers):
    batch and queries follow the query, ``k`` the keys' rows — a capture with fewer keys
    than ``topk`` picks them all, and so does its rescale to a longer cache, up to
    ``topk``."""
    if len(metas) < 2 or len(metas[0].shape) < 2 or len(metas[1].shape) < 2:
        return _rule_broadcast(node, metas, ins)
    lq, lk = ins[0], ins[1]
    topk = int(node.attrs.get("topk") or 0)
    outs = []
    for out in node.outputs:
        nd = len(out.shape)
        if nd < 3:
            outs.append(Layout.plain(out))
            continue
        axes: list[Factors] = [lq.axes[0], lq.axes[1]] + [()] * (nd - 2)
        sizes: dict[int, int] = {}
        if topk > 0 and out.shape[-1]:
            k = min(topk, lk.shape[1])
            if k != out.shape[-1]:
                axes[-1] = (("kv", Fraction(k, out.shape[-1])),)
                sizes[nd - 1] = k
        outs.append(_layout(out.shape, axes, (), sizes))
    return outs


def _rule_embedding(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``embedding(weight [V, H], idx [...]) → [..., H]``: a vocabulary split leaves a
    partial sum (each rank looks up the rows it holds)."""
    if len(ins) < 2:
        return _rule_broadcast(node, metas, ins)
    lw, li = ins[0], ins[1]
    out = node.outputs[0]
    axes = [*list(li.axes), lw.axes[1] if len(lw.axes) > 1 else ()]
    partial = {g for g in lw.groups(0) if g in PARALLEL_GROUPS} | set(li.partial)
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, partial)]


def _rule_moe(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """MoE permutation ops. dispatch: ``x [T, H], idx [T, k] → rows [T·k, H], row_token,
    row_expert``; combine: ``rows [T·k, H], row_token, w [T, k] → [T, H]``. Rows follow
    the tokens (the EP hook divides them when ranks share tokens)."""
    base = op_base(node.op)
    outs = []
    if base == "moe_dispatch":
        lx = ins[0]
        for out in node.outputs:
            axes = [lx.axes[0]] + ([lx.axes[1]] if len(out.shape) == 2 else [])
            outs.append(_layout(out.shape, axes[:len(out.shape)]))
        return outs
    if base == "moe_combine":  # tokens follow the rows (rows/k), not the EP row split
        lr = ins[0]
        out = node.outputs[0]
        axes = [_without(lr.axes[0], "ep"), lr.axes[1] if len(lr.axes) > 1 else ()]
        return [_layout(out.shape, axes[:len(out.shape)], lr.partial)]
    if base == "moe_dispatch_backward":  # (grad_rows [T·k, H], row_token) -> [T, H]
        lg = ins[0]
        out = node.outputs[0]
        axes = [_without(lg.axes[0], "ep"), lg.axes[1] if len(lg.axes) > 1 else ()]
        return [_layout(out.shape, axes[:len(out.shape)], lg.partial)]
    # moe_combine_backward: (grad_out [T, H], rows [T·k, H], row_token, w [T, k])
    lrows = ins[1] if len(ins) > 1 else ins[0]
    lw = ins[3] if len(ins) > 3 else ins[0]
    for k, out in enumerate(node.outputs):
        src = lrows if k == 0 else lw
        outs.append(_layout(out.shape, src.axes[:len(out.shape)]
                            if len(src.axes) == len(out.shape) else [()] * len(out.shape)))
    return outs
