"""The harness's own operators: one graph node per attention call and per MoE dispatch/combine.

HF's reference code spells attention and token routing as many small aten ops whose shape
depends on the device (flash on GPU, math on meta, CPU flash on fake-CPU) and on the data
(expert loops). Production engines run one kernel for each. These ``torch.library`` custom
ops stand for those kernels: each has a real implementation (plain torch, so a small model
can be checked numerically), a fake implementation (shapes only, what capture runs) and an
autograd formula whose backward is itself one custom op, so the backward graph has one
node per kernel too.

Operators (namespace ``zrt``):

``attention(q, k, v, sinks, indices, is_causal, window, chunk, scale, softcap, alibi=False)``
    ``q`` ``[B, Hq, Sq, D]``, ``k`` ``[B, Hkv, Skv, D]``, ``v`` ``[B, Hkv, Skv, Dv]`` with
    ``Hq`` a multiple of ``Hkv`` (grouped-query attention without repeating K/V). Queries
    are the last ``Sq`` positions of the ``Skv`` keys (bottom-right causal alignment, as
    with a KV cache). ``window > 0`` lets a query see its last ``window`` keys (itself
    included); ``chunk > 0`` limits it to its own block of ``chunk`` positions (Llama 4);
    ``indices`` ``[B, Sq, topk]`` selects keys per query (DeepSeek sparse attention);
    ``sinks`` ``[Hq]`` adds a per-head sink logit (GPT-OSS); ``alibi`` adds
    ``-slope_h · |i - j|`` to each score with Press et al.'s slopes for ``Hq`` heads
    (BLOOM, MPT, Falcon-ALiBi; FlashAttention's ``alibi_slopes``; the attr is recorded
    only when set). Returns the output in the
    layout HF attention functions return, ``[B, Sq, Hq, Dv]``, and the float32
    log-sum-exp ``[B, Hq, Sq]`` that a flash kernel saves for backward.
``attention_backward(grad_out, q, k, v, out, lse, sinks, indices, ...)``
    ``(dq, dk, dv, dsinks)``; ``dsinks`` is empty when there are no sinks.
``moe_dispatch(hidden [T, H], topk_index [T, k], num_experts)``
    Token permutation into expert order: ``(routed [T*k, H], row_token [T*k],
    row_expert [T*k])``: each routed row, which ``token*k + slot`` it came from, and its
    expert.
``moe_combine(expert_out [T*k, H], row_token [T*k], topk_weights [T, k])``
    Un-permutation weighted by the router: ``[T, H]``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


NAMESPACE = "zrt"

# Explicit schemas: the functions below are typed for readers, not for schema inference.
_SCHEMAS = {
    "attention": "(Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor? indices, bool is_causal, int window, int chunk, float scale, float softcap, bool alibi=False) -> (Tensor, Tensor)",
    "attention_backward": "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? sinks, Tensor? indices, bool is_causal, int window, int chunk, float scale, float softcap, bool alibi=False) -> (Tensor, Tensor, Tensor, Tensor)",
    "moe_dispatch": "(Tensor hidden, Tensor topk_index, int num_experts) -> (Tensor, Tensor, Tensor)",
    "moe_dispatch_backward": "(Tensor grad_routed, Tensor row_token, int tokens, int top_k) -> Tensor",
    "moe_combine": "(Tensor expert_out, Tensor row_token, Tensor topk_weights) -> Tensor",
    "moe_combine_backward": "(Tensor grad, Tensor expert_out, Tensor row_token, Tensor topk_weights) -> (Tensor, Tensor)",
}


def define_once(define: Callable[[], None]) -> Callable[[], None]:
    """An ``ensure()`` that runs ``define`` the first time it is called, once per process
    (idempotent, thread-safe): how each family of ``zrt::`` operators is registered."""
    lock = threading.Lock()
    done = False

    def ensure() -> None:
        nonlocal done
        if done:
            return
        with lock:
            if not done:
                define()
                done = True

    return ensure


@contextlib.contextmanager
def swapped_globals(module_name: str, replacements: Mapping[str, Any]) -> Iterator[None]:
    """Set the named globals of a modeling module to ``replacements`` while open (the kernel
    entry points its model code calls by name), and restore them on exit."""
    module = importlib.import_module(module_name)
    originals = {name: getattr(module, name) for name in replacements}
    try:
        for name, fn in replacements.items():
            setattr(module, name, fn)
        yield
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def _define_all() -> None:
    _define_attention()
    _define_moe()


#: Define the ``zrt::`` operators once per process (idempotent, thread-safe). Defining an
#: operator adds it to torch's operator registry; it patches nothing, and nothing runs it
#: unless a model patch routes calls to it.
ensure_ops = define_once(_define_all)


# -- attention -------------------------------------------------------------------------


def attention_mask(q_len: int, kv_len: int, *, is_causal: bool, window: int, chunk: int,
                   device=None):
    """The boolean ``[q_len, kv_len]`` visibility of the reference implementation."""
    import torch

    q_pos = torch.arange(kv_len - q_len, kv_len, device=device).unsqueeze(1)
    k_pos = torch.arange(kv_len, device=device).unsqueeze(0)
    visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if is_causal:
        visible &= k_pos <= q_pos
    if window > 0:
        visible &= k_pos > q_pos - window
    if chunk > 0:
        visible &= (k_pos // chunk) == (q_pos // chunk)
    return visible


def alibi_slopes(heads: int) -> list[float]:
    """Press et al.'s ALiBi slopes for ``heads`` heads, as BLOOM's ``build_alibi_tensor``
    and FlashAttention's ``alibi_slopes`` take them: ``2^(-8i/n)`` for the largest power of
    two ``n`` ≤ heads, then every other slope of ``2n`` for the rest.

    >>> alibi_slopes(4)
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    closest = 2 ** math.floor(math.log2(heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base ** i for i in range(1, closest + 1)]
    if closest != heads:
        extra = 2.0 ** (-4.0 / closest)  # the base for 2 × closest heads
        slopes += [extra ** i for i in range(1, 1 + 2 * min(closest, heads - closest), 2)]
    return slopes


def _attention_probs(q, k, v, sinks, indices, is_causal, window, chunk, scale, softcap,
                     alibi=False):
    """Softmax probabilities of the reference implementation, in at least float32.

    Returns ``(probs [B, Hq, Sq, Skv (+1 sink column)], k_full, v_full, capped)`` where
    ``capped`` is ``tanh(scores / softcap)`` (None without a softcap), kept for backward.
    """
    import torch

    ct = torch.promote_types(q.dtype, torch.float32)  # compute type: at least float32
    group = q.shape[1] // k.shape[1]
    k_full = k.to(ct).repeat_interleave(group, dim=1)
    v_full = v.to(ct).repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(ct), k_full.transpose(-1, -2)) * scale
    capped = None
    if softcap > 0:
        capped = torch.tanh(scores / softcap)
        scores = capped * softcap
    q_len, kv_len = q.shape[2], k.shape[2]
    if alibi:
        slopes = torch.tensor(alibi_slopes(q.shape[1]), dtype=ct, device=q.device)
        q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device).unsqueeze(1)
        distance = (torch.arange(kv_len, device=q.device).unsqueeze(0) - q_pos).abs()
        scores = scores - slopes.reshape(1, -1, 1, 1) * distance.to(ct)
    visible = attention_mask(q_len, kv_len, is_causal=is_causal, window=window, chunk=chunk,
                             device=q.device)
    visible = visible.expand(q.shape[0], q.shape[1], q_len, kv_len)
    if indices is not None:
        chosen = torch.zeros(q.shape[0], q_len, kv_len, dtype=torch.bool, device=q.device)
        safe = indices.long().clamp(min=0, max=kv_len - 1)
        chosen.scatter_(-1, safe, indices >= 0)
        visible = visible & chosen.unsqueeze(1)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.to(ct).reshape(1, -1, 1, 1).expand(q.shape[0], -1, q_len, 1)
        scores = torch.cat([scores, sink], dim=-1)
    return torch.softmax(scores, dim=-1), k_full, v_full, capped


