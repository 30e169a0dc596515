"""The DeepSeek kernels production engines run, as ``torch.library`` custom ops.

Each op stands for one kernel: it has a real implementation in plain torch (so a small
model can be checked numerically against transformers' reference code), a fake
implementation (shapes only: what capture runs) and, where training runs it, an autograd
formula whose backward is itself one op. Formulas live in :mod:`zrt_deepseek.formulas`.

Operators (namespace ``deepseek``):

``mla_attention(q, kv, v, indices, is_causal, scale)``
    Multi-head latent attention in its absorbed ("MQA") form, as FlashMLA runs it
    (``flash_mla_with_kvcache`` for decode, ``flash_mla_sparse_fwd`` for DSA prefill):
    ``q [B, H, Sq, Dqk]`` is the query already multiplied into the latent space
    (``q_nope·W_UK``, then the rope part), ``kv [B, 1, Skv, Dqk]`` the latent cache
    (``kv_lora_rank`` compressed channels then ``qk_rope_head_dim`` rope channels per token),
    ``v [B, 1, Skv, Dv]`` its first ``Dv = kv_lora_rank`` channels (a view: the kernel reads
    values from the same cache rows). Queries are the last ``Sq`` positions of the
    ``Skv`` keys. ``indices [B, Sq, K]`` (int32, ``-1`` = none) restrict each query to the
    keys the DSA indexer picked. Returns ``(out [B, Sq, H, Dv], lse [B, H, Sq])``; the
    caller multiplies ``out`` by ``W_UV``.
``npu_sparse_flash_attention(...)``
    The same math under the Ascend kernel's name (torch_npu ``npu_sparse_flash_attention``,
    CANN's SFA for DeepSeek-V3.2); selected for Ascend by :mod:`zrt_deepseek.kernels`.
``lightning_indexer(q, k, weights, topk, ratio, start_pos, scale)``
    DSA's indexer: ``score[b, i, j] = Σ_h weights[b, i, h] · ReLU(q[b, i, h] · k[b, j]) ·
    scale`` over the keys the query at position ``start_pos + i`` may see
    (``j < (start_pos + i + 1) // ratio``), then the top ``min(topk, T)`` key indices
    (int32, ``-1`` where fewer keys are visible). ``q [B, Sq, Hi, Di]``, ``k [B, T, Di]``,
    ``weights [B, Sq, Hi]`` (float32). ``ratio`` is 1 for V3.2 (one key per token) and the
    CSA compression rate for V4. ``npu_lightning_indexer`` is the Ascend name.
``sparse_attention(q, kv, sinks, indices, window_keys, window, ratio, start_pos, scale)``
    DeepSeek-V4's attention kernel (the reference ``sparse_attn``): shared-KV MQA (K = V,
    one head of ``D``) with a per-head sink logit over a window branch and a compressed
    branch. ``kv [B, 1, window_keys + C, D]``: the first ``window_keys`` are the last source
    tokens (positions up to ``start_pos + Sq − 1``), the rest ``C`` compressed entries,
    entry ``j`` summarising tokens ``[j·ratio, (j + 1)·ratio)``. The query at ``p`` sees the
    window keys in ``(p − window, p]`` and the entries ``j < (p + 1) // ratio`` — all of
    them (HCA), or those in ``indices [B, Sq, K]`` (CSA, relative to the compressed part).
    ``ratio = 0``: the window only.
``hc_split_sinkhorn(mixes, scale, base, hc_mult, iters, eps)``
    DeepSeek-V4's hyper-connection weights in one kernel (the reference
    ``hc_split_sinkhorn`` of V4's inference code; TensorRT-LLM's
    ``auto_deploy::hc_split_sinkhorn``): from ``mixes [..., (2 + n)·n]`` (float32, the
    normalised streams through ``fn``), ``pre = σ(mixes·s₀ + b) + eps``, ``post =
    2σ(mixes·s₁ + b)``, and ``comb`` = the row softmax of ``mixes·s₂ + b`` (as ``n × n``)
    plus eps, normalised by columns once and then by rows and columns ``iters − 1`` times
    (Sinkhorn-Knopp). Returns ``(pre [..., n], post [..., n], comb [..., n, n])`` in
    float32. transformers spells it as ~4·iters elementwise ops per hyper-connection, two
    per layer (~120 graph nodes each in V4-Flash, three times that in the backward).
``hc_aggregate``, ``hc_post``
    The hyper-connections' stream collapse and expansion (:mod:`zrt_deepseek.hc_mix`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

NAMESPACE = "deepseek"

_lock = threading.Lock()
_defined = False

_SCHEMAS = {
    "mla_attention": "(Tensor q, Tensor kv, Tensor v, Tensor? indices, bool is_causal, float scale) -> (Tensor, Tensor)",
    "mla_attention_backward": "(Tensor grad_out, Tensor q, Tensor kv, Tensor v, Tensor out, Tensor lse, Tensor? indices, bool is_causal, float scale) -> (Tensor, Tensor)",
    "lightning_indexer": "(Tensor q, Tensor k, Tensor weights, int topk, int ratio, int start_pos, float scale) -> Tensor",
    "sparse_attention": "(Tensor q, Tensor kv, Tensor sinks, Tensor? indices, int window_keys, int window, int ratio, int start_pos, float scale) -> (Tensor, Tensor)",
    "sparse_attention_backward": "(Tensor grad_out, Tensor q, Tensor kv, Tensor sinks, Tensor out, Tensor lse, Tensor? indices, int window_keys, int window, int ratio, int start_pos, float scale) -> (Tensor, Tensor, Tensor)",
    "hc_split_sinkhorn": "(Tensor mixes, Tensor scale, Tensor base, int hc_mult, int iters, float eps) -> (Tensor, Tensor, Tensor)",
    "hc_split_sinkhorn_backward": "(Tensor grad_pre, Tensor grad_post, Tensor grad_comb, Tensor mixes, Tensor scale, Tensor base, int hc_mult, int iters, float eps) -> (Tensor, Tensor, Tensor)",
}

#: CUDA kernel → its Ascend counterpart (same schema, same math).
NPU_NAMES = {
    "mla_attention": "npu_sparse_flash_attention",
    "mla_attention_backward": "npu_sparse_flash_attention_backward",
    "lightning_indexer": "npu_lightning_indexer",
}


def ensure_ops() -> None:
    """Define the ``deepseek::`` operators once per process (idempotent, thread-safe).

    Defining an operator only adds it to torch's registry; nothing runs it unless a model
    patch routes calls to it.
    """
    global _defined
    if _defined:
        return
    with _lock:
        if _defined:
            return
        _define_mla()
        _define_indexer()
        _define_sparse_attention()
        _define_hc_split_sinkhorn()
        from zrt_deepseek.hc_mix import define_hc_mix

        define_hc_mix()
        _defined = True


# -- reference math ----------------------------------------------------------------------


def causal_visible(q_len: int, kv_len: int, device=None):
    """``[q_len, kv_len]``: queries are the last ``q_len`` of ``kv_len`` positions."""
    import torch

    q_pos = torch.arange(kv_len - q_len, kv_len, device=device).unsqueeze(1)
    return torch.arange(kv_len, device=device).unsqueeze(0) <= q_pos


def _index_mask(indices, kv_len: int):
    """``[B, Sq, kv_len]`` bool: the keys each query's valid indices name."""
    import torch

    b, sq, _k = indices.shape
    chosen = torch.zeros(b, sq, kv_len + 1, dtype=torch.bool, device=indices.device)
    safe = torch.where(indices >= 0, indices.long(), torch.full_like(indices.long(), kv_len))
    chosen.scatter_(-1, safe, True)
    return chosen[..., :kv_len]


