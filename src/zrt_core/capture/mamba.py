"""Mamba-2 mixers as the kernels production engines run: one SSD scan node, one state update.

HF's reference ``torch_forward`` for Mamba-2 (Nemotron-H) spells the chunked SSD scan as
~40 einsums, exponentials and masks that materialise ``[B, chunks, H, Q, Q]`` tensors: at
4096 tokens one layer moves ~18 GB, where ``mamba_chunk_scan_combined`` (what vLLM,
Megatron and NeMo run) reads ``x, dt, B, C`` and writes ``y`` and the final state. Inside
the ``zrt.mamba_kernels`` patch's context the modeling module's kernel entry points
(``mamba2_chunk_scan``, ``mamba2_selective_state_update`` — the names transformers' kernel
hub swaps) route to two ``zrt::`` operators:

``ssd_chunk_scan(x [B,S,H,P], dt [B,S,H], A [H], B [B,S,G,N], C [B,S,G,N], D?, dt_bias?,
initial_states? [B,H,P,N], chunk_size, dt_softplus, dt_min, dt_max)``
    → ``(y [B,S,H,P], final_states [B,H,P,N])``; its backward
    ``ssd_chunk_scan_backward(grad_y, grad_final, x, ...)`` returns the gradients of
    ``x, dt, A, B, C, D, dt_bias`` (empty for an absent ``D`` / ``dt_bias``).
``ssm_state_update(state! [B,H,P,N], x [B,H,P], dt, A, B [B,G,N], C, D?, dt_bias?,
dt_softplus)``
    → ``y [B,H,P]``, updating ``state`` in place (decode).

Real implementations call transformers' own reference functions (and ``torch.func.vjp`` of
them for backward), so a small model can be checked numerically against HF.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from zrt_core.capture.ops import define_once, swapped_globals

# model_type → modeling module whose Mamba-2 mixer calls the kernel entry points by name
MAMBA_MODULES = {"nemotron_h": "transformers.models.nemotron_h.modeling_nemotron_h",
                 "bamba": "transformers.models.bamba.modeling_bamba",
                 "granitemoehybrid":
                     "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
                 "falcon_h1": "transformers.models.falcon_h1.modeling_falcon_h1"}

_ENTRY_POINTS = ("mamba2_chunk_scan", "mamba2_selective_state_update")
_REFERENCE: dict[str, Any] = {}

_SCHEMAS = {
    "ssd_chunk_scan": "(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, "
                      "Tensor? dt_bias, Tensor? initial_states, int chunk_size, "
                      "bool dt_softplus, float dt_min, float dt_max) -> (Tensor, Tensor)",
    "ssd_chunk_scan_backward": "(Tensor grad_y, Tensor grad_final, Tensor x, Tensor dt, "
                               "Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? dt_bias, "
                               "Tensor? initial_states, int chunk_size, bool dt_softplus, "
                               "float dt_min, float dt_max) -> (Tensor, Tensor, Tensor, "
                               "Tensor, Tensor, Tensor, Tensor)",
    "ssm_state_update": "(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, "
                        "Tensor C, Tensor? D, Tensor? dt_bias, bool dt_softplus) -> Tensor",
}


def _reference(name: str) -> Any:
    """transformers' own implementation of an entry point (the unpatched global)."""
    if name not in _REFERENCE:
        module = importlib.import_module(MAMBA_MODULES["nemotron_h"])
        _REFERENCE[name] = getattr(module, name)
    return _REFERENCE[name]


def _scan_reference(x, dt, A, B, C, D, dt_bias, initial_states, chunk_size, dt_softplus,
                    dt_min, dt_max):
    y, final = _reference("mamba2_chunk_scan")(
        x, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias,
        initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max),
        return_final_states=True)
    return y.to(x.dtype), final


