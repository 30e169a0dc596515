"""The aten operators the analytic models call, each with its derivative.

Every function records the forward operator on a :class:`~zrt_core.analytic.trace.Tracer`
with the shapes, dtypes and attributes the capture records for it, and (in a training
forward) the rule its backward follows, after PyTorch's ``derivatives.yaml`` and in the
order the autograd engine emits the operators (the capture of HuggingFace models is the
reference the tests hold these to).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zrt_core.analytic.trace import Fn, T, Tracer, broadcast, transposed

INT64_MAX = 9223372036854775807
F32 = "float32"


# -- views ---------------------------------------------------------------------------------


def view(tr: Tracer, x: T, shape: Sequence[int], size: Sequence[int] | None = None) -> T:
    """``aten.view`` (``size`` is what the model passed, ``-1`` included)."""
    out = tr.view_of(x, shape)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [grad_view(tr, g[0], fn.inputs[0].shape)]

    tr.call("aten.view", [x], [out], {"size": tuple(size or shape)}, backward=bwd)
    return out


def grad_view(tr: Tracer, g: T, shape: Sequence[int]) -> T:
    """The gradient of a view: a view back, or clone + ``_unsafe_view`` when the gradient
    is not contiguous (``reshape``)."""
    if not g.contiguous:
        c = tr.like(g)
        tr.call("aten.clone", [g], [c])
        out = tr.like(g, shape)
        tr.call("aten._unsafe_view", [c], [out], {"size": tuple(shape)})
        return out
    out = tr.view_of(g, shape)
    tr.call("aten.view", [g], [out], {"size": tuple(shape)})
    return out


def unsafe_view(tr: Tracer, x: T, shape: Sequence[int]) -> T:
    out = tr.like(x, shape)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [grad_view(tr, g[0], fn.inputs[0].shape)]

    tr.call("aten._unsafe_view", [x], [out], {"size": tuple(shape)}, backward=bwd)
    return out


def t(tr: Tracer, x: T) -> T:
    out = tr.view_of(x, tuple(reversed(x.shape)))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [plain_t(tr, g[0])]

    tr.call("aten.t", [x], [out], backward=bwd)
    return out


def plain_t(tr: Tracer, x: T) -> T:
    out = tr.view_of(x, tuple(reversed(x.shape)))
    tr.call("aten.t", [x], [out])
    return out


def transpose(tr: Tracer, x: T, d0: int, d1: int, attrs: dict[str, Any] | None = None
              ) -> T:
    out = tr.view_of(x, transposed(x.shape, d0, d1), contiguous=False)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [plain_transpose(tr, g[0], d0, d1, fn.attrs.get("group_rows"))]

    tr.call("aten.transpose", [x], [out], {"dim0": d0, "dim1": d1, **(attrs or {})},
            backward=bwd)
    return out


def plain_transpose(tr: Tracer, x: T, d0: int, d1: int, group_rows: Any = None) -> T:
    out = tr.view_of(x, transposed(x.shape, d0, d1), contiguous=not x.contiguous)
    attrs: dict[str, Any] = {"dim0": d0, "dim1": d1}
    if group_rows is not None:
        attrs["group_rows"] = group_rows
    tr.call("aten.transpose", [x], [out], attrs)
    return out


def unsqueeze(tr: Tracer, x: T, dim: int) -> T:
    shape = list(x.shape)
    shape.insert(dim % (len(shape) + 1), 1)
    out = tr.view_of(x, shape)
    tr.call("aten.unsqueeze", [x], [out], {"dim": dim})
    return out


def slice_(tr: Tracer, x: T, dim: int, start: int, end: int) -> T:
    size = x.shape[dim]
    lo = start + size if start < 0 else start
    hi = min(end, size)
    shape = list(x.shape)
    shape[dim] = hi - lo
    out = tr.view_of(x, shape)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        res = tr.like(g[0], fn.inputs[0].shape)
        tr.call("aten.slice_backward", [g[0]], [res],
                {"input_sizes": fn.inputs[0].shape, "dim": dim, "start": start, "end": end,
                 "step": 1})
        return [res]

    tr.call("aten.slice", [x], [out], {"dim": dim, "start": start, "end": end},
            backward=bwd)
    return out


def plain_slice(tr: Tracer, x: T, dim: int, start: int, end: int) -> T:
    size = x.shape[dim]
    lo = max(0, start + size) if start < 0 else start
    shape = list(x.shape)
    shape[dim] = min(end, size) - lo
    out = tr.view_of(x, shape)
    tr.call("aten.slice", [x], [out], {"dim": dim, "start": start, "end": end})
    return out


def alias(tr: Tracer, x: T) -> T:
    out = tr.view_of(x, x.shape)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [g[0]]

    tr.call("aten.alias", [x], [out], backward=bwd)
    return out


def detach(tr: Tracer, x: T) -> T:
    out = tr.view_of(x, x.shape)
    out.param = None
    out.detached = True
    tr.call("aten.detach", [x], [out])
    return out


def split(tr: Tracer, x: T, size: int, dim: int) -> list[T]:
    n = x.shape[dim] // size
    outs = []
    for _ in range(n):
        shape = list(x.shape)
        shape[dim] = size
        outs.append(tr.view_of(x, shape))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        parts = [gi if gi is not None else _zeros_like(tr, o)
                 for gi, o in zip(g, fn.outputs, strict=True)]
        out = tr.like(parts[0], fn.inputs[0].shape)
        tr.call("aten.cat", parts, [out], {"dim": dim % len(fn.inputs[0].shape)})
        return [out]

    tr.call("aten.split", [x], outs, {"split_size": size, "dim": dim}, backward=bwd)
    return outs


def _zeros_like(tr: Tracer, like: T) -> T:
    out = tr.like(like)
    tr.call("aten.zeros", [], [out], {"size": like.shape, "dtype": like.dtype})
    return out


# -- elementwise -----------------------------------------------------------------------------


def _reduce_to(tr: Tracer, g: T, shape: Sequence[int]) -> T:
    """Sum a broadcast gradient back to ``shape`` (``sum`` keepdim, then a view)."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = len(g.shape) - len(shape)
    padded = (1,) * lead + tuple(shape)
    dims = tuple(i for i, (a, b) in enumerate(zip(g.shape, padded, strict=True))
                 if b == 1 and a != 1)
    summed_shape = tuple(1 if i in dims else d for i, d in enumerate(g.shape))
    s = tr.like(g, summed_shape)
    tr.call("aten.sum", [g], [s], {"dim": dims, "keepdim": True})
    if lead:
        out = tr.view_of(s, shape)
        tr.call("aten.view", [s], [out], {"size": tuple(shape)})
        return out
    return s