def mla_visible(q_len: int, kv_len: int, indices, is_causal: bool, batch: int, device=None):
    """``[B, 1, Sq, Skv]`` visibility of :func:`mla_attention`."""
    import torch

    visible = (causal_visible(q_len, kv_len, device) if is_causal
               else torch.ones(q_len, kv_len, dtype=torch.bool, device=device))
    visible = visible.expand(batch, q_len, kv_len)
    if indices is not None:
        visible = visible & _index_mask(indices, kv_len)
    return visible.unsqueeze(1)


def _mla_probs(q, kv, v_dim, indices, is_causal, scale):
    import torch

    ct = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(ct), kv.to(ct).transpose(-1, -2)) * scale  # [B, H, Sq, Skv]
    visible = mla_visible(q.shape[2], kv.shape[2], indices, is_causal, q.shape[0], q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    return probs, lse, ct


def mla_attention_reference(q, kv, v, indices, is_causal, scale):
    import torch

    v_dim = v.shape[-1]
    probs, lse, ct = _mla_probs(q, kv, v_dim, indices, is_causal, scale)
    out = torch.matmul(probs, kv[..., :v_dim].to(ct))  # [B, H, Sq, Dv]
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.to(torch.float32)


def mla_attention_backward_reference(grad_out, q, kv, v, out, indices, is_causal, scale):
    """Closed-form gradients (the FlashAttention backward, with V inside K)."""
    import torch

    v_dim = v.shape[-1]
    probs, _lse, ct = _mla_probs(q, kv, v_dim, indices, is_causal, scale)
    d_out = grad_out.to(ct).transpose(1, 2)                       # [B, H, Sq, Dv]
    o = out.to(ct).transpose(1, 2)
    kv_ct = kv.to(ct)
    d_v = torch.matmul(probs.transpose(-1, -2), d_out).sum(1, keepdim=True)   # P^T dO
    d_p = torch.matmul(d_out, kv_ct[..., :v_dim].transpose(-1, -2))           # dO V^T
    d_s = probs * (d_p - (d_out * o).sum(-1, keepdim=True)) * scale
    d_q = torch.matmul(d_s, kv_ct)
    d_kv = torch.matmul(d_s.transpose(-1, -2), q.to(ct)).sum(1, keepdim=True)
    d_kv[..., :v_dim] += d_v
    return d_q.to(q.dtype), d_kv.to(kv.dtype)


def indexer_visible(q_len: int, keys: int, ratio: int, start_pos: int, device=None):
    """``[Sq, T]``: the query at ``start_pos + i`` sees keys ``j < (start_pos + i + 1) // ratio``."""
    import torch

    limit = (torch.arange(start_pos, start_pos + q_len, device=device) + 1) // max(ratio, 1)
    return torch.arange(keys, device=device).unsqueeze(0) < limit.unsqueeze(1)


def lightning_indexer_reference(q, k, weights, topk, ratio, start_pos, scale):
    """The order of operations of transformers' DeepSeek-V3.2 indexer, so the top-k it picks
    is the one the reference model picks."""
    import torch

    scores = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * scale
    scores = torch.relu(scores)                                      # [B, Sq, Hi, T]
    index = torch.matmul(weights.float().unsqueeze(-2), scores).squeeze(-2)  # [B, Sq, T]
    visible = indexer_visible(q.shape[1], k.shape[1], ratio, start_pos, q.device)
    index = index.masked_fill(~visible, float("-inf"))
    chosen = index.topk(min(topk, k.shape[1]), dim=-1).indices
    valid = torch.gather(visible.expand(q.shape[0], -1, -1), -1, chosen)
    return torch.where(valid, chosen, torch.full_like(chosen, -1)).to(torch.int32)


def v4_visible(q_len: int, kv_len: int, window_keys: int, window: int, ratio: int,
               start_pos: int, indices, batch: int, device=None):
    """``[B, 1, Sq, N]`` visibility of :func:`sparse_attention` (module docstring)."""
    import torch

    q_pos = torch.arange(start_pos, start_pos + q_len, device=device).unsqueeze(1)
    k_pos = (torch.arange(window_keys, device=device) + start_pos + q_len - window_keys
             ).unsqueeze(0)
    win = (k_pos <= q_pos) & (k_pos > q_pos - window if window > 0 else k_pos >= 0)
    win = win.expand(batch, q_len, window_keys)
    entries = kv_len - window_keys
    if ratio > 0 and entries > 0:
        comp = torch.arange(entries, device=device).unsqueeze(0) < (q_pos + 1) // ratio
        comp = comp.expand(batch, q_len, entries)
        if indices is not None:
            comp = comp & _index_mask(indices, entries)
        visible = torch.cat([win, comp], dim=-1)
    else:
        visible = win
    return visible.unsqueeze(1)


def _v4_probs(q, kv, sinks, indices, window_keys, window, ratio, start_pos, scale):
    import torch

    ct = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q.to(ct), kv.to(ct).transpose(-1, -2)) * scale  # [B, H, Sq, N]
    visible = v4_visible(q.shape[2], kv.shape[2], window_keys, window, ratio, start_pos,
                         indices, q.shape[0], q.device)
    scores = scores.masked_fill(~visible, float("-inf"))
    sink = sinks.to(ct).reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
    full = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(full, dim=-1)
    probs = torch.exp(full - lse.unsqueeze(-1))
    return probs, lse, ct


