"""Expert biases and the clamped GLU as Megatron-Core's ``TEGroupedMLP`` runs them in
training, in place of the captured model's per-row bias gathers (docs/moe-training.md).

Megatron-Core ``megatron/core/transformer/moe/experts.py`` (``TEGroupedMLP``, the same at
every commit Megatron-Bridge 25.11 … 26.06 pins: 0d8e0714 L794-802, L816-823, L843-859,
L924-931):

- ``linear_fc1`` is built with ``skip_bias_add=False``: TE ``GroupedLinear`` adds each
  expert's bias in its cuBLAS GEMM's epilogue (``general_grouped_gemm(..., bias=biases)``)
  and takes the bias gradient from the weight-gradient GEMMs' epilogue
  (``grouped_gemm_wgrad`` → ``grad_biases_``; under fp8 ``tex.bgrad_quantize`` fuses it
  with the per-expert cast): ``transformer_engine/pytorch/module/grouped_linear.py`` at
  v2.9, L170-181 and L300-320, L419-437. No separate pass over the rows.
- ``linear_fc2`` is built with ``skip_bias_add=True`` and ``_apply_bias`` adds the bias in
  a Python loop over the local experts: ``torch.cat([t + b * p for t, b, p in
  zip(torch.split(out, tokens_per_expert), biases, torch.split(probs,
  tokens_per_expert))])`` — two eager kernels per expert (``b * p``, ``t + …``) and one
  ``cat``; autograd's backward of ``b * p`` is ``grad · p`` summed over the rows and
  ``grad · b`` summed over the features (PyTorch ``mul`` backward + ``sum_to_size``): four
  kernels per expert.
- ``weighted_bias_quick_geglu_impl`` with ``activation_func_clamp_value`` set
  (``fusions/fused_bias_geglu.py`` L424-432) clamps the two halves and concatenates them
  eagerly before its compiled kernel: ``clamp`` of ``[rows, F]`` twice and ``cat`` into
  ``[rows, 2F]`` — four more full passes in the forward, and again in every recompute of
  ``moe_act``.

The capture (HuggingFace's model) gathers each row's bias from a ``[E, W]`` table
(``aten.index``) and adds it; its backward scatters the rows' gradients back
(``aten.index_put`` accumulate). :func:`megatron_expert_epilogue` re-prices those nodes as
above: fc1's gather and scatter are free (the add left in the fused activation reads no
gathered bias), fc2's add becomes the per-expert loop (``EXPERT_STREAMS_ATTR`` = 1, one
kernel after another on the current stream, ``EXPERT_GROUPS_ATTR`` = its kernels), and a
clamped activation reads and writes the clamp and ``cat`` passes.
"""

from __future__ import annotations

from attrs import evolve

from zrt_core.cost.opdims import (
    EXPERT_EAGER_ATTR,
    EXPERT_GROUPS_ATTR,
    EXPERT_STREAMS_ATTR,
    op_base,
)
from zrt_core.ir.graph import Category, OpGraph, OpNode
from zrt_core.transforms.training.common import RECOMPUTE_ATTR

#: Eager kernels per local expert of ``_apply_bias``: forward ``b * p`` and ``t + b * p``;
#: backward ``grad · p``, its sum over the rows (the bias gradient), ``grad · b`` and its sum
#: over the features (the probabilities' gradient).
BIAS_LOOP_FORWARD_KERNELS = 2
BIAS_LOOP_BACKWARD_KERNELS = 4

#: The attribute a re-priced node carries (what it now stands for).
EPILOGUE_ATTR = "megatron_expert_epilogue"

_CLAMPS = frozenset({"clamp", "clamp_min", "clamp_max", "clip"})