def promote(a: str, b: str) -> str:
    """The result dtype of a binary op on two float tensors (float32 wins)."""
    if a == b:
        return a
    return F32 if F32 in (a, b) else a


def mul(tr: Tracer, a: T, b: T) -> T:
    out = tr.like(a, broadcast(a.shape, b.shape), promote(a.dtype, b.dtype))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        x, y = fn.inputs
        gy = gx = None
        if y.requires_grad:
            gy = tr.like(g[0])
            tr.call("aten.mul", [g[0], x], [gy])
        if x.requires_grad:
            gx = tr.like(g[0])
            tr.call("aten.mul", [g[0], y], [gx])
        if gy is not None:
            gy = _reduce_to(tr, gy, y.shape)
        if gx is not None:
            gx = _reduce_to(tr, gx, x.shape)
        return [gx, gy]

    tr.call("aten.mul", [a, b], [out], backward=bwd)
    return out


def mul_scalar_tensor(tr: Tracer, a: T, value: float) -> T:
    """``x * 0.5``: ``aten.mul.Tensor`` with a Python number (one tensor input)."""
    out = tr.like(a)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        r = tr.like(g[0])
        tr.call("aten.mul", [g[0]], [r])
        return [r]

    tr.call("aten.mul", [a], [out], backward=bwd)
    return out


def add(tr: Tracer, a: T, b: T) -> T:
    out = tr.like(a, broadcast(a.shape, b.shape), promote(a.dtype, b.dtype))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        x, y = fn.inputs
        return [_reduce_to(tr, g[0], x.shape) if x.requires_grad else None,
                _reduce_to(tr, g[0], y.shape) if y.requires_grad else None]

    tr.call("aten.add", [a, b], [out], backward=bwd)
    return out


def add_scalar(tr: Tracer, a: T) -> T:
    """``x + eps`` / ``1.0 + x``: ``aten.add.Tensor`` with one tensor input."""
    out = tr.like(a)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        return [g[0]]

    tr.call("aten.add", [a], [out], backward=bwd)
    return out


