"""DeepSeek-V4's hyper-connection stream mixing as the fused kernels training runs
(Megatron-Core's ``fused_mhc_kernels``: ``h_aggregate`` and ``h_post_bda``), as custom ops.

``hc_aggregate(streams, pre)``
    The collapse of ``n`` residual streams into one block input: ``out[..., d] =
    Σ_j pre[..., j] · streams[..., j, d]``, in the streams' dtype (transformers'
    ``(pre.unsqueeze(-1) * streams).sum(dim=2).to(dtype)``). ``streams [B, S, n, D]``,
    ``pre [B, S, n]`` (float32).
``hc_post(streams, x, post, comb)``
    The expansion of a block's output back into ``n`` streams plus the residual mix:
    ``out[..., k, d] = post[..., k] · x[..., d] + Σ_j comb[..., j, k] · streams[..., j, d]``
    (transformers' ``post.unsqueeze(-1) * x.unsqueeze(-2) + comb.transpose(-1, -2) @
    streams``, with ``post``/``comb`` cast to the streams' dtype first). ``x [B, S, D]``,
    ``post [B, S, n]``, ``comb [B, S, n, n]``.

transformers spells the pair as a broadcast multiply, a reduction, casts and a batched
``[n × n] @ [n × D]`` matmul per token: each a pass over the ``n·D``-wide streams, and the
matmul a cuBLAS call whose 128-wide tiles hold ``n`` = 4 rows. Megatron-Core's fused mHC
(``use_fused_mhc``, which Megatron-Bridge's DeepSeek-V4 provider turns on for Blackwell)
runs each as one memory-bound kernel: read the streams once, write the result once. Each
op's backward is one op too (the kernels' backward passes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

NAMESPACE = "deepseek"

SCHEMAS = {
    "hc_aggregate": "(Tensor streams, Tensor pre) -> Tensor",
    "hc_aggregate_backward": "(Tensor grad_out, Tensor streams, Tensor pre) -> (Tensor, Tensor)",
    "hc_post": "(Tensor streams, Tensor x, Tensor post, Tensor comb) -> Tensor",
    "hc_post_backward": "(Tensor grad_out, Tensor streams, Tensor x, Tensor post, Tensor comb) -> (Tensor, Tensor, Tensor, Tensor)",
}


def hc_aggregate_reference(streams, pre):
    """transformers' collapse, in its order of operations."""
    return (pre.unsqueeze(-1) * streams).sum(dim=2).to(streams.dtype)


def hc_post_reference(streams, x, post, comb):
    """transformers' expansion and residual mix, in its order of operations."""
    import torch

    dtype = streams.dtype
    return post.to(dtype).unsqueeze(-1) * x.unsqueeze(-2) + torch.matmul(
        comb.to(dtype).transpose(-1, -2), streams)


def _vjp(fn, primals, grad_out):
    import torch

    _out, vjp = torch.func.vjp(fn, *primals)
    return tuple(g.contiguous() for g in vjp(grad_out))


def define_hc_mix() -> None:
    """Define the four ``deepseek::hc_*`` mixing ops (called once by
    :func:`zrt_deepseek.ops.ensure_ops`)."""
    import torch

    @torch.library.custom_op(f"{NAMESPACE}::hc_aggregate", mutates_args=(),
                             schema=SCHEMAS["hc_aggregate"])
    def hc_aggregate(streams: Tensor, pre: Tensor) -> Tensor:
        return hc_aggregate_reference(streams, pre).contiguous()

    @hc_aggregate.register_fake
    def _(streams, pre):
        return streams.new_empty((*streams.shape[:-2], streams.shape[-1]))

    @torch.library.custom_op(f"{NAMESPACE}::hc_aggregate_backward", mutates_args=(),
                             schema=SCHEMAS["hc_aggregate_backward"])
    def hc_aggregate_backward(grad_out: Tensor, streams: Tensor, pre: Tensor
                              ) -> tuple[Tensor, Tensor]:
        return _vjp(hc_aggregate_reference, (streams, pre), grad_out)

    @hc_aggregate_backward.register_fake
    def _(grad_out, streams, pre):
        return streams.new_empty(streams.shape), pre.new_empty(pre.shape)

    def save_inputs(ctx, inputs, output):  # both backward ops read every input
        ctx.save_for_backward(*inputs)

    def aggregate_backward(ctx, grad_out):
        streams, pre = ctx.saved_tensors
        return torch.ops.deepseek.hc_aggregate_backward(grad_out.contiguous(), streams, pre)

    hc_aggregate.register_autograd(aggregate_backward, setup_context=save_inputs)

    @torch.library.custom_op(f"{NAMESPACE}::hc_post", mutates_args=(),
                             schema=SCHEMAS["hc_post"])
    def hc_post(streams: Tensor, x: Tensor, post: Tensor, comb: Tensor) -> Tensor:
        return hc_post_reference(streams, x, post, comb).contiguous()

    @hc_post.register_fake
    def _(streams, x, post, comb):
        return streams.new_empty(streams.shape)

    @torch.library.custom_op(f"{NAMESPACE}::hc_post_backward", mutates_args=(),
                             schema=SCHEMAS["hc_post_backward"])
    def hc_post_backward(grad_out: Tensor, streams: Tensor, x: Tensor, post: Tensor,
                         comb: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return _vjp(hc_post_reference, (streams, x, post, comb), grad_out)

    @hc_post_backward.register_fake
    def _(grad_out, streams, x, post, comb):
        return (streams.new_empty(streams.shape), x.new_empty(x.shape),
                post.new_empty(post.shape), comb.new_empty(comb.shape))

    def post_backward(ctx, grad_out):
        streams, x, post, comb = ctx.saved_tensors
        return torch.ops.deepseek.hc_post_backward(grad_out.contiguous(), streams, x, post,
                                                   comb)

    hc_post.register_autograd(post_backward, setup_context=save_inputs)