def _attention_reference(q, k, v, sinks, indices, is_causal, window, chunk, scale, softcap,
                         alibi=False):
    """Plain-torch attention: the semantics the fake implementation and formulas assume."""
    import torch

    probs, _k_full, v_full, _capped = _attention_probs(q, k, v, sinks, indices, is_causal,
                                                       window, chunk, scale, softcap, alibi)
    kv_len = k.shape[2]
    out = torch.matmul(probs[..., :kv_len], v_full)
    lse = torch.zeros(q.shape[0], q.shape[1], q.shape[2], dtype=torch.float32, device=q.device)
    return out.transpose(1, 2).to(q.dtype).contiguous(), lse


def _attention_backward_reference(grad_out, q, k, v, out, sinks, indices, is_causal, window,
                                  chunk, scale, softcap, alibi=False):
    """Closed-form gradients of :func:`_attention_reference` (the flash-attention backward)."""
    import torch

    probs, k_full, v_full, capped = _attention_probs(q, k, v, sinks, indices, is_causal,
                                                     window, chunk, scale, softcap, alibi)
    kv_len = k.shape[2]
    group = q.shape[1] // k.shape[1]
    p = probs[..., :kv_len]
    d_out = grad_out.to(p.dtype).transpose(1, 2)                  # [B, Hq, Sq, Dv]
    o = out.to(p.dtype).transpose(1, 2)
    d_v_full = torch.matmul(p.transpose(-1, -2), d_out)          # P^T dO
    d_p = torch.matmul(d_out, v_full.transpose(-1, -2))          # dO V^T
    row = (d_out * o).sum(-1, keepdim=True)                      # D = rowsum(dO * O)
    d_s = p * (d_p - row)
    if capped is not None:
        d_s = d_s * (1 - capped * capped)
    d_s = d_s * scale
    d_q = torch.matmul(d_s, k_full)
    d_k_full = torch.matmul(d_s.transpose(-1, -2), q.to(p.dtype))

    def fold(t):  # sum the query heads that share one KV head
        b, _h, s, d = t.shape
        return t.reshape(b, k.shape[1], group, s, d).sum(2)

    d_sinks = q.new_empty((0,))
    if sinks is not None:
        d_sinks = -(probs[..., kv_len] * row.squeeze(-1)).sum(dim=(0, 2)).to(sinks.dtype)
    return (d_q.to(q.dtype), fold(d_k_full).to(k.dtype), fold(d_v_full).to(v.dtype), d_sinks)