def megatron_expert_epilogue(graph: OpGraph, groups: dict[int, int], *,
                             eager: bool = True) -> OpGraph:
    """``graph`` (a fused training forward or backward) with its experts' bias nodes and
    clamped activation priced as Megatron-Core's ``TEGroupedMLP`` runs them (module
    docstring). ``groups``: grouped GEMM id → local experts. Unchanged when the graph has no
    per-row expert bias and no clamped activation feeding a grouped GEMM."""
    if not groups:
        return graph
    by_id = {n.id: n for n in graph.nodes}
    producers: dict[int, list[int]] = {}
    consumers: dict[int, list[int]] = {}
    for a, b in graph.edges:
        producers.setdefault(b, []).append(a)
        consumers.setdefault(a, []).append(b)
    per_layer: dict[int | None, int] = {}  # a layer's local experts (its largest group)
    for i, g in groups.items():
        layer = by_id[i].layer_index
        per_layer[layer] = max(per_layer.get(layer, 0), g)
    changed: dict[int, OpNode] = {}
    # the forward's expert GEMMs seen so far in each layer (recomputed ones apart)
    seen: dict[tuple[int | None, bool], int] = {}
    for n in graph.nodes:
        base = op_base(n.op)
        recomputed = bool(n.attrs.get(RECOMPUTE_ATTR))
        if n.id in groups:
            key = (n.layer_index, recomputed)
            seen[key] = seen.get(key, 0) + 1
            continue
        if base == "index" and _is_bias_gather(n, per_layer):
            fc2 = _fc2_add(n, by_id, consumers, producers, groups)
            if fc2 is None:
                # fc1's bias: added in the GEMM's epilogue; the fused node that read the
                # gathered rows reads them no more
                changed[n.id] = evolve(n, zero_cost=True, attrs={**n.attrs,
                                                                 EPILOGUE_ATTR: "fc1_bias"})
                for c in consumers.get(n.id, ()):
                    node = changed.get(c, by_id[c])
                    if node.category == Category.ELEMENTWISE:
                        changed[c] = evolve(node, bytes_read=max(
                            0, node.bytes_read - _out_bytes(n)))
            else:
                add, g = fc2
                changed[n.id] = evolve(n, zero_cost=True, attrs={**n.attrs,
                                                                 EPILOGUE_ATTR: "fc2_bias"})
                rows = _out_bytes(add)  # V: the [rows, hidden] output in its dtype
                # b * p writes V; t + b * p reads 2V, writes V; cat reads V, writes V
                changed[add.id] = _loop(add, g * BIAS_LOOP_FORWARD_KERNELS, eager,
                                        read=3 * rows, written=3 * rows, what="fc2_bias")
        elif base == "index_put" and n.attrs.get("accumulate") and _is_bias_table(n):
            g = per_layer.get(n.layer_index, 0)
            if not g:
                continue
            if seen.get((n.layer_index, False), 0) == 0:
                # before the layer's first expert GEMM of the backward: fc2's bias gradient.
                # grad·p (reads V, writes V), its row sum (reads V), grad·b (reads V,
                # writes V), its feature sum (reads V)
                rows = _in_bytes(n, 2)
                changed[n.id] = _loop(n, g * BIAS_LOOP_BACKWARD_KERNELS, eager,
                                      read=4 * rows, written=2 * rows, what="fc2_bias_grad")
            else:
                # fc1's bias gradient: the weight-gradient GEMMs' epilogue
                changed[n.id] = evolve(n, zero_cost=True, attrs={**n.attrs,
                                                                 EPILOGUE_ATTR: "fc1_bias_grad"})
        elif n.category == Category.ELEMENTWISE and per_layer.get(n.layer_index) \
                and _clamped_glu(n, producers, groups, consumers):
            u = _half_bytes(n)
            if u:
                node = changed.get(n.id, n)
                # clamp(x_glu) and clamp(x_linear) read and write [rows, F] each, cat reads
                # both and writes [rows, 2F]: 4 + 4 halves
                changed[n.id] = evolve(node, bytes_read=node.bytes_read + 4 * u,
                                       bytes_written=node.bytes_written + 4 * u,
                                       attrs={**node.attrs, EPILOGUE_ATTR: "clamp_cat"})
    if not changed:
        return graph
    return graph.with_nodes([changed.get(n.id, n) for n in graph.nodes], list(graph.edges))


