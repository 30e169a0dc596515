"""Attention kernels: the unfused (pre-FlashAttention) attention as its GEMMs, softmax and
dropout, in place of the fused node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from zrt_core.errors import SpecError
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.training.common import _next_id, _tensor_ids

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


# -- attention kernels --------------------------------------------------------------------------

#: ``attrs["core_attention"]`` marks the nodes of an unfused attention core (what selective
#: recompute re-runs).
CORE_ATTENTION_ATTR = "core_attention"


@frozen
class UnfusedAttention:
    """Megatron-LM's attention core before FlashAttention (2021-22, Narayanan et al. and
    Korthikanti et al.): the fused attention node becomes the kernels that ran then.

    Forward (per rank: ``B = b × heads`` products of ``s_q × s_k``, head dim ``d``):
    ``baddbmm`` QKᵀ over the full square (the causal mask is applied after, in the
    softmax: ``2·B·s_q·s_k·d`` FLOPs), the fused scale-mask-softmax (reads and writes the
    ``s_q × s_k`` scores), attention dropout (writes the probabilities and a one-byte mask)
    and ``bmm`` PV. Kept for backward: the softmax output, the mask and the dropped-out
    probabilities — Korthikanti's ``5·a·s²·b`` bytes per layer. Backward: dP = dO·Vᵀ,
    dV = Pᵀ·dO, the dropout and softmax backwards, dQ = dS·K and dK = dSᵀ·Q.

    All new nodes carry ``attrs["core_attention"] = True``: selective recompute re-runs
    them. Apply to the forward and backward graphs together (:meth:`apply_pair`) so the
    backward reads the tensors the forward saved.

    :param dropout: attention dropout probability (``attn_pdrop``); 0 drops the dropout
        kernels.
    """

    dropout: float = 0.0
    name: str = "unfused_attention"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        raise SpecError("UnfusedAttention rewrites forward and backward together",
                        "call apply_pair(forward, backward)")

    def apply_pair(self, forward: OpGraph, backward: OpGraph) -> tuple[OpGraph, OpGraph]:
        from zrt_core.cost.opdims import attention_dims

        tensor_next = _tensor_ids((forward, backward))
        saved: dict[Any, tuple[TensorMeta, TensorMeta | None, TensorMeta]] = {}
        fwd_nodes: list[OpNode] = []
        next_id = _next_id(forward)
        for n in forward.nodes:
            dims = attention_dims(n) if n.category == Category.ATTENTION else None
            if dims is None or "backward" in n.op:
                fwd_nodes.append(n)
                continue
            B, sq, sk, d, dv = dims.b * dims.h, dims.s_q, dims.s_kv, dims.d, dims.d_v or dims.d
            dtype = n.inputs[0].dtype
            scores = TensorMeta((dims.b, dims.h, sq, sk), dtype, tensor_id=tensor_next)
            probs = TensorMeta((dims.b, dims.h, sq, sk), dtype, tensor_id=tensor_next + 1)
            mask = TensorMeta((dims.b, dims.h, sq, sk), "bool", tensor_id=tensor_next + 2) \
                if self.dropout else None
            dropped = TensorMeta((dims.b, dims.h, sq, sk), dtype, tensor_id=tensor_next + 3) \
                if self.dropout else probs
            tensor_next += 4
            q, k, v = n.inputs[0], n.inputs[1], n.inputs[2]
            # the batched GEMMs write [b, heads, s, d] (B = b·heads products of s × d), whatever
            # layout the fused node's tensors had (FlashAttention's is [b, s, heads, d]): the
            # cost model reads a GEMM's m, n and batch from its output
            out = _bhsd(n.outputs[0], dims.b, dims.h, sq, dv)
            attrs = {k2: val for k2, val in n.attrs.items() if k2 != "seq_nr"}
            attrs[CORE_ATTENTION_ATTR] = True
            e = B * sq * sk
            made = [
                self._node(next_id, "aten.baddbmm.default", Category.MATMUL, n, (q, k),
                           (scores,), flops=2 * B * sq * sk * d, attrs=attrs),
                self._node(next_id + 1, "fused.scale_mask_softmax", Category.SOFTMAX, n,
                           (scores,), (probs,), flops=5 * e, attrs=attrs),
            ]
            if self.dropout:
                made.append(self._node(next_id + 2, "aten.native_dropout.default",
                                       Category.ELEMENTWISE, n, (probs,), (dropped, mask),
                                       flops=2 * e, attrs=attrs))
            made.append(self._node(next_id + 3, "aten.bmm.default", Category.MATMUL, n,
                                   (dropped, v), (out,), flops=2 * B * sq * sk * dv,
                                   attrs={**attrs, "seq_nr": n.attrs.get("seq_nr")}))
            next_id += 4
            fwd_nodes.extend(made)
            saved[n.attrs.get("seq_nr")] = (probs, mask, dropped)
        bwd_nodes: list[OpNode] = []
        next_id = _next_id(backward)
        for n in backward.nodes:
            dims = attention_dims(n) if n.category == Category.ATTENTION else None
            key = n.attrs.get("fwd_seq_nr")
            if dims is None or key not in saved:
                bwd_nodes.append(n)
                continue
            probs, mask, dropped = saved[key]
            B, sq, sk, d, dv = dims.b * dims.h, dims.s_q, dims.s_kv, dims.d, dims.d_v or dims.d
            grad_out, q, k, v = n.inputs[0], n.inputs[1], n.inputs[2], n.inputs[3]
            dq = _bhsd(n.outputs[0], dims.b, dims.h, sq, d)
            dk = _bhsd(n.outputs[1], dims.b, dims.h, sk, d) if len(n.outputs) > 1 else dq
            dvt = _bhsd(n.outputs[2], dims.b, dims.h, sk, dv) if len(n.outputs) > 2 else dq
            dtype = q.dtype
            shape = (dims.b, dims.h, sq, sk)
            d_dropped = TensorMeta(shape, dtype, tensor_id=tensor_next)
            d_probs = TensorMeta(shape, dtype, tensor_id=tensor_next + 1)
            d_scores = TensorMeta(shape, dtype, tensor_id=tensor_next + 2)
            tensor_next += 3
            attrs = dict(n.attrs)
            attrs[CORE_ATTENTION_ATTR] = True
            e = B * sq * sk
            made = [
                self._node(next_id, "aten.bmm.default", Category.MATMUL, n, (grad_out, v),
                           (d_dropped,), flops=2 * B * sq * sk * dv, attrs=attrs),
                self._node(next_id + 1, "aten.bmm.default", Category.MATMUL, n,
                           (dropped, grad_out), (dvt,), flops=2 * B * sq * sk * dv,
                           attrs=attrs),
            ]
            if self.dropout and mask is not None:
                made.append(self._node(next_id + 2, "aten.native_dropout_backward.default",
                                       Category.ELEMENTWISE, n, (d_dropped, mask),
                                       (d_probs,), flops=e, attrs=attrs))
            else:
                d_probs = d_dropped
            made.extend([
                self._node(next_id + 3, "fused.scale_mask_softmax_backward",
                           Category.SOFTMAX, n, (d_probs, probs), (d_scores,), flops=4 * e,
                           attrs=attrs),
                self._node(next_id + 4, "aten.bmm.default", Category.MATMUL, n,
                           (d_scores, k), (dq,), flops=2 * B * sq * sk * d, attrs=attrs),
                self._node(next_id + 5, "aten.bmm.default", Category.MATMUL, n,
                           (d_scores, q), (dk,), flops=2 * B * sq * sk * d, attrs=attrs),
            ])
            next_id += 6
            bwd_nodes.extend(made)
        if not saved:
            return forward, backward
        meta = {"attention": "unfused"}
        return (evolve(forward.with_nodes(fwd_nodes, _rewired(fwd_nodes)),
                       meta={**forward.meta, **meta}),
                evolve(backward.with_nodes(bwd_nodes, _rewired(bwd_nodes)),
                       meta={**backward.meta, **meta}))

    @staticmethod
    def _node(node_id: int, op: str, category: str, like: OpNode,
              inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...], *, flops: int,
              attrs: Mapping[str, Any]) -> OpNode:
        read = sum(t.nbytes for t in inputs)
        written = sum(t.nbytes for t in outputs)
        return OpNode(id=node_id, op=op, category=category, phase=like.phase, inputs=inputs,
                      outputs=outputs, module_path=like.module_path,
                      module_class=like.module_class, layer_index=like.layer_index,
                      layer_kind=like.layer_kind, flops=int(flops), bytes_read=int(read),
                      bytes_written=int(written), formula=op,
                      attrs={k: v for k, v in attrs.items() if v is not None})


def _bhsd(t: TensorMeta, b: int, h: int, s: int, d: int) -> TensorMeta:
    """``t`` (same storage, same id) seen as ``[b, heads, s, d]`` when it holds that many
    values (a fused attention node's ``[b, s, heads, d]`` output, say)."""
    if t.numel != b * h * s * d or t.shape == (b, h, s, d):
        return t
    return evolve(t, shape=(b, h, s, d))


def _rewired(nodes: Sequence[OpNode]) -> list[tuple[int, int]]:
    """Dataflow edges from tensor ids: each input to the last node that produced it."""
    producer: dict[int, int] = {}
    edges: dict[tuple[int, int], None] = {}
    for n in nodes:
        for t in n.inputs:
            p = producer.get(t.tensor_id) if t.tensor_id is not None else None
            if p is not None and p != n.id:
                edges[(p, n.id)] = None
        for t in n.outputs:
            if t.tensor_id is not None:
                producer[t.tensor_id] = n.id
    return list(edges)
