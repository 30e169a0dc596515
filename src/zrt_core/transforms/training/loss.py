"""The loss: Megatron's unfused vocabulary-parallel cross-entropy as its fp32 passes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.training.common import _next_id

if TYPE_CHECKING:
    pass


# -- the loss ---------------------------------------------------------------------------------

#: Megatron-Core's ``vocab_parallel_cross_entropy`` without ``--cross-entropy-loss-fusion``:
#: the kernels over the ``[tokens, vocab/tp]`` logits, as (op, bytes read, bytes written per
#: logit). Forward: ``logits.float()``, the max, ``-= max`` in place, ``exp`` in place, the
#: sum, the softmax ``/= sum`` in place (kept for backward); backward: ``softmax − onehot``
#: times the incoming gradient in place, and the cast back to the logits' 16-bit dtype.
MEGATRON_CE_FORWARD = (("megatron.ce.to_float", 2, 4), ("megatron.ce.max", 4, 0),
                       ("megatron.ce.sub_max", 4, 4), ("megatron.ce.exp", 4, 4),
                       ("megatron.ce.sum", 4, 0), ("megatron.ce.softmax", 4, 4))
MEGATRON_CE_BACKWARD = (("megatron.ce.grad", 4, 4), ("megatron.ce.to_half", 4, 2))


def _aliases(fused: OpNode) -> list[OpNode]:
    """The views a fused kernel made of its own inputs and outputs (autograd's ``detach`` of
    the log-softmax it saves, the flattened target), kept as zero-cost view nodes after the
    chain that replaces it: the backward reads them, and the saved-activation count must
    see them as the tensors they alias, not as further tensors."""
    known = {t.tensor_id for t in (*fused.inputs, *fused.outputs) if t.tensor_id is not None}
    out = []
    for m in fused.members:
        if m.category != Category.VIEW or not m.inputs or any(
                t.tensor_id not in known for t in m.inputs[:1]):
            continue
        out.append(m)
        known.update(t.tensor_id for t in m.outputs if t.tensor_id is not None)
    return out


def unfused_cross_entropy(forward: OpGraph, backward: OpGraph) -> tuple[OpGraph, OpGraph]:
    """Megatron's cross-entropy as it runs without the fused loss kernel (Megatron-LM and
    NeMo until ``--cross-entropy-loss-fusion``; ``megatron/core/tensor_parallel/
    cross_entropy.py``): each ``fused.cross_entropy`` (and its backward) becomes the fp32
    passes of :data:`MEGATRON_CE_FORWARD` (:data:`MEGATRON_CE_BACKWARD`) over the logits —
    38 bytes per logit forward and 14 backward, where the fused kernel moves 6 and 10. The
    last node of each chain writes the fused node's outputs (same tensor ids), so the saved
    fp32 softmax and the gradient flow as before; the TP all-reduces of the max and the sum
    are the parallel transform's."""

    def expand(graph: OpGraph, op: str, chain: Sequence[tuple[str, int, int]]) -> OpGraph:
        nodes: list[OpNode] = []
        edges = list(graph.edges)
        next_id = _next_id(graph)
        changed = False
        for n in graph.nodes:
            if n.op != op:
                nodes.append(n)
                continue
            logits = max((t for t in (*n.inputs, *n.outputs) if len(t.shape) >= 2),
                         key=lambda t: t.numel, default=None)
            if logits is None:
                nodes.append(n)
                continue
            elements = logits.numel
            prev: OpNode | None = None
            made = []
            for i, (name, read, written) in enumerate(chain):
                last = i == len(chain) - 1
                category = Category.REDUCTION if name.endswith(("max", "sum")) \
                    else Category.ELEMENTWISE
                node = OpNode(
                    id=next_id, op=name, category=category, phase=n.phase,
                    inputs=n.inputs if prev is None else prev.outputs,
                    outputs=n.outputs if last else (TensorMeta(logits.shape, "float32"),),
                    module_path=n.module_path, module_class=n.module_class,
                    layer_index=n.layer_index, layer_kind=n.layer_kind, flops=elements,
                    bytes_read=read * elements, bytes_written=written * elements,
                    formula=name, attrs={"loss": "megatron_unfused"})
                if prev is not None:
                    edges.append((prev.id, node.id))
                made.append(node)
                prev = node
                next_id += 1
            first, final = made[0].id, made[-1].id
            edges = [(a, first) if b == n.id else (final, b) if a == n.id else (a, b)
                     for a, b in edges]
            nodes.extend(made)
            for alias in _aliases(n):
                nodes.append(evolve(alias, id=next_id))
                edges.append((final, next_id))
                next_id += 1
            changed = True
        return graph.with_nodes(nodes, edges) if changed else graph

    return (expand(forward, "fused.cross_entropy", MEGATRON_CE_FORWARD),
            expand(backward, "fused.cross_entropy_backward", MEGATRON_CE_BACKWARD))


def inplace_cross_entropy(forward: OpGraph, backward: OpGraph) -> tuple[OpGraph, OpGraph]:
    """TransformerEngine's ``parallel_cross_entropy`` up to TE 2.17 (``cross_entropy_fusion_impl
    = "te"``): the forward computes the loss and writes the logits' gradient into the logits
    themselves, and saves them (``ctx.save_for_backward(inp.detach())``,
    ``pytorch/cross_entropy.py``); the backward scales that gradient in place. So the saved
    tensor is ``[tokens, vocab / tp]`` in the logits' dtype, not an fp32 log-softmax (TE 2.18,
    PR #3193, stores an fp32 gradient instead: the ``fused`` kernel). Only what is kept
    changes: the nodes' traffic stays the fused kernel's (docs/training-model.md says why)."""

    def logits_of(n: OpNode) -> TensorMeta | None:
        return max((t for t in n.inputs if len(t.shape) >= 2), key=lambda t: t.numel,
                   default=None)

    saved: dict[int, str] = {}  # the fused node's big fp32 output (and its views) → dtype
    fwd_nodes = []
    for n in forward.nodes:
        logits = logits_of(n) if n.op == "fused.cross_entropy" else None
        if logits is None:
            fwd_nodes.append(n)
            continue
        for t in n.outputs:
            if t.numel == logits.numel and t.tensor_id is not None:
                saved[t.tensor_id] = logits.dtype
        for alias in _aliases(n):  # autograd's detach of what it saves is the same tensor
            if alias.inputs[0].tensor_id in saved:
                saved.update((t.tensor_id, logits.dtype) for t in alias.outputs
                             if t.tensor_id is not None)
        fwd_nodes.append(evolve(_retyped(n, saved), attrs={**n.attrs, "loss": "te_inplace"}))
    bwd_nodes = []
    for n in backward.nodes:
        if n.op != "fused.cross_entropy_backward":
            bwd_nodes.append(n)
            continue
        bwd_nodes.append(evolve(_retyped(n, saved), attrs={**n.attrs, "loss": "te_inplace"}))
    return forward.with_nodes(fwd_nodes, forward.edges), \
        backward.with_nodes(bwd_nodes, backward.edges)


def _retyped(n: OpNode, dtypes: dict[int, str]) -> OpNode:
    """``n`` (and its fused members) with the tensors ``dtypes`` names in those dtypes."""
    return n.with_tensors(lambda t: evolve(t, dtype=dtypes[t.tensor_id])
                          if t.tensor_id in dtypes else t)