def to_copy(tr: Tracer, x: T, dtype: str) -> T:
    """``x.to(dtype)``: nothing when it already has that dtype."""
    if x.dtype == dtype:
        return x
    out = tr.like(x, dtype=dtype)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        src = fn.inputs[0].dtype
        r = tr.like(g[0], dtype=src)
        tr.call("aten._to_copy", [g[0]], [r], {"dtype": src})
        return [r]

    tr.call("aten._to_copy", [x], [out], {"dtype": dtype}, backward=bwd)
    return out


def pow_(tr: Tracer, x: T, exponent: float | int) -> T:
    out = tr.like(x)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        e = exponent
        p = tr.like(fn.inputs[0])
        tr.call("aten.pow", [fn.inputs[0]], [p], {"exponent": float(e - 1)})
        m = tr.like(p)
        tr.call("aten.mul", [p], [m], {"other": float(e)}, overload="Scalar")
        r = tr.like(g[0])
        tr.call("aten.mul", [g[0], m], [r])
        return [r]

    tr.call("aten.pow", [x], [out], {"exponent": exponent}, backward=bwd)
    return out


def mean_last(tr: Tracer, x: T) -> T:
    shape = (*x.shape[:-1], 1)
    out = tr.like(x, shape)
    n = x.shape[-1]

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        e = tr.view_of(g[0], fn.inputs[0].shape)
        tr.call("aten.expand", [g[0]], [e], {"size": fn.inputs[0].shape})
        r = tr.like(g[0], fn.inputs[0].shape)
        tr.call("aten.div", [e], [r], {"other": n})
        return [r]

    tr.call("aten.mean", [x], [out], {"dim": (-1,), "keepdim": True}, backward=bwd)
    return out


def rsqrt(tr: Tracer, x: T) -> T:
    out = tr.like(x)
    saved: dict[str, Any] = {}

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        d = detach(tr, fn.saved["out"])
        p = tr.like(d)
        tr.call("aten.pow", [d], [p], {"exponent": 3})
        m = tr.like(g[0])
        tr.call("aten.mul", [g[0]], [m], {"other": -0.5}, overload="Scalar")
        r = tr.like(g[0])
        tr.call("aten.mul", [m, p], [r])
        return [r]

    tr.call("aten.rsqrt", [x], [out], backward=bwd, saved=saved)
    if tr.grad_enabled and out.requires_grad:
        saved["out"] = detach(tr, out)
    return out


def neg(tr: Tracer, x: T) -> T:
    out = tr.like(x)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        r = tr.like(g[0])
        tr.call("aten.neg", [g[0]], [r])
        return [r]

    tr.call("aten.neg", [x], [out], backward=bwd)
    return out


def cat(tr: Tracer, xs: Sequence[T], dim: int) -> T:
    nd = len(xs[-1].shape)
    d = dim % nd
    shapes = [x.shape for x in xs if len(x.shape) == nd]
    shape = list(shapes[0])
    shape[d] = sum(s[d] for s in shapes)
    src = next(x for x in xs if len(x.shape) == nd)
    out = tr.like(src, shape)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        res: list[T | None] = []
        offset = 0
        for x in fn.inputs:
            if len(x.shape) != nd:
                res.append(None)
                continue
            size = x.shape[d]
            res.append(plain_slice(tr, g[0], d, offset, offset + size)
                       if x.requires_grad else None)
            offset += size
        return res

    tr.call("aten.cat", list(xs), [out], {"dim": dim}, backward=bwd)
    return out


def silu(tr: Tracer, x: T) -> T:
    out = tr.like(x)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        r = tr.like(g[0])
        tr.call("aten.silu_backward", [g[0], fn.inputs[0]], [r])
        return [r]

    tr.call("aten.silu", [x], [out], backward=bwd)
    return out


def tanh(tr: Tracer, x: T) -> T:
    out = tr.like(x)
    saved: dict[str, Any] = {}

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        d = detach(tr, fn.saved["out"])
        r = tr.like(g[0])
        tr.call("aten.tanh_backward", [g[0], d], [r])
        return [r]

    tr.call("aten.tanh", [x], [out], backward=bwd, saved=saved)
    if tr.grad_enabled and out.requires_grad:
        saved["out"] = detach(tr, out)
    return out