def sparse_attention_reference(q, kv, sinks, indices, window_keys, window, ratio, start_pos,
                               scale):
    import torch

    probs, lse, ct = _v4_probs(q, kv, sinks, indices, window_keys, window, ratio, start_pos,
                               scale)
    out = torch.matmul(probs[..., :-1], kv.to(ct))
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse.to(torch.float32)


def sparse_attention_backward_reference(grad_out, q, kv, sinks, out, indices, window_keys,
                                        window, ratio, start_pos, scale):
    import torch

    probs, _lse, ct = _v4_probs(q, kv, sinks, indices, window_keys, window, ratio, start_pos,
                                scale)
    p = probs[..., :-1]
    d_out = grad_out.to(ct).transpose(1, 2)
    o = out.to(ct).transpose(1, 2)
    kv_ct = kv.to(ct)
    row = (d_out * o).sum(-1, keepdim=True)
    d_p = torch.matmul(d_out, kv_ct.transpose(-1, -2))
    d_s = p * (d_p - row) * scale
    d_q = torch.matmul(d_s, kv_ct)
    d_kv = (torch.matmul(d_s.transpose(-1, -2), q.to(ct))
            + torch.matmul(p.transpose(-1, -2), d_out)).sum(1, keepdim=True)
    d_sinks = -(probs[..., -1] * row.squeeze(-1)).sum(dim=(0, 2))
    return d_q.to(q.dtype), d_kv.to(kv.dtype), d_sinks.to(sinks.dtype)