def _define() -> None:
    import torch

    @torch.library.custom_op("zrt::ssd_chunk_scan", mutates_args=(),
                             schema=_SCHEMAS["ssd_chunk_scan"])
    def ssd_chunk_scan(x, dt, A, B, C, D, dt_bias, initial_states, chunk_size, dt_softplus,
                       dt_min, dt_max):
        y, final = _scan_reference(x, dt, A, B, C, D, dt_bias, initial_states, chunk_size,
                                   dt_softplus, dt_min, dt_max)
        return y.contiguous(), final.contiguous()

    @ssd_chunk_scan.register_fake
    def _(x, dt, A, B, C, D, dt_bias, initial_states, chunk_size, dt_softplus, dt_min,
          dt_max):
        b, _s, h, p = x.shape
        final = x.new_empty((b, h, p, B.shape[-1]), dtype=torch.float32)
        return x.new_empty(x.shape), final

    @torch.library.custom_op("zrt::ssd_chunk_scan_backward", mutates_args=(),
                             schema=_SCHEMAS["ssd_chunk_scan_backward"])
    def ssd_chunk_scan_backward(grad_y, grad_final, x, dt, A, B, C, D, dt_bias,
                                initial_states, chunk_size, dt_softplus, dt_min, dt_max):
        has_d, has_bias = D is not None, dt_bias is not None
        empty = x.new_empty((0,))

        def run(x, dt, A, B, C, d, bias):
            return _scan_reference(x, dt, A, B, C, d if has_d else None,
                                   bias if has_bias else None, initial_states, chunk_size,
                                   dt_softplus, dt_min, dt_max)

        _out, vjp = torch.func.vjp(run, x, dt, A, B, C, D if has_d else empty,
                                  dt_bias if has_bias else empty)
        return tuple(g.contiguous() for g in vjp((grad_y, grad_final)))

    @ssd_chunk_scan_backward.register_fake
    def _(grad_y, grad_final, x, dt, A, B, C, D, dt_bias, initial_states, chunk_size,
          dt_softplus, dt_min, dt_max):
        empty = x.new_empty((0,))
        return (x.new_empty(x.shape), dt.new_empty(dt.shape), A.new_empty(A.shape),
                B.new_empty(B.shape), C.new_empty(C.shape),
                D.new_empty(D.shape) if D is not None else empty,
                dt_bias.new_empty(dt_bias.shape) if dt_bias is not None else empty)

    def setup_context(ctx, inputs, output):
        (x, dt, A, B, C, D, dt_bias, initial_states, chunk_size, dt_softplus, dt_min,
         dt_max) = inputs
        ctx.save_for_backward(x, dt, A, B, C, D, dt_bias, initial_states)
        ctx.params = (chunk_size, dt_softplus, dt_min, dt_max)
        ctx.present = (D is not None, dt_bias is not None)

    def backward(ctx, grad_y, grad_final):
        x, dt, A, B, C, D, dt_bias, initial_states = ctx.saved_tensors
        if grad_final is None:
            grad_final = torch.zeros((x.shape[0], x.shape[2], x.shape[3], B.shape[-1]),
                                     dtype=torch.float32, device=x.device)
        if grad_y is None:
            grad_y = torch.zeros_like(x)
        gx, gdt, ga, gb, gc, gd, gbias = torch.ops.zrt.ssd_chunk_scan_backward(
            grad_y.contiguous(), grad_final.contiguous(), x, dt, A, B, C, D, dt_bias,
            initial_states, *ctx.params)
        has_d, has_bias = ctx.present
        return (gx, gdt, ga, gb, gc, gd if has_d else None, gbias if has_bias else None,
                None, None, None, None, None)

    ssd_chunk_scan.register_autograd(backward, setup_context=setup_context)

    @torch.library.custom_op("zrt::ssm_state_update", mutates_args=("state",),
                             schema=_SCHEMAS["ssm_state_update"])
    def ssm_state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus):
        return _reference("mamba2_selective_state_update")(
            state, x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus)

    @ssm_state_update.register_fake
    def _(state, x, dt, A, B, C, D, dt_bias, dt_softplus):
        return x.new_empty(x.shape)


def _chunk_scan(hidden_states: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int,
                D: Any = None, dt_bias: Any = None, initial_states: Any = None,
                dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                return_final_states: bool = False, **_kwargs: Any) -> Any:
    """``mamba2_chunk_scan``'s signature, one ``zrt.ssd_chunk_scan`` node."""
    import torch

    y, final = torch.ops.zrt.ssd_chunk_scan(hidden_states, dt, A, B, C, D, dt_bias,
                                            initial_states, int(chunk_size),
                                            bool(dt_softplus), float(dt_limit[0]),
                                            float(dt_limit[1]))
    return (y, final) if return_final_states else y


def _state_update(state: Any, hidden_states: Any, dt: Any, A: Any, B: Any, C: Any,
                  D: Any = None, dt_bias: Any = None, dt_softplus: bool = False,
                  z: Any = None, **_kwargs: Any) -> Any:
    """``mamba2_selective_state_update``'s signature, one ``zrt.ssm_state_update`` node."""
    import torch

    out = torch.ops.zrt.ssm_state_update(state, hidden_states, dt, A, B, C, D, dt_bias,
                                         bool(dt_softplus))
    if z is not None:
        out = out * torch.nn.functional.silu(z)
    return out


#: Define the Mamba ``zrt::`` operators once per process (idempotent).
ensure_mamba_ops = define_once(_define)

_REPLACEMENTS = {"mamba2_chunk_scan": _chunk_scan,
                 "mamba2_selective_state_update": _state_update}


def uses_mamba_kernels(config: Any) -> bool:
    return getattr(config, "model_type", "") in MAMBA_MODULES


@contextlib.contextmanager
def mamba_kernels_context(config: Any, _options: Any) -> Iterator[None]:
    """Route the family's Mamba-2 kernel entry points to the ``zrt::`` ops while open."""
    for name in _ENTRY_POINTS:  # the unpatched references, before any patch is open
        _reference(name)
    ensure_mamba_ops()
    with swapped_globals(MAMBA_MODULES[config.model_type], _REPLACEMENTS):
        yield