def dropout(tr: Tracer, x: T, p: float) -> T:
    """``nn.Dropout`` in training: a Bernoulli mask scaled by ``1/(1-p)``, then a mul."""
    if p <= 0:
        return x
    keep = 1.0 - p
    mask = tr.like(x)
    tr.record("aten.empty_like", [x], [mask], {})
    tr.record("aten.bernoulli_", [mask], [mask], {"p": keep})
    tr.record("aten.div_", [mask], [mask], {"other": keep})
    out = tr.like(x)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        r = tr.like(g[0])
        tr.call("aten.mul", [g[0], fn.inputs[1]], [r])
        return [r, None]

    tr.call("aten.mul", [x, mask], [out], backward=bwd)
    return out


# -- matmuls -----------------------------------------------------------------------------------


def mm(tr: Tracer, a: T, b: T) -> T:
    """``a [M, K] @ b [K, N]``; ``b`` is a transposed weight (``nn.Linear``)."""
    out = tr.like(a, (a.shape[0], b.shape[1]))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        x, w = fn.inputs
        gw = gx = None
        if w.requires_grad:  # (gᵀ·x)ᵀ: the weight is stored [N, K]
            gt = plain_t(tr, g[0])
            prod = tr.like(g[0], (gt.shape[0], x.shape[1]))
            tr.call("aten.mm", [gt, x], [prod])
            gw = plain_t(tr, prod)
        if x.requires_grad:
            wt = plain_t(tr, w)
            gx = tr.like(g[0], (g[0].shape[0], wt.shape[1]))
            tr.call("aten.mm", [g[0], wt], [gx])
        return [gx, gw]

    tr.call("aten.mm", [a, b], [out], backward=bwd)
    return out


def addmm(tr: Tracer, bias: T, a: T, b: T) -> T:
    """``bias + a @ b``: GPT-2's ``Conv1D`` (``b`` stored ``[K, N]``) or a biased
    ``nn.Linear`` (``b`` a transposed ``[N, K]`` weight)."""
    out = tr.like(a, (a.shape[0], b.shape[1]))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        bias_, x, w = fn.inputs
        gx = gw = gb = None
        if x.requires_grad:
            wt = plain_t(tr, w)
            gx = tr.like(g[0], (g[0].shape[0], wt.shape[1]))
            tr.call("aten.mm", [g[0], wt], [gx])
        if w.requires_grad:
            if w.is_view:  # a transposed nn.Linear weight (column-major): (gᵀ·x)ᵀ
                gt = plain_t(tr, g[0])
                prod = tr.like(g[0], (gt.shape[0], x.shape[1]))
                tr.call("aten.mm", [gt, x], [prod])
                gw = plain_t(tr, prod)
            else:  # GPT-2's Conv1D weight [K, N]: xᵀ·g
                xt = plain_t(tr, x)
                gw = tr.like(g[0], (xt.shape[0], g[0].shape[1]))
                tr.call("aten.mm", [xt, g[0]], [gw])
        if bias_.requires_grad:
            s = tr.like(g[0], (1, g[0].shape[1]))
            tr.call("aten.sum", [g[0]], [s], {"dim": (0,), "keepdim": True})
            gb = tr.view_of(s, bias_.shape)
            tr.call("aten.view", [s], [gb], {"size": bias_.shape})
        return [gb, gx, gw]

    tr.call("aten.addmm", [bias, a, b], [out], backward=bwd)
    return out


def grouped_mm(tr: Tracer, x: T, w: T, offs: T, rows: Sequence[int]) -> T:
    """``x [M, K]`` times per-expert ``w [E, K, N]`` (a transposed view of the weights)."""
    out = tr.like(x, (x.shape[0], w.shape[2]))
    group = tuple(int(r) for r in rows)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        xx, ww, off = fn.inputs
        gw = gx = None
        if ww.requires_grad:
            gt = plain_transpose(tr, g[0], -2, -1, group)
            prod = tr.like(g[0], (ww.shape[0], ww.shape[2], ww.shape[1]))
            tr.call("aten._grouped_mm", [gt, xx, off], [prod], {"group_rows": group})
            gw = plain_transpose(tr, prod, -2, -1, group)
        if xx.requires_grad:
            wt = plain_transpose(tr, ww, -2, -1, group)
            gx = tr.like(g[0], xx.shape)
            tr.call("aten._grouped_mm", [g[0], wt, off], [gx], {"group_rows": group})
        return [gx, gw, None]

    tr.call("aten._grouped_mm", [x, w, offs], [out], {"group_rows": group}, backward=bwd)
    return out


# -- normalisation, embedding, attention, loss ---------------------------------------------