def hc_split_sinkhorn_reference(mixes, scale, base, hc_mult: int, iters: int, eps: float):
    """transformers' ``DeepseekV4HyperConnection`` arithmetic after the ``fn`` projection,
    in its order of operations (so the weights equal the reference model's)."""
    import torch

    hc = hc_mult
    pre_w, post_w, comb_w = mixes.split([hc, hc, hc * hc], dim=-1)
    pre_b, post_b, comb_b = base.split([hc, hc, hc * hc])
    pre_scale, post_scale, comb_scale = scale.unbind(0)
    comb_w = comb_w.view(*comb_w.shape[:-1], hc, hc)
    comb_b = comb_b.view(hc, hc)
    pre = torch.sigmoid(pre_w * pre_scale + pre_b) + eps
    post = 2 * torch.sigmoid(post_w * post_scale + post_b)
    comb = torch.softmax(comb_w * comb_scale + comb_b, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def hc_split_sinkhorn_backward_reference(grad_pre, grad_post, grad_comb, mixes, scale, base,
                                         hc_mult: int, iters: int, eps: float):
    """Gradients of ``mixes``, ``scale`` and ``base``: the kernel recomputes the iterations
    from its inputs (vector-Jacobian product of the reference)."""
    import torch

    def run(m, s, b):
        return hc_split_sinkhorn_reference(m, s, b, hc_mult, iters, eps)

    _out, vjp = torch.func.vjp(run, mixes, scale, base)
    d_mixes, d_scale, d_base = vjp((grad_pre, grad_post, grad_comb))
    return d_mixes, d_scale, d_base


# -- definitions -------------------------------------------------------------------------


def _define_mla() -> None:
    import torch

    def define(name: str) -> None:
        backward_name = f"{name}_backward"

        @torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=(),
                                 schema=_SCHEMAS["mla_attention"])
        def forward(q: Tensor, kv: Tensor, v: Tensor, indices: Tensor | None, is_causal: bool,
                    scale: float) -> tuple[Tensor, Tensor]:
            return mla_attention_reference(q, kv, v, indices, is_causal, scale)

        @forward.register_fake
        def _(q, kv, v, indices, is_causal, scale):
            b, h, sq, _d = q.shape
            return (q.new_empty((b, sq, h, v.shape[-1])),
                    q.new_empty((b, h, sq), dtype=torch.float32))

        @torch.library.custom_op(f"{NAMESPACE}::{backward_name}", mutates_args=(),
                                 schema=_SCHEMAS["mla_attention_backward"])
        def backward_op(grad_out: Tensor, q: Tensor, kv: Tensor, v: Tensor, out: Tensor,
                        lse: Tensor, indices: Tensor | None, is_causal: bool,
                        scale: float) -> tuple[Tensor, Tensor]:
            return mla_attention_backward_reference(grad_out, q, kv, v, out, indices,
                                                    is_causal, scale)

        @backward_op.register_fake
        def _(grad_out, q, kv, v, out, lse, indices, is_causal, scale):
            return q.new_empty(q.shape), kv.new_empty(kv.shape)

        def setup_context(ctx, inputs, output):
            q, kv, v, indices, is_causal, scale = inputs
            ctx.save_for_backward(q, kv, v, output[0], output[1], indices)
            ctx.params = (is_causal, scale)

        def backward(ctx, grad_out, _grad_lse):
            q, kv, v, out, lse, indices = ctx.saved_tensors
            op = getattr(torch.ops.deepseek, backward_name)
            d_q, d_kv = op(grad_out.contiguous(), q, kv, v, out, lse, indices, *ctx.params)
            # V is a view of the cache rows: its gradient is already inside d_kv.
            return d_q, d_kv, None, None, None, None

        forward.register_autograd(backward, setup_context=setup_context)

    define("mla_attention")
    define(NPU_NAMES["mla_attention"])


