"""LoRA fine-tuning (Megatron-Bridge ``peft="lora"``): frozen base weights, low-rank adapters
beside every decoder linear layer, and only the adapters trained (docs/training-model.md).

The transform runs on the per-rank training graphs after mixed precision and the
weight-gradient marks (:func:`~zrt_core.transforms.training.mark_weight_grads`):

- the frozen layers keep their forward and input-gradient (dgrad) GEMMs but lose every
  weight-gradient GEMM (dW) and the word embedding's gradient (``embedding_dense_backward``);
- each fused Megatron linear layer — the weight GEMMs of a decoder layer that read the same
  activation (Q, K, V: ``linear_qkv``; gate and up: ``linear_fc1``; ``linear_proj``;
  ``linear_fc2``) — gets one adapter ``B·A`` of rank ``r`` in bf16 (Megatron
  ``ColumnParallelLinear`` / ``RowParallelLinear``, not TransformerEngine): forward
  ``H = X·A`` (M × K × r), ``Y += H·B`` (M × r × N); backward ``dH = dY·Bᵀ``,
  ``dX += dH·Aᵀ``, and the adapter's own weight gradients ``dB = Hᵀ·dY``, ``dA = Xᵀ·dH``;
- only the adapters have gradients to reduce and optimizer states (:func:`lora_inventory`);
- the low-precision casts of the frozen layers' GEMM inputs and output gradients write the
  row-wise copy only (:func:`~zrt_core.transforms.training.rowwise_only`: TransformerEngine
  makes the column-wise one for the weight gradient alone).

Routed experts (3-D grouped weights) are left as they are: an adapter per expert is a
different recipe.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from attrs import evolve, field, frozen, validators

from zrt_core.ir.graph import Category, OpGraph, OpNode, TensorMeta
from zrt_core.transforms.training import (
    INPUT_GRAD,
    QUANTIZE_ATTR,
    WEIGHT_GRAD,
    ParamInventory,
    param_inventory,
    rowwise_only,
)

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel

#: Megatron-Bridge's ``LoRA`` defaults (``src/megatron/bridge/peft/lora.py``): rank ``dim``
#: 32 on ``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``.
DEFAULT_LORA_RANK = 32
#: Suffixes of the adapter weights' names (``<base weight>.lora_a``).
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
_ADAPTER_DTYPE = "bfloat16"
#: Backward ops that compute a frozen weight's gradient outside the GEMMs.
_FROZEN_GRAD_OPS = ("aten.embedding_dense_backward.default",)


def is_adapter_param(name: str | None) -> bool:
    return bool(name) and name.endswith(ADAPTER_SUFFIXES)


@frozen
class LoRA:
    """Frozen base weights plus rank-``rank`` adapters on the decoder linear layers named in
    ``modules`` (Megatron's ``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2``;
    None: every one)."""

    rank: int = field(default=DEFAULT_LORA_RANK, validator=validators.gt(0))
    modules: tuple[str, ...] | None = None
    name: str = "lora"

    def apply_pair(self, forward: OpGraph, backward: OpGraph) -> tuple[OpGraph, OpGraph]:
        groups = _linear_groups(forward)
        if self.modules is not None:
            groups = [g for g in groups if megatron_module(g) in self.modules]
        next_tensor = 1 + max((t.tensor_id for g in (forward, backward) for n in g.nodes
                               for t in (*n.inputs, *n.outputs) if t.tensor_id is not None),
                              default=0)
        fwd_nodes, bwd_nodes = frozen_nodes(forward, backward)
        fwd_edges = list(forward.edges)
        bwd_edges = _kept_edges(backward, bwd_nodes)
        next_fwd = 1 + max((n.id for n in forward.nodes), default=0)
        next_bwd = 1 + max((n.id for n in backward.nodes), default=0)
        fwd_after: dict[int, list[OpNode]] = {}
        bwd_after: dict[int, list[OpNode]] = {}
        dgrads = _dgrads_by_seq(bwd_nodes)
        for gemms in groups:
            base = gemms[0]
            x = next(t for t in base.inputs if t.param is None)
            x = evolve(x, dtype=_ADAPTER_DTYPE)
            m, k = x.numel // x.shape[-1], x.shape[-1]
            n_out = sum(g.outputs[0].shape[-1] for g in gemms)
            r = self.rank
            weight = next(t.param for t in base.inputs if t.param is not None)
            a_w = TensorMeta((k, r), _ADAPTER_DTYPE, tensor_id=next_tensor,
                             param=weight + ".lora_a")
            b_w = TensorMeta((r, n_out), _ADAPTER_DTYPE, tensor_id=next_tensor + 1,
                             param=weight + ".lora_b")
            h = TensorMeta((m, r), _ADAPTER_DTYPE, tensor_id=next_tensor + 2)
            y_a = TensorMeta((m, n_out), _ADAPTER_DTYPE, tensor_id=next_tensor + 3)
            y = TensorMeta((m, n_out), _ADAPTER_DTYPE, tensor_id=next_tensor + 4)
            next_tensor += 5
            last = gemms[-1]
            made = [
                _gemm(next_fwd, last, x, a_w, h, m, k, r, None),
                _gemm(next_fwd + 1, last, h, b_w, y_a, m, r, n_out, None),
                _add(next_fwd + 2, last, y_a, y)]
            next_fwd += 3
            fwd_after.setdefault(last.id, []).extend(made)
            fwd_edges += [(made[0].id, made[1].id), (made[1].id, made[2].id),
                          (last.id, made[2].id)]
            anchor = next((dgrads[s] for g in gemms
                           if (s := g.attrs.get("seq_nr")) in dgrads), None)
            if anchor is None:
                continue
            # the output gradient the base layer's dgrad reads (a backward tensor, never a
            # saved activation), seen whole: the group's outputs side by side
            grad_in = next(t for t in anchor.inputs if t.param is None)
            dy = evolve(grad_in, shape=(m, n_out), dtype=_ADAPTER_DTYPE)
            dh = TensorMeta((m, r), _ADAPTER_DTYPE, tensor_id=next_tensor)
            dx_a = TensorMeta((m, k), _ADAPTER_DTYPE, tensor_id=next_tensor + 1)
            dx = TensorMeta((m, k), _ADAPTER_DTYPE, tensor_id=next_tensor + 2)
            d_b = TensorMeta((r, n_out), _ADAPTER_DTYPE, tensor_id=next_tensor + 3)
            d_a = TensorMeta((k, r), _ADAPTER_DTYPE, tensor_id=next_tensor + 4)
            next_tensor += 5
            i = next_bwd
            back = [
                _gemm(i, anchor, dy, b_w, dh, m, n_out, r, INPUT_GRAD),        # dH = dY·Bᵀ
                _gemm(i + 1, anchor, dh, a_w, dx_a, m, r, k, INPUT_GRAD),      # dX_a = dH·Aᵀ
                _add(i + 2, anchor, dx_a, dx),                                 # dX += dX_a
                _gemm(i + 3, anchor, h, dy, d_b, r, m, n_out, WEIGHT_GRAD),    # dB = Hᵀ·dY
                _gemm(i + 4, anchor, x, dh, d_a, k, m, r, WEIGHT_GRAD)]        # dA = Xᵀ·dH
            next_bwd += 5
            bwd_after.setdefault(anchor.id, []).extend(back)
            bwd_edges += [(anchor.id, i), (i, i + 1), (i + 1, i + 2), (anchor.id, i + 2),
                          (anchor.id, i + 3), (i, i + 4)]
        fwd = forward.with_nodes(_interleave(fwd_nodes, fwd_after), fwd_edges)
        bwd = backward.with_nodes(_interleave(bwd_nodes, bwd_after), bwd_edges)
        meta = {"lora_rank": self.rank, "lora_modules": self.modules}
        return (evolve(fwd, meta={**forward.meta, **meta}),
                evolve(bwd, meta={**backward.meta, **meta}))


def lora_inventory(forward: OpGraph, parallel: Parallel, dims: object) -> ParamInventory:
    """The trainable parameters of a LoRA graph: its adapters only (the gradients to reduce
    and the optimizer's states); the frozen weights stay in the full inventory."""
    nodes = [n for n in forward.nodes if any(is_adapter_param(t.param) for t in n.inputs)]
    return param_inventory(forward.with_nodes(nodes, ()), parallel, dims)


def _linear_groups(forward: OpGraph) -> list[list[OpNode]]:
    """Weight GEMMs of the decoder layers grouped by the activation they read: one group per
    fused Megatron linear layer (Q/K/V read the same normed input, as gate and up do)."""
    producer = {t.tensor_id: n for n in forward.nodes for t in n.outputs
                if t.tensor_id is not None}

    def root(tensor_id: int) -> int:
        # through the views each call makes of its input (``x.view(-1, h)`` per linear)
        seen = 0
        while (p := producer.get(tensor_id)) is not None and p.zero_cost and seen < 16:
            ins = [t for t in p.inputs if t.tensor_id is not None and t.param is None]
            if len(ins) != 1:
                break
            tensor_id, seen = ins[0].tensor_id, seen + 1
        return tensor_id

    groups: dict[tuple[int | None, int], list[OpNode]] = {}
    for n in forward.nodes:
        if n.category != Category.MATMUL or n.layer_index is None:
            continue
        weights = [t for t in n.inputs if t.param is not None]
        acts = [t for t in n.inputs if t.param is None]
        if len(weights) != 1 or len(weights[0].shape) != 2 or not acts \
                or acts[0].tensor_id is None or is_adapter_param(weights[0].param):
            continue
        groups.setdefault((n.layer_index, root(acts[0].tensor_id)), []).append(n)
    return list(groups.values())


#: Weight-name parts of the HuggingFace families' linear layers, per Megatron fused layer
#: (first match wins; ``c_proj``/``dense`` are told apart by the attention part of the path).
_MODULE_NAMES = (
    ("linear_qkv", ("q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value",
                    "wqkv", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj")),
    ("linear_fc1", ("gate_proj", "up_proj", "gate_up_proj", "c_fc", "fc1", "w1", "w3",
                    "dense_h_to_4h")),
    ("linear_fc2", ("down_proj", "fc2", "w2", "dense_4h_to_h")),
    ("linear_proj", ("o_proj", "out_proj")),
)
_ATTENTION_PARTS = ("attn", "attention")


def megatron_module(gemms: Sequence[OpNode]) -> str | None:
    """Which of Megatron's fused linear layers a group of weight GEMMs is, from its weights'
    names (HuggingFace's per family); None when the names say nothing."""
    names = [str(t.param) for n in gemms for t in n.inputs if t.param is not None]
    parts = [p for name in names for p in name.lower().split(".")]
    for module, keys in _MODULE_NAMES:
        if any(p in keys for p in parts):
            return module
    if any(p in ("c_proj", "dense") for p in parts):
        in_attention = any(a in p for p in parts for a in _ATTENTION_PARTS)
        return "linear_proj" if in_attention else "linear_fc2"
    return None


def _dgrads_by_seq(nodes: Sequence[OpNode]) -> dict[int, OpNode]:
    """The first input-gradient GEMM of each forward GEMM (by autograd sequence number)."""
    out: dict[int, OpNode] = {}
    for n in nodes:
        seq = n.attrs.get("fwd_seq_nr")
        if n.category == Category.MATMUL and n.attrs.get("grad") == INPUT_GRAD \
                and seq is not None and seq not in out:
            out[seq] = n
    return out


def drop_frozen_grads(backward: OpGraph) -> list[OpNode]:
    """The backward without the frozen weights' gradient kernels (the dW GEMMs, the word
    embedding's gradient) and the views that only carried their results."""
    dropped = {n.id for n in backward.nodes
               if (n.category == Category.MATMUL and n.attrs.get("grad") == WEIGHT_GRAD)
               or n.op in _FROZEN_GRAD_OPS}
    consumers: dict[int, list[int]] = {}
    producers: dict[int, list[int]] = {}
    for src, dst in backward.edges:
        consumers.setdefault(src, []).append(dst)
        producers.setdefault(dst, []).append(src)
    by_id = backward.by_id()
    frontier = list(dropped)
    while frontier:
        for c in consumers.get(frontier.pop(), ()):
            node = by_id[c]
            if c not in dropped and node.zero_cost and not node.attrs.get(QUANTIZE_ATTR) \
                    and all(p in dropped for p in producers.get(c, ())):
                dropped.add(c)
                frontier.append(c)
    return [n for n in backward.nodes if n.id not in dropped]


def frozen_nodes(forward: OpGraph, backward: OpGraph) -> tuple[list[OpNode], list[OpNode]]:
    """The nodes of a forward and backward whose weights are all frozen (LoRA's base, a
    frozen language model): the backward without the frozen weights' gradient kernels
    (:func:`drop_frozen_grads`), and both graphs' casts writing the row-wise copy alone
    (:func:`~zrt_core.transforms.training.rowwise_only`)."""
    return ([rowwise_only(n) for n in forward.nodes],
            [rowwise_only(n) for n in drop_frozen_grads(backward)])


def _kept_edges(graph: OpGraph, nodes: Iterable[OpNode]) -> list[tuple[int, int]]:
    kept = {n.id for n in nodes}
    return [(s, d) for s, d in graph.edges if s in kept and d in kept]


def _interleave(nodes: Sequence[OpNode], after: dict[int, list[OpNode]]) -> list[OpNode]:
    out: list[OpNode] = []
    for n in nodes:
        out.append(n)
        out.extend(after.get(n.id, ()))
    return out


def _gemm(node_id: int, like: OpNode, a: TensorMeta, b: TensorMeta, out: TensorMeta,
          m: int, k: int, n: int, grad: str | None) -> OpNode:
    """An adapter GEMM ``[m, k] × [k, n]`` in bf16: ``2·m·k·n`` FLOPs, each operand read once."""
    a = evolve(a, shape=(m, k)) if a.numel == m * k else a
    b = evolve(b, shape=(k, n)) if b.numel == k * n else b
    attrs = {"lora": True, "precision": "bf16"}
    if grad is not None:
        attrs["grad"] = grad
    return OpNode(id=node_id, op="aten.mm.default", category=Category.MATMUL,
                  phase=like.phase, inputs=(a, b), outputs=(out,),
                  module_path=like.module_path + ".lora", module_class="LoRALinear",
                  layer_index=like.layer_index, layer_kind=like.layer_kind,
                  flops=2 * m * k * n, bytes_read=a.nbytes + b.nbytes,
                  bytes_written=out.nbytes, formula="aten.mm.default", attrs=attrs)


def _add(node_id: int, like: OpNode, a: TensorMeta, out: TensorMeta) -> OpNode:
    """The adapter's output added to the base layer's (Megatron-Bridge ``LoRALinear``:
    ``linear_output + adapter_output``, unfused): reads both, writes one."""
    return OpNode(id=node_id, op="aten.add.Tensor", category=Category.ELEMENTWISE,
                  phase=like.phase, inputs=(a, evolve(a, tensor_id=None)), outputs=(out,),
                  module_path=like.module_path + ".lora", module_class="LoRALinear",
                  layer_index=like.layer_index, layer_kind=like.layer_kind, flops=a.numel,
                  bytes_read=2 * a.nbytes, bytes_written=out.nbytes,
                  formula="aten.add.Tensor", attrs={"lora": True})
