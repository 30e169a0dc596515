"""Gated DeltaNet mixers (Qwen3-Next, Qwen3.5 linear attention) as the kernels production
runs: one chunked gated-delta-rule node, one recurrent step.

transformers' torch fallback ``torch_chunk_gated_delta_rule`` spells the chunked algorithm
as ~30 fp32 tensor ops per call plus ~6 more per 64-token chunk in a Python loop: at 4,096
tokens one layer is several hundred kernels and materialises ``[B, H, chunks, 64, 64]``
decay and score tensors in fp32. What Megatron-Core, vLLM, SGLang and TensorRT-LLM run is
flash-linear-attention's ``chunk_gated_delta_rule`` (Triton kernels that keep the chunk
tiles on chip: read q, k, v, g, β, write o and the final state) and, for one decode token,
``fused_recurrent_gated_delta_rule``. Inside the ``zrt.deltanet_kernels`` patch's context the
modeling modules' entry points (``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``: the names transformers' kernel hub swaps for FLA's)
route to three ``zrt::`` operators:

``gated_delta_chunk(q [B,S,Hk,Dk], k, v [B,S,Hv,Dv], g [B,S,Hv], beta [B,S,Hv],
initial_state? [B,Hv,Dk,Dv], chunk_size, qk_l2norm)`` → ``(o [B,S,Hv,Dv], final_state
[B,Hv,Dk,Dv] fp32)``; its backward ``gated_delta_chunk_backward(grad_o, grad_final?, q, k,
v, g, beta, initial_state?, chunk_size, qk_l2norm)`` → the gradients of q, k, v, g, β.
``gated_delta_recurrent(q [B,1,Hk,Dk], k, v, g, beta, initial_state?, qk_l2norm)`` → ``(o,
new_state)`` (decode).

Real implementations call transformers' own reference functions (``torch.func.vjp`` of the
chunked one for backward), so a small model can be checked numerically against HF.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from zrt_core.capture.ops import define_once, swapped_globals
from zrt_core.modelmath.flops import DELTANET_CHUNK

#: model_type → modeling module whose Gated DeltaNet calls the entry points by name
DELTANET_MODULES = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "qwen3_5_moe_text": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
}

_ENTRY_POINTS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
_REFERENCE: dict[str, Any] = {}

_SCHEMAS = {
    "gated_delta_chunk": "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
                         "Tensor? initial_state, int chunk_size, bool qk_l2norm) "
                         "-> (Tensor, Tensor)",
    "gated_delta_chunk_backward": "(Tensor grad_o, Tensor? grad_final, Tensor q, Tensor k, "
                                  "Tensor v, Tensor g, Tensor beta, Tensor? initial_state, "
                                  "int chunk_size, bool qk_l2norm) -> (Tensor, Tensor, "
                                  "Tensor, Tensor, Tensor)",
    "gated_delta_recurrent": "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
                             "Tensor? initial_state, bool qk_l2norm) -> (Tensor, Tensor)",
}


def _reference(name: str) -> Any:
    """transformers' own implementation of an entry point (the unpatched global of the
    Qwen3-Next module: the Qwen3.5 modules copy the same functions)."""
    if name not in _REFERENCE:
        module = importlib.import_module(DELTANET_MODULES["qwen3_next"])
        _REFERENCE[name] = getattr(module, name)
    return _REFERENCE[name]


def _state_shape(q: Any, v: Any) -> tuple[int, int, int, int]:
    return (q.shape[0], v.shape[2], q.shape[3], v.shape[3])


def _chunk_reference(q, k, v, g, beta, initial_state, chunk_size, qk_l2norm):
    o, final = _reference("torch_chunk_gated_delta_rule")(
        q, k, v, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
        output_final_state=True, use_qk_l2norm_in_kernel=qk_l2norm)
    return o, final


def _define() -> None:
    import torch

    @torch.library.custom_op("zrt::gated_delta_chunk", mutates_args=(),
                             schema=_SCHEMAS["gated_delta_chunk"])
    def gated_delta_chunk(q, k, v, g, beta, initial_state, chunk_size, qk_l2norm):
        o, final = _chunk_reference(q, k, v, g, beta, initial_state, chunk_size, qk_l2norm)
        return o.contiguous(), final.contiguous()

    @gated_delta_chunk.register_fake
    def _(q, k, v, g, beta, initial_state, chunk_size, qk_l2norm):
        return v.new_empty(v.shape), v.new_empty(_state_shape(q, v), dtype=torch.float32)

    @torch.library.custom_op("zrt::gated_delta_chunk_backward", mutates_args=(),
                             schema=_SCHEMAS["gated_delta_chunk_backward"])
    def gated_delta_chunk_backward(grad_o, grad_final, q, k, v, g, beta, initial_state,
                                   chunk_size, qk_l2norm):
        def run(q, k, v, g, beta):
            return _chunk_reference(q, k, v, g, beta, initial_state, chunk_size, qk_l2norm)

        out, vjp = torch.func.vjp(run, q, k, v, g, beta)
        if grad_final is None:
            grad_final = torch.zeros_like(out[1])
        return tuple(t.contiguous() for t in vjp((grad_o, grad_final)))

    @gated_delta_chunk_backward.register_fake
    def _(grad_o, grad_final, q, k, v, g, beta, initial_state, chunk_size, qk_l2norm):
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                g.new_empty(g.shape), beta.new_empty(beta.shape))

    def setup_context(ctx, inputs, output):
        q, k, v, g, beta, initial_state, chunk_size, qk_l2norm = inputs
        ctx.save_for_backward(q, k, v, g, beta, initial_state)
        ctx.params = (chunk_size, qk_l2norm)

    def backward(ctx, grad_o, grad_final):
        q, k, v, g, beta, initial_state = ctx.saved_tensors
        if grad_o is None:
            grad_o = torch.zeros_like(v)
        dq, dk, dv, dg, dbeta = torch.ops.zrt.gated_delta_chunk_backward(
            grad_o.contiguous(), None if grad_final is None else grad_final.contiguous(),
            q, k, v, g, beta, initial_state, *ctx.params)
        return dq, dk, dv, dg, dbeta, None, None, None

    gated_delta_chunk.register_autograd(backward, setup_context=setup_context)

    @torch.library.custom_op("zrt::gated_delta_recurrent", mutates_args=(),
                             schema=_SCHEMAS["gated_delta_recurrent"])
    def gated_delta_recurrent(q, k, v, g, beta, initial_state, qk_l2norm):
        o, state = _reference("torch_recurrent_gated_delta_rule")(
            q, k, v, g=g, beta=beta, initial_state=initial_state, output_final_state=True,
            use_qk_l2norm_in_kernel=qk_l2norm)
        return o.contiguous(), state.contiguous()

    @gated_delta_recurrent.register_fake
    def _(q, k, v, g, beta, initial_state, qk_l2norm):
        return v.new_empty(v.shape), v.new_empty(_state_shape(q, v), dtype=torch.float32)


def _chunk(query: Any, key: Any, value: Any, g: Any, beta: Any, chunk_size: int = DELTANET_CHUNK,
           initial_state: Any = None, output_final_state: bool = False,
           use_qk_l2norm_in_kernel: bool = False, **_kwargs: Any) -> tuple[Any, Any]:
    """``torch_chunk_gated_delta_rule``'s signature, one ``zrt.gated_delta_chunk`` node."""
    import torch

    o, final = torch.ops.zrt.gated_delta_chunk(query, key, value, g, beta, initial_state,
                                               int(chunk_size), bool(use_qk_l2norm_in_kernel))
    return o, (final if output_final_state else None)