def embedding(tr: Tracer, weight: T, ids: T) -> T:
    out = tr.like(weight, (*ids.shape, weight.shape[1]))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        w, idx = fn.inputs
        r = tr.like(g[0], w.shape)
        tr.call("aten.embedding_dense_backward", [g[0], idx], [r],
                {"num_weights": w.shape[0], "padding_idx": -1, "scale_grad_by_freq": False})
        return [r, None]

    tr.call("aten.embedding", [weight, ids], [out], backward=bwd)
    return out


def layer_norm(tr: Tracer, x: T, w: T, b: T, eps: float) -> T:
    n = x.shape[-1]
    out = tr.like(x)
    mean = tr.like(x, (*x.shape[:-1], 1))
    rstd = tr.like(x, (*x.shape[:-1], 1))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        xx, ww, bb = fn.inputs
        dx, dw, db = tr.like(g[0]), tr.like(ww), tr.like(bb)
        tr.call("aten.native_layer_norm_backward", [g[0], xx, fn.outputs[1], fn.outputs[2],
                                                    ww, bb], [dx, dw, db],
                {"normalized_shape": (n,), "output_mask": (True, True, True)})
        return [dx, dw, db]

    tr.call("aten.native_layer_norm", [x, w, b], [out, mean, rstd],
            {"normalized_shape": (n,), "eps": eps}, backward=bwd, grad_outputs=(0,))
    return out


def attention(tr: Tracer, q: T, k: T, v: T, attrs: dict[str, Any]) -> T:
    """``zrt.attention(q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D])`` → ``[B, Sq, Hq, Dv]`` and
    the float32 log-sum-exp ``[B, Hq, Sq]`` (the harness's operator; GQA inside)."""
    b, h, s, _ = q.shape
    dv = v.shape[-1]
    out = tr.like(q, (b, s, h, dv))
    lse = tr.like(q, (b, h, s), F32)
    saved: dict[str, Any] = {}

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        qq, kk, vv = fn.inputs
        glse = tr.like(fn.outputs[1])
        tr.call("aten.zeros", [], [glse], {"size": glse.shape, "dtype": F32})
        o = detach(tr, fn.saved["out"])
        lse_d = detach(tr, fn.saved["lse"])
        dq, dk, dv_ = (tr.like(x, contiguous=True) for x in (qq, kk, vv))
        dsink = tr.like(qq, (0,))
        tr.call("zrt.attention_backward", [g[0], qq, kk, vv, o, lse_d],
                [dq, dk, dv_, dsink], dict(attrs))
        return [dq, dk, dv_]

    tr.call("zrt.attention", [q, k, v], [out, lse], dict(attrs), backward=bwd, saved=saved,
            grad_outputs=(0,))
    if tr.grad_enabled and out.requires_grad:
        saved["out"] = detach(tr, out)
        saved["lse"] = detach(tr, lse)
    return out


def log_softmax(tr: Tracer, x: T, dim: int) -> T:
    out = tr.like(x)
    saved: dict[str, Any] = {}

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        d = detach(tr, fn.saved["out"])
        r = tr.like(g[0])
        tr.call("aten._log_softmax_backward_data", [g[0], d], [r],
                {"dim": dim, "input_dtype": fn.inputs[0].dtype})
        return [r]

    tr.call("aten._log_softmax", [x], [out], {"dim": dim, "half_to_float": False},
            backward=bwd, saved=saved)
    if tr.grad_enabled and out.requires_grad:
        saved["out"] = detach(tr, out)
    return out


def softmax(tr: Tracer, x: T, dim: int) -> T:
    out = tr.like(x)
    saved: dict[str, Any] = {}

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        d = detach(tr, fn.saved["out"])
        r = tr.like(g[0])
        tr.call("aten._softmax_backward_data", [g[0], d], [r],
                {"dim": dim, "input_dtype": fn.inputs[0].dtype})
        return [r]

    tr.call("aten._softmax", [x], [out], {"dim": dim, "half_to_float": False},
            backward=bwd, saved=saved)
    if tr.grad_enabled and out.requires_grad:
        saved["out"] = detach(tr, out)
    return out


def nll_loss(tr: Tracer, logp: T, target: T) -> T:
    loss = tr.like(logp, ())
    total = tr.like(logp, ())

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        lp, tgt = fn.inputs
        r = tr.like(lp)
        tr.call("aten.nll_loss_backward", [g[0], lp, tgt, fn.outputs[1]], [r],
                {"reduction": 1, "ignore_index": -100})
        return [r, None]

    tr.call("aten.nll_loss_forward", [logp, target], [loss, total],
            {"reduction": 1, "ignore_index": -100}, backward=bwd, grad_outputs=(0,))
    return loss