def _define_indexer() -> None:
    import torch

    def define(name: str) -> None:
        @torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=(),
                                 schema=_SCHEMAS["lightning_indexer"])
        def indexer(q: Tensor, k: Tensor, weights: Tensor, topk: int, ratio: int,
                    start_pos: int, scale: float) -> Tensor:
            return lightning_indexer_reference(q, k, weights, topk, ratio, start_pos, scale)

        @indexer.register_fake
        def _(q, k, weights, topk, ratio, start_pos, scale):
            return q.new_empty((q.shape[0], q.shape[1], min(topk, k.shape[1])),
                               dtype=torch.int32)

    define("lightning_indexer")
    define(NPU_NAMES["lightning_indexer"])


def _define_sparse_attention() -> None:
    import torch

    @torch.library.custom_op(f"{NAMESPACE}::sparse_attention", mutates_args=(),
                             schema=_SCHEMAS["sparse_attention"])
    def sparse_attention(q: Tensor, kv: Tensor, sinks: Tensor, indices: Tensor | None,
                         window_keys: int, window: int, ratio: int, start_pos: int,
                         scale: float) -> tuple[Tensor, Tensor]:
        return sparse_attention_reference(q, kv, sinks, indices, window_keys, window, ratio,
                                          start_pos, scale)

    @sparse_attention.register_fake
    def _(q, kv, sinks, indices, window_keys, window, ratio, start_pos, scale):
        b, h, sq, d = q.shape
        return q.new_empty((b, sq, h, d)), q.new_empty((b, h, sq), dtype=torch.float32)

    @torch.library.custom_op(f"{NAMESPACE}::sparse_attention_backward", mutates_args=(),
                             schema=_SCHEMAS["sparse_attention_backward"])
    def sparse_attention_backward(grad_out: Tensor, q: Tensor, kv: Tensor, sinks: Tensor,
                                  out: Tensor, lse: Tensor, indices: Tensor | None,
                                  window_keys: int, window: int, ratio: int, start_pos: int,
                                  scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return sparse_attention_backward_reference(grad_out, q, kv, sinks, out, indices,
                                                   window_keys, window, ratio, start_pos,
                                                   scale)

    @sparse_attention_backward.register_fake
    def _(grad_out, q, kv, sinks, out, lse, indices, window_keys, window, ratio, start_pos,
          scale):
        return q.new_empty(q.shape), kv.new_empty(kv.shape), sinks.new_empty(sinks.shape)

    def setup_context(ctx, inputs, output):
        q, kv, sinks, indices, *params = inputs
        ctx.save_for_backward(q, kv, sinks, output[0], output[1], indices)
        ctx.params = tuple(params)

    def backward(ctx, grad_out, _grad_lse):
        q, kv, sinks, out, lse, indices = ctx.saved_tensors
        d_q, d_kv, d_sinks = torch.ops.deepseek.sparse_attention_backward(
            grad_out.contiguous(), q, kv, sinks, out, lse, indices, *ctx.params)
        return d_q, d_kv, d_sinks, None, None, None, None, None, None

    sparse_attention.register_autograd(backward, setup_context=setup_context)


def _define_hc_split_sinkhorn() -> None:
    import torch

    @torch.library.custom_op(f"{NAMESPACE}::hc_split_sinkhorn", mutates_args=(),
                             schema=_SCHEMAS["hc_split_sinkhorn"])
    def hc_split_sinkhorn(mixes: Tensor, scale: Tensor, base: Tensor, hc_mult: int, iters: int,
                          eps: float) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(t.contiguous() for t in hc_split_sinkhorn_reference(
            mixes, scale, base, hc_mult, iters, eps))

    @hc_split_sinkhorn.register_fake
    def _(mixes, scale, base, hc_mult, iters, eps):
        lead = tuple(mixes.shape[:-1])
        return (mixes.new_empty((*lead, hc_mult)), mixes.new_empty((*lead, hc_mult)),
                mixes.new_empty((*lead, hc_mult, hc_mult)))

    @torch.library.custom_op(f"{NAMESPACE}::hc_split_sinkhorn_backward", mutates_args=(),
                             schema=_SCHEMAS["hc_split_sinkhorn_backward"])
    def hc_split_sinkhorn_backward(grad_pre: Tensor, grad_post: Tensor, grad_comb: Tensor,
                                   mixes: Tensor, scale: Tensor, base: Tensor, hc_mult: int,
                                   iters: int, eps: float) -> tuple[Tensor, Tensor, Tensor]:
        return hc_split_sinkhorn_backward_reference(grad_pre, grad_post, grad_comb, mixes,
                                                    scale, base, hc_mult, iters, eps)

    @hc_split_sinkhorn_backward.register_fake
    def _(grad_pre, grad_post, grad_comb, mixes, scale, base, hc_mult, iters, eps):
        return mixes.new_empty(mixes.shape), scale.new_empty(scale.shape), \
            base.new_empty(base.shape)

    def setup_context(ctx, inputs, output):
        mixes, scale, base, *params = inputs
        ctx.save_for_backward(mixes, scale, base)
        ctx.params = tuple(params)

    def backward(ctx, grad_pre, grad_post, grad_comb):
        mixes, scale, base = ctx.saved_tensors
        d_mixes, d_scale, d_base = torch.ops.deepseek.hc_split_sinkhorn_backward(
            grad_pre.contiguous(), grad_post.contiguous(), grad_comb.contiguous(), mixes,
            scale, base, *ctx.params)
        return d_mixes, d_scale, d_base, None, None, None

    hc_split_sinkhorn.register_autograd(backward, setup_context=setup_context)