def _recurrent(query: Any, key: Any, value: Any, g: Any, beta: Any, initial_state: Any = None,
               output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
               **_kwargs: Any) -> tuple[Any, Any]:
    """``torch_recurrent_gated_delta_rule``'s signature, one ``zrt.gated_delta_recurrent``
    node."""
    import torch

    o, state = torch.ops.zrt.gated_delta_recurrent(query, key, value, g, beta, initial_state,
                                                   bool(use_qk_l2norm_in_kernel))
    return o, (state if output_final_state else None)


#: Define the Gated DeltaNet ``zrt::`` operators once per process (idempotent).
ensure_deltanet_ops = define_once(_define)

_REPLACEMENTS = {"torch_chunk_gated_delta_rule": _chunk,
                 "torch_recurrent_gated_delta_rule": _recurrent}


def uses_deltanet_kernels(config: Any) -> bool:
    return getattr(config, "model_type", "") in DELTANET_MODULES


@contextlib.contextmanager
def deltanet_kernels_context(config: Any, _options: Any) -> Iterator[None]:
    """Route the family's Gated DeltaNet entry points to the ``zrt::`` ops while open."""
    for name in _ENTRY_POINTS:  # the unpatched references, before any patch is open
        _reference(name)
    ensure_deltanet_ops()
    with swapped_globals(DELTANET_MODULES[config.model_type], _REPLACEMENTS):
        yield