def _define_attention() -> None:
    import torch

    @torch.library.custom_op(f"{NAMESPACE}::attention", mutates_args=(),
                             schema=_SCHEMAS["attention"])
    def attention(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor | None,
                  indices: Tensor | None, is_causal: bool, window: int, chunk: int,
                  scale: float, softcap: float, alibi: bool = False) -> tuple[Tensor, Tensor]:
        out, lse = _attention_reference(q, k, v, sinks, indices, is_causal, window, chunk,
                                        scale, softcap, alibi)
        return out, lse.contiguous()

    @attention.register_fake
    def _(q, k, v, sinks, indices, is_causal, window, chunk, scale, softcap, alibi=False):
        b, hq, sq, _d = q.shape
        out = q.new_empty((b, sq, hq, v.shape[-1]))
        lse = q.new_empty((b, hq, sq), dtype=torch.float32)
        return out, lse

    @torch.library.custom_op(f"{NAMESPACE}::attention_backward", mutates_args=(),
                             schema=_SCHEMAS["attention_backward"])
    def attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                           lse: Tensor, sinks: Tensor | None, indices: Tensor | None,
                           is_causal: bool, window: int, chunk: int, scale: float,
                           softcap: float, alibi: bool = False
                           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return _attention_backward_reference(grad_out, q, k, v, out, sinks, indices,
                                             is_causal, window, chunk, scale, softcap, alibi)

    @attention_backward.register_fake
    def _(grad_out, q, k, v, out, lse, sinks, indices, is_causal, window, chunk, scale,
          softcap, alibi=False):
        dsinks = sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty((0,))
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks

    def setup_context(ctx, inputs, output):
        q, k, v, sinks, indices, is_causal, window, chunk, scale, softcap, *alibi = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, sinks, indices)
        # the alibi flag travels only when set, so other models' nodes keep their attrs
        ctx.params = (is_causal, window, chunk, scale, softcap,
                      *((True,) if alibi and alibi[0] else ()))
        ctx.has_sinks = sinks is not None
        ctx.n_inputs = len(inputs)

    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse, sinks, indices = ctx.saved_tensors
        dq, dk, dv, dsinks = torch.ops.zrt.attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, sinks, indices, *ctx.params)
        return (dq, dk, dv, (dsinks if ctx.has_sinks else None),
                *(None,) * (ctx.n_inputs - 4))

    attention.register_autograd(backward, setup_context=setup_context)


# -- MoE dispatch / combine --------------------------------------------------------------


