"""Sharding rules of view, reshape, permute, squeeze, select, slice, index, cat and stack."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import _rule_broadcast
from zrt_core.transforms.parallel.layout import (
    _TOKEN_GROUPS,
    Factors,
    Layout,
    _layout,
    _merge_factors,
    _product,
)
from zrt_core.transforms.parallel.op_families import op_base

if TYPE_CHECKING:
    pass


def _rule_positional(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                     ) -> list[Layout]:
    """Ops that keep the rank of their first input (split, slice, pad, repeat...): axis i
    of each output takes axis i's factors; a slice down to one element (the last token)
    leaves its axis whole."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, lay = metas[0], ins[0]
    base = op_base(node.op)
    outs = []
    for out in node.outputs:
        if base == "unbind":
            dim = int(node.attrs.get("dim", 0)) % len(src.shape)
            axes = [a for i, a in enumerate(lay.axes) if i != dim]
            outs.append(_layout(out.shape, axes, lay.partial))
            continue
        if len(out.shape) != len(src.shape):
            outs.append(Layout.plain(out))
            continue
        axes = []
        for i, factors in enumerate(lay.axes):
            if factors and out.shape[i] != src.shape[i]:
                ratio = _product(factors)
                scaled = out.shape[i] * ratio
                if out.shape[i] == 1 or (scaled < 1):
                    factors = ()
            axes.append(factors)
        outs.append(_layout(out.shape, axes, lay.partial))
    return outs