# -- mixture of experts ------------------------------------------------------------------------


def topk(tr: Tracer, x: T, k: int) -> tuple[T, T]:
    vals = tr.like(x, (*x.shape[:-1], k))
    idx = tr.like(x, (*x.shape[:-1], k), "int64")

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        z = tr.like(g[0], fn.inputs[0].shape)
        tr.call("aten.new_zeros", [g[0]], [z], {"size": fn.inputs[0].shape})
        r = tr.like(z)
        tr.call("aten.scatter", [z, fn.outputs[1], g[0]], [r], {"dim": -1})
        return [r]

    tr.call("aten.topk", [x], [vals, idx], {"k": k}, backward=bwd, grad_outputs=(0,))
    return vals, idx


def moe_dispatch(tr: Tracer, hidden: T, index: T, experts: int) -> tuple[T, T, T]:
    tokens, k = index.shape
    routed = tr.like(hidden, (tokens * k, hidden.shape[1]))
    row_token = tr.like(index, (tokens * k,), "int64")
    row_expert = tr.like(index, (tokens * k,), "int64")

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        z1 = tr.like(fn.outputs[1])
        tr.call("aten.zeros", [], [z1], {"size": z1.shape, "dtype": "int64"})
        z2 = tr.like(fn.outputs[2])
        tr.call("aten.zeros", [], [z2], {"size": z2.shape, "dtype": "int64"})
        r = tr.like(g[0], fn.inputs[0].shape)
        tr.call("zrt.moe_dispatch_backward", [g[0], fn.outputs[1]], [r],
                {"tokens": tokens, "top_k": k})
        return [r, None]

    tr.call("zrt.moe_dispatch", [hidden, index], [routed, row_token, row_expert],
            {"num_experts": experts}, backward=bwd, grad_outputs=(0,))
    return routed, row_token, row_expert


def moe_combine(tr: Tracer, out: T, row_token: T, weights: T, dtype: str) -> T:
    tokens = weights.shape[0]
    res = tr.like(out, (tokens, out.shape[1]), dtype)

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        o, rt, w = fn.inputs
        d_out, d_w = tr.like(o), tr.like(w)
        tr.call("zrt.moe_combine_backward", [g[0], o, rt, w], [d_out, d_w])
        return [d_out, None, d_w]

    tr.call("zrt.moe_combine", [out, row_token, weights], [res], backward=bwd)
    return res


def sum_last_keepdim(tr: Tracer, x: T) -> T:
    out = tr.like(x, (*x.shape[:-1], 1))

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        e = tr.view_of(g[0], fn.inputs[0].shape)
        tr.call("aten.expand", [g[0]], [e], {"size": fn.inputs[0].shape})
        return [e]

    tr.call("aten.sum", [x], [out], {"dim": (-1,), "keepdim": True}, backward=bwd)
    return out


def div_inplace(tr: Tracer, x: T, y: T) -> T:
    """``x /= y`` (Mixtral's top-k renormalisation). Autograd keeps a clone of ``x`` for
    the derivative (recorded before the in-place kernel, one sequence number later); the
    result keeps ``x``'s id. Backward: ``g/y`` for ``x``, ``Σ −g·(x/y)/y`` for ``y``."""
    if not tr.grad_enabled or not (x.requires_grad or y.requires_grad):
        tr.record("aten.div_", [x, y], [x], {}, overload="Tensor")
        return x
    seq = tr.reserve_seq(2)
    kept = tr.like(x)
    tr.record("aten.clone", [x], [kept], {"seq_nr": seq + 1})

    def bwd(tr: Tracer, fn: Fn, g: list[T | None]) -> list[T | None]:
        _a, b = fn.inputs
        q1 = tr.like(kept)
        tr.call("aten.div", [kept, b], [q1], overload="Tensor")
        q2 = tr.like(q1)
        tr.call("aten.div", [q1, b], [q2], overload="Tensor")
        ng = tr.like(g[0])
        tr.call("aten.neg", [g[0]], [ng])
        prod = tr.like(ng)
        tr.call("aten.mul", [ng, q2], [prod])
        ga = tr.like(g[0])
        tr.call("aten.div", [g[0], b], [ga], overload="Tensor")
        gb = _reduce_to(tr, prod, b.shape)
        return [ga, gb]

    tr.call("aten.div_", [x, y], [x], backward=bwd, overload="Tensor", seq=seq)
    return x