def _define_moe() -> None:
    import torch

    @torch.library.custom_op(f"{NAMESPACE}::moe_dispatch", mutates_args=(),
                             schema=_SCHEMAS["moe_dispatch"])
    def moe_dispatch(hidden: Tensor, topk_index: Tensor, num_experts: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
        top_k = topk_index.shape[-1]
        row_expert, row_token = torch.sort(topk_index.reshape(-1), stable=True)
        routed = hidden.index_select(0, torch.div(row_token, top_k, rounding_mode="floor"))
        return routed, row_token, row_expert

    @moe_dispatch.register_fake
    def _(hidden, topk_index, num_experts):
        rows = topk_index.numel()
        return (hidden.new_empty((rows, hidden.shape[-1])),
                topk_index.new_empty((rows,), dtype=torch.int64),
                topk_index.new_empty((rows,), dtype=torch.int64))

    @torch.library.custom_op(f"{NAMESPACE}::moe_dispatch_backward", mutates_args=(),
                             schema=_SCHEMAS["moe_dispatch_backward"])
    def moe_dispatch_backward(grad_routed: Tensor, row_token: Tensor, tokens: int,
                              top_k: int) -> Tensor:
        grad = grad_routed.new_zeros((tokens, grad_routed.shape[-1]))
        grad.index_add_(0, torch.div(row_token, top_k, rounding_mode="floor"), grad_routed)
        return grad

    @moe_dispatch_backward.register_fake
    def _(grad_routed, row_token, tokens, top_k):
        return grad_routed.new_empty((tokens, grad_routed.shape[-1]))

    def dispatch_setup(ctx, inputs, output):
        hidden, topk_index, _num_experts = inputs
        ctx.save_for_backward(output[1])
        ctx.shape = (hidden.shape[0], topk_index.shape[-1])

    def dispatch_backward(ctx, grad_routed, _g_token, _g_expert):
        (row_token,) = ctx.saved_tensors
        tokens, top_k = ctx.shape
        grad = torch.ops.zrt.moe_dispatch_backward(grad_routed.contiguous(), row_token,
                                                   tokens, top_k)
        return grad, None, None

    moe_dispatch.register_autograd(dispatch_backward, setup_context=dispatch_setup)

    @torch.library.custom_op(f"{NAMESPACE}::moe_combine", mutates_args=(),
                             schema=_SCHEMAS["moe_combine"])
    def moe_combine(expert_out: Tensor, row_token: Tensor, topk_weights: Tensor) -> Tensor:
        tokens, top_k = topk_weights.shape
        slots = expert_out.new_zeros((tokens * top_k, expert_out.shape[-1]))
        slots.index_copy_(0, row_token, expert_out)
        weighted = slots.view(tokens, top_k, -1) * topk_weights.unsqueeze(-1).to(slots.dtype)
        return weighted.sum(dim=1)

    @moe_combine.register_fake
    def _(expert_out, row_token, topk_weights):
        return expert_out.new_empty((topk_weights.shape[0], expert_out.shape[-1]))

    @torch.library.custom_op(f"{NAMESPACE}::moe_combine_backward", mutates_args=(),
                             schema=_SCHEMAS["moe_combine_backward"])
    def moe_combine_backward(grad: Tensor, expert_out: Tensor, row_token: Tensor,
                             topk_weights: Tensor) -> tuple[Tensor, Tensor]:
        tokens, top_k = topk_weights.shape
        per_slot = grad.unsqueeze(1) * topk_weights.unsqueeze(-1).to(grad.dtype)
        grad_out = per_slot.reshape(tokens * top_k, -1).index_select(0, row_token)
        slots = expert_out.new_zeros((tokens * top_k, expert_out.shape[-1]))
        slots.index_copy_(0, row_token, expert_out)
        grad_w = (slots.view(tokens, top_k, -1) * grad.unsqueeze(1)).sum(-1)
        return grad_out, grad_w.to(topk_weights.dtype)

    @moe_combine_backward.register_fake
    def _(grad, expert_out, row_token, topk_weights):
        return expert_out.new_empty(expert_out.shape), topk_weights.new_empty(topk_weights.shape)

    def combine_setup(ctx, inputs, output):
        expert_out, row_token, topk_weights = inputs
        ctx.save_for_backward(expert_out, row_token, topk_weights)

    def combine_backward(ctx, grad):
        expert_out, row_token, topk_weights = ctx.saved_tensors
        g_out, g_w = torch.ops.zrt.moe_combine_backward(grad.contiguous(), expert_out,
                                                        row_token, topk_weights)
        return g_out, None, g_w

    moe_combine.register_autograd(combine_backward, setup_context=combine_setup)