def _rule_index(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``self[idx₀, idx₁, ...]`` (advanced indexing of the leading axes): the output is the
    indices' broadcast shape, then ``self``'s remaining axes — a lookup table indexed by
    token ids (V4's hash-routing ``tid2eid[input_ids]``) has the tokens' batch, which
    right-aligned size matching cannot see."""
    out = node.outputs[0] if node.outputs else None
    if out is None or len(metas) < 2 or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, idx = metas[0], list(zip(metas[1:], ins[1:], strict=True))
    k = len(idx)
    nd = max(len(m.shape) for m, _ in idx)
    lead = tuple(out.shape[:nd])
    if len(out.shape) != nd + len(src.shape) - k or tuple(out.shape[nd:]) != \
            tuple(src.shape[k:]):
        return _rule_broadcast(node, metas, ins)
    axes: list[Factors] = []
    for j in range(nd):
        acc: Factors = ()
        for m, lay in idx:
            i = j - (nd - len(m.shape))
            if i >= 0 and m.shape[i] == lead[j]:
                acc = _merge_factors(acc, lay.axes[i])
        axes.append(acc)
    axes.extend(ins[0].axes[k:])
    partial: set[str] = set()
    for lay in ins:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial)]


def _rule_permute(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay = ins[0]
    nd = len(lay.axes)
    base = op_base(node.op)
    order = list(range(nd))
    if base == "t":
        if nd == 2:
            order = [1, 0]
    elif base in ("transpose", "swapaxes"):
        a = int(node.attrs.get("dim0", 0)) % nd
        b = int(node.attrs.get("dim1", 1)) % nd
        order[a], order[b] = order[b], order[a]
    elif base == "permute":
        order = [int(d) % nd for d in node.attrs.get("dims", order)]
    elif base == "movedim":
        return _rule_broadcast(node, metas, ins)
    axes = [lay.axes[i] for i in order]
    return [_layout(node.outputs[0].shape, axes, lay.partial)]


def _rule_unsqueeze(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay = ins[0]
    out = node.outputs[0]
    dim = int(node.attrs.get("dim", 0)) % len(out.shape)
    axes = list(lay.axes)
    axes.insert(dim, ())
    return [_layout(out.shape, axes, lay.partial)]


def _rule_squeeze(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """squeeze: the squeezed axes (``dim`` when given, else every size-1 axis of the
    captured input) drop out; a squeeze of one named axis keeps the others' factors, the
    batch of 1 of a batch-1 capture among them."""
    lay, src, out = ins[0], metas[0], node.outputs[0]
    if len(out.shape) == len(src.shape):
        return [_layout(out.shape, lay.axes, lay.partial)]
    dims = node.attrs.get("dim")
    if dims is not None and src.shape:
        named = {int(d) % len(src.shape) for d in (dims if isinstance(dims, tuple | list)
                                                   else (dims,))}
        axes = [a for i, a in enumerate(lay.axes) if not (i in named and src.shape[i] == 1)]
        if len(axes) == len(out.shape):
            return [_layout(out.shape, axes, lay.partial)]
    axes = [a for i, a in enumerate(lay.axes) if not (src.shape[i] == 1)]
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]


def _rule_select(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay, src, out = ins[0], metas[0], node.outputs[0]
    base = op_base(node.op)
    if base == "select":
        dim = int(node.attrs.get("dim", 0)) % max(len(src.shape), 1)
        axes = [a for i, a in enumerate(lay.axes) if i != dim]
    else:  # select_backward: the selected axis comes back, whole
        dim = int(node.attrs.get("dim", 0)) % max(len(out.shape), 1)
        axes = list(lay.axes)
        axes.insert(dim, ())
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]


def view_groups(a: Sequence[int], b: Sequence[int], *, ones_forward: bool = False
                ) -> list[tuple[list[int], list[int]]]:
    """Pair the axes of a reshape: groups of input axes whose product equals a group of
    output axes (``[1, 512, 4096] → [512, 4096]`` gives ``([0, 1], [0]), ([2], [1])``).
    Size-1 axes join the group before them (or after, at the start); with
    ``ones_forward`` the group after them when there is one (a batch of 1 is the major
    part of what it merges with: ``[h, 1, s, d] → [h, 1·s, d]``)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        ia, jb = [i], [j]
        pa, pb = a[i], b[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= na:
                    return []
                pa *= a[i]
                ia.append(i)
                i += 1
            else:
                if j >= nb:
                    return []
                pb *= b[j]
                jb.append(j)
                j += 1
        # absorb trailing size-1 axes into this group
        while i < na and a[i] == 1 and (j >= nb or b[j] != 1) and not (
                ones_forward and any(x != 1 for x in a[i:])):
            ia.append(i)
            i += 1
        while j < nb and b[j] == 1 and (i >= na or a[i] != 1) and not (
                ones_forward and any(x != 1 for x in b[j:])):
            jb.append(j)
            j += 1
        groups.append((ia, jb))
    while i < na:
        if groups:
            groups[-1][0].append(i)
        i += 1
    while j < nb:
        if groups:
            groups[-1][1].append(j)
        else:
            groups.append(([], [j]))
        j += 1
    return groups


def _rule_view(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Reshape: the factors of each group of input axes go to the group's output axes —
    heads and features (tp, ep, batch) to the outermost output axis they divide, tokens
    (sp, cp, seq) to the innermost, so ``[S] → [B, S]`` splits S, ``[H] → [heads, d]``
    splits the heads."""
    lay, src, out = ins[0], metas[0], node.outputs[0]
    if not any(lay.axes):
        return [_layout(out.shape, ((),) * len(out.shape), lay.partial)]
    if 0 in src.shape or 0 in out.shape:
        return [Layout.plain(out)]
    # a batch multiplier of a batch-1 capture sits on a size-1 axis, or lands on one
    batch = any(g == "batch" for factors in lay.axes for g, _ in factors)
    groups = view_groups(src.shape, out.shape, ones_forward=batch)
    if not groups:
        return _rule_broadcast(node, metas, ins)
    axes: list[list[tuple[str, Fraction]]] = [[] for _ in out.shape]
    for in_axes, out_axes in groups:
        if not out_axes:
            continue
        pairs: list[tuple[str, Fraction]] = []
        for i in in_axes:
            pairs.extend(lay.axes[i])
        if not pairs:
            continue
        if len(out_axes) == 1:
            axes[out_axes[0]].extend(pairs)
            continue
        # merge factors of one group, then place each on an output axis it divides
        merged: dict[str, Fraction] = {}
        for g, f in pairs:
            merged[g] = merged.get(g, Fraction(1)) * f
        for g, f in merged.items():
            order = list(reversed(out_axes)) if g in _TOKEN_GROUPS else list(out_axes)
            placed = False
            for j in order:
                current = out.shape[j] * _product(tuple(axes[j])) * f
                # a split needs an axis it divides; a multiplier (a larger batch) may
                # land on a size-1 axis (the batch of 1 that was captured)
                if current.denominator == 1 and current >= 1 and (out.shape[j] > 1 or f > 1):
                    axes[j].append((g, f))
                    placed = True
                    break
            if not placed:
                target = next((j for j in order if out.shape[j] > 1), order[0])
                axes[target].append((g, f))
    return [_layout(out.shape, [tuple(a) for a in axes], lay.partial)]


def _rule_cat(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """cat: the cat axis is the sum of the pieces' per-rank sizes; other axes take the
    pieces' factors (a piece with no layout of its own — a KV cache from another phase —
    adopts them)."""
    out = node.outputs[0]
    nd = len(out.shape)
    base = op_base(node.op)
    pieces = [(m, lay) for m, lay in zip(metas, ins, strict=True) if m.numel > 0 or
              len(m.shape) == nd]
    if base == "stack" and pieces:
        return _rule_stack(node, pieces)
    if not pieces:
        return _rule_broadcast(node, metas, ins)
    dim = int(node.attrs.get("dim", 0)) % nd
    axes: list[Factors] = []
    for j in range(nd):
        acc: Factors = ()
        for m, lay in pieces:
            if len(m.shape) == nd and (j == dim or m.shape[j] == out.shape[j]):
                acc = _merge_factors(acc, lay.axes[j]) if j != dim else acc
        axes.append(acc)
    total = 0
    cat_groups: list[str] = []
    for m, lay in pieces:
        if len(m.shape) != nd:
            continue
        total += lay.shape[dim]
        cat_groups.extend(g for g, _ in lay.axes[dim] if g not in cat_groups)
    sizes = {dim: total}
    if total != out.shape[dim] and out.shape[dim]:
        axes[dim] = ((cat_groups[0] if cat_groups else "seq",
                      Fraction(total, out.shape[dim])),)
    partial: set[str] = set()
    for _, lay in pieces:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial, sizes)]


def _rule_stack(node: OpNode, pieces: list[tuple[TensorMeta, Layout]]) -> list[Layout]:
    """stack: a new whole axis at ``dim``; the others take the pieces' factors in order
    (right-aligning the pieces with the output, as broadcasting does, put a batch factor
    on the axis after it: V4's ``rotate_half`` stacks ``[B, 1, S, d]`` halves)."""
    out = node.outputs[0]
    nd = len(out.shape)
    dim = int(node.attrs.get("dim", 0)) % max(nd, 1)
    axes: list[Factors] = []
    for j in range(nd - 1):
        acc: Factors = ()
        for m, lay in pieces:
            if len(m.shape) == nd - 1:
                acc = _merge_factors(acc, lay.axes[j])
        axes.append(acc)
    axes.insert(dim, ())
    partial: set[str] = set()
    for _, lay in pieces:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial)]