def _loop(node: OpNode, kernels: int, eager: bool, *, read: int, written: int,
          what: str) -> OpNode:
    """``node`` as ``kernels`` eager kernels one after another on one stream."""
    return evolve(node, bytes_read=read, bytes_written=written, attrs={
        **node.attrs, EXPERT_STREAMS_ATTR: 1, EXPERT_GROUPS_ATTR: kernels,
        EXPERT_EAGER_ATTR: eager, EPILOGUE_ATTR: what})


def _out_bytes(node: OpNode) -> int:
    return node.outputs[0].nbytes if node.outputs else 0


def _in_bytes(node: OpNode, i: int) -> int:
    return node.inputs[i].nbytes if len(node.inputs) > i else 0


def _is_bias_table(node: OpNode) -> bool:
    """A per-expert bias table: the first input is ``[E, W]`` (one row per expert)."""
    return bool(node.inputs) and len(node.inputs[0].shape) == 2


def _is_bias_gather(node: OpNode, per_layer: dict[int | None, int]) -> bool:
    """An ``aten.index`` of rows from a ``[E, W]`` table into ``[rows, W]``, in a layer with
    expert GEMMs (``per_layer``: a layer's local experts)."""
    if not _is_bias_table(node) or not node.outputs or len(node.outputs[0].shape) != 2:
        return False
    return node.outputs[0].shape[1] == node.inputs[0].shape[1] and bool(
        per_layer.get(node.layer_index))


def _fc2_add(gather: OpNode, by_id: dict[int, OpNode], consumers: dict[int, list[int]],
             producers: dict[int, list[int]], groups: dict[int, int]
             ) -> tuple[OpNode, int] | None:
    """The unfused add of ``gather``'s rows to an expert GEMM's output that no other expert
    GEMM reads (fc2's bias), with that GEMM's groups; None otherwise (fc1's bias, added
    inside the fused activation that feeds fc2)."""
    for c in consumers.get(gather.id, ()):
        add = by_id[c]
        if op_base(add.op) != "add" or add.fused_from:
            continue
        gemms = [p for p in producers.get(add.id, ()) if p in groups]
        if gemms and not _reaches_gemm(add.id, consumers, groups, by_id):
            return add, groups[gemms[0]]
    return None


def _reaches_gemm(start: int, consumers: dict[int, list[int]], groups: dict[int, int],
                  by_id: dict[int, OpNode], depth: int = 6) -> bool:
    """Whether an expert GEMM reads ``start``'s output within ``depth`` elementwise or view
    steps (the activation between fc1 and fc2)."""
    frontier, seen = [start], {start}
    for _ in range(depth):
        nxt = []
        for i in frontier:
            for c in consumers.get(i, ()):
                if c in groups:
                    return True
                if c not in seen and by_id[c].category in (Category.ELEMENTWISE,
                                                           Category.VIEW, Category.COPY):
                    seen.add(c)
                    nxt.append(c)
        frontier = nxt
    return False


def _clamped_glu(node: OpNode, producers: dict[int, list[int]], groups: dict[int, int],
                 consumers: dict[int, list[int]]) -> bool:
    """A fused forward activation (or its recompute) that clamps an expert GEMM's output
    and feeds another expert GEMM: a GLU with a clamp value."""
    if not node.fused_from or not any(op_base(f.op) in _CLAMPS for f in node.fused_from):
        return False
    if any(op_base(f.op) in ("where", "le", "ge") for f in node.fused_from):
        return False  # the clamps' backward
    if node.attrs.get(RECOMPUTE_ATTR):
        return True  # moe_act's recompute of it, in the backward
    return any(p in groups for p in producers.get(node.id, ())) and any(
        c in groups for c in consumers.get(node.id, ()))


def _half_bytes(node: OpNode) -> int:
    """``[rows, F]`` in the activation's dtype: its first output."""
    return _out_bytes(node)
