"""Training transforms: recompute, mixed precision, data-parallel gradient sync, ZeRO/FSDP
parameter gathers, the optimizer step graph and CPU offload of optimizer states.

They run on the ``train_forward`` / ``train_backward`` graphs of one capture (one micro-batch
on one device, after the parallel transforms have sharded shapes) and follow what
Megatron-LM / TransformerEngine / DeepSpeed / FSDP execute; ``docs/training-model.md``
gives each rule and its source. Every node a transform adds is an ordinary :class:`OpNode`
priced by the cost backends; collectives carry the attrs of ``docs/architecture.md``.

Order (what :mod:`zrt_core.estimate.training` runs): fusion → parallel → :class:`Precision`
→ :func:`mark_weight_grads` → :class:`Recompute` → :class:`ParamGather` /
:class:`GradientSync`; :func:`optimizer_graph` builds the ``optimizer`` phase.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.checks import stage_layer_ranges  # noqa: F401  (re-exported)
from zrt_core.errors import SpecError
from zrt_core.ir.graph import (
    Category,
    LayerTemplate,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    dtype_bytes,
)

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.schedule.scheduler import OverlapRules
    from zrt_core.strategy import Parallel, TrainSpec
    from zrt_core.transforms.base import TransformContext

#: ``attrs["grad"]`` of a backward GEMM computing a weight gradient (zero-bubble W pass) or
#: an input gradient (B pass); the scheduler reads the same mark.
WEIGHT_GRAD, INPUT_GRAD = "weight", "input"
#: ``attrs["recompute"]`` marks forward nodes re-run inside the backward graph.
RECOMPUTE_ATTR = "recompute"
#: ``attrs["quantize"]`` marks the cast (and amax / block-scale) kernels a precision recipe adds.
QUANTIZE_ATTR = "quantize"

_EXPERT_PARAM = re.compile(r"(^|\.)experts\.")
_FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16"})


# -- small helpers ------------------------------------------------------------------------------


def is_expert_param(name: str) -> bool:
    """A routed expert's weight (``...mlp.experts.gate_up_proj``), not a shared expert's."""
    return bool(_EXPERT_PARAM.search(name))


def _next_id(graph: OpGraph) -> int:
    return max((n.id for n in graph.nodes), default=-1) + 1


def _tensor_ids(graphs: Iterable[OpGraph]) -> int:
    """One past the largest tensor id in the graphs (new tensors are numbered from it)."""
    top = -1
    for g in graphs:
        for n in g.nodes:
            for t in (*n.inputs, *n.outputs):
                if t.tensor_id is not None and t.tensor_id > top:
                    top = t.tensor_id
    return top + 1


def collective_node(
    node_id: int,
    kind: str,
    group: str,
    parallel: Parallel,
    message_bytes: float,
    *,
    phase: str,
    layer_index: int | None = None,
    layer_kind: str | None = None,
    module_path: str = "",
    overlap: str | None = None,
    dtype: str = "bfloat16",
    extra: Mapping[str, Any] | None = None,
) -> OpNode:
    """A collective node as docs/architecture.md defines it: the group's size and span from
    ``Parallel.span``; ``message_bytes`` per rank (the full buffer of an all-reduce, the
    gathered output of an all-gather, the input of a reduce-scatter)."""
    size, span = parallel.span(group)
    elements = max(1, int(message_bytes // dtype_bytes(dtype)))
    attrs: dict[str, Any] = {"collective": kind, "group": group, "group_size": size,
                             "span": span, "bytes": float(message_bytes)}
    if overlap is not None:
        attrs["overlap"] = overlap
    if extra:
        attrs.update(extra)
    buffer = TensorMeta(shape=(elements,), dtype=dtype)
    return OpNode(id=node_id, op=f"comm.{kind}", category=Category.COLLECTIVE, phase=phase,
                  inputs=(buffer,), outputs=(buffer,), module_path=module_path,
                  layer_index=layer_index, layer_kind=layer_kind, formula="collective",
                  attrs=attrs)


# -- weight-gradient marks ----------------------------------------------------------------------


def mark_weight_grads(forward: OpGraph, backward: OpGraph) -> OpGraph:
    """Mark backward GEMMs ``attrs["grad"] = "weight"`` or ``"input"``.

    A backward GEMM that reads a parameter computes an input gradient (``dX = dY·Wᵀ``); one
    that reads none while its forward GEMM (same autograd sequence number) read a parameter
    of the shape it writes computes that parameter's gradient (``dW = Xᵀ·dY``; for grouped
    expert GEMMs ``[E, k, n]``). Zero-bubble schedules move the weight gradients off the
    critical path; the scheduler reads the same mark.
    """
    param_shapes: dict[int, list[tuple[int, ...]]] = {}
    for n in forward.nodes:
        if n.category != Category.MATMUL:
            continue
        seq = n.attrs.get("seq_nr")
        shapes = [t.shape for t in n.inputs if t.param is not None]
        if seq is not None and shapes:
            param_shapes.setdefault(seq, []).extend(shapes)
    nodes = []
    changed = False
    for n in backward.nodes:
        if n.category == Category.MATMUL and "grad" not in n.attrs \
                and not n.attrs.get(RECOMPUTE_ATTR):
            mark = None
            if any(t.param is not None for t in n.inputs):
                mark = INPUT_GRAD
            else:
                shapes = param_shapes.get(n.attrs.get("fwd_seq_nr"), ())
                out = n.outputs[0].shape if n.outputs else ()
                if any(out == s or out == tuple(reversed(s)) or
                       (len(s) == 3 and out == (s[0], s[2], s[1])) for s in shapes):
                    mark = WEIGHT_GRAD
                elif shapes:
                    mark = INPUT_GRAD
            if mark is not None:
                n = evolve(n, attrs={**n.attrs, "grad": mark})
                changed = True
        nodes.append(n)
    return backward.with_nodes(nodes, backward.edges) if changed else backward


# -- layer templates --------------------------------------------------------------------------

#: Added to the autograd sequence numbers of a copied layer, so the copy's backward nodes pair
#: with its own forward nodes (weight-gradient marks, selective recompute).
_SEQ_OFFSET = 10_000_000


def split_layer_templates(forward: OpGraph, backward: OpGraph, subset: Iterable[int]
                          ) -> tuple[OpGraph, OpGraph]:
    """Give the layers of ``subset`` templates of their own where they share one with layers
    outside it (the last layers kept in bf16 under an fp4 recipe, say), in both phases.

    A template whose indices fall on both sides keeps its representative's side; the other
    side gets a copy of the representative's nodes right after them, with the smallest of
    its indices as the representative: fresh node ids, fresh ids for every tensor the layer
    produces (shared between the phases, so the backward reads the copy's saved
    activations), parameter names suffixed ``@<representative>`` (they are other layers'
    weights), and autograd sequence numbers offset by :data:`_SEQ_OFFSET`. The counts add
    up: every layer is still run once, by exactly one template.
    """
    wanted = set(subset)
    moves: dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]] = {}
    for rep, t in forward.templates.items():
        inside = tuple(i for i in t.indices if i in wanted)
        outside = tuple(i for i in t.indices if i not in wanted)
        if not inside or not outside:
            continue
        keep, other = (inside, outside) if rep in inside else (outside, inside)
        moves[rep] = (min(other), keep, other)
    if not moves:
        return forward, backward
    offset = _tensor_ids((forward, backward))
    renamed: dict[tuple[int, int], int] = {}  # (representative, tensor id) -> copy's id
    for g in (forward, backward):
        for n in g.nodes:
            if n.layer_index in moves:
                for t in (t for m in (n, *n.fused_from) for t in m.outputs):
                    if t.tensor_id is not None and t.param is None:
                        key = (n.layer_index, t.tensor_id)
                        if key not in renamed:
                            renamed[key] = offset + len(renamed)

    def copy_tensor(t: TensorMeta, rep: int, new_rep: int) -> TensorMeta:
        changes: dict[str, Any] = {}
        if t.tensor_id is not None and (rep, t.tensor_id) in renamed:
            changes["tensor_id"] = renamed[(rep, t.tensor_id)]
        if t.param is not None:
            changes["param"] = f"{t.param}@{new_rep}"
        return evolve(t, **changes) if changes else t

    def split(graph: OpGraph) -> OpGraph:
        templates = dict(graph.templates)
        for rep, (new_rep, keep, other) in moves.items():
            kind = templates[rep].kind if rep in templates else "layer"
            templates[rep] = LayerTemplate(kind, rep, keep)
            templates[new_rep] = LayerTemplate(kind, new_rep, other)
        last_of: dict[int, int] = {}
        for pos, n in enumerate(graph.nodes):
            if n.layer_index in moves:
                last_of[n.layer_index] = pos
        next_id = _next_id(graph)
        copies: dict[int, list[OpNode]] = {}
        id_map: dict[int, int] = {}
        for n in graph.nodes:
            if n.layer_index not in moves:
                continue
            rep = n.layer_index
            new_rep = moves[rep][0]
            attrs = dict(n.attrs)
            for key in ("seq_nr", "fwd_seq_nr"):
                if isinstance(attrs.get(key), int):
                    attrs[key] += _SEQ_OFFSET
            id_map[n.id] = next_id
            copies.setdefault(last_of[rep], []).append(evolve(
                n, id=next_id, layer_index=new_rep, attrs=attrs,
                inputs=tuple(copy_tensor(t, rep, new_rep) for t in n.inputs),
                outputs=tuple(copy_tensor(t, rep, new_rep) for t in n.outputs),
                fused_from=tuple(evolve(m, inputs=tuple(copy_tensor(t, rep, new_rep)
                                                        for t in m.inputs),
                                        outputs=tuple(copy_tensor(t, rep, new_rep)
                                                      for t in m.outputs))
                                 for m in n.fused_from)))
            next_id += 1
        nodes: list[OpNode] = []
        for pos, n in enumerate(graph.nodes):
            nodes.append(n)
            nodes.extend(copies.get(pos, ()))
        layer_of = {n.id: n.layer_index for n in graph.nodes}
        edges = list(graph.edges)
        for a, b in graph.edges:
            if b in id_map:
                edges.append((id_map.get(a, a) if layer_of.get(a) == layer_of.get(b) else a,
                              id_map[b]))
        return evolve(graph.with_nodes(nodes, edges), templates=templates)

    return split(forward), split(backward)


def add_mtp_layers(forward: OpGraph, backward: OpGraph, kinds: Sequence[str], depths: int,
                   *, shared_weights: bool = False) -> tuple[OpGraph, OpGraph, tuple[int, ...]]:
    """Multi-token prediction (DeepSeek-V3; Megatron-Core's ``--mtp-num-layers``) as the
    graphs run it: each of ``depths`` MTP modules is a transformer block of the layer kinds
    ``kinds`` (Nemotron-H's ``"*E"``: attention then MoE; DeepSeek's: one MoE layer) plus its
    own output head and loss over the whole vocabulary. The HF models leave MTP out of the
    forward, so the capture has none of it.

    Each MTP layer is a copy of the representative of the template of its kind, appended
    after the last decoder layer (forward) and before it (backward), as a layer template of
    its own with a new index (``num_layers``, ``num_layers + 1``...): fresh node and tensor
    ids, sequence numbers offset, weights named ``<name>@mtp<d>`` (``@mtp`` for every depth
    with ``shared_weights``: Megatron's ``mtp_use_repeated_layer`` runs one block's weights
    at every depth). Each depth also repeats the outer head side — final norm, LM head (the
    shared output weight) and cross-entropy loss — forward and backward. Not modelled: the
    ``eh_proj`` (2h → h) projection and the two norms that feed each block (``4h²`` FLOPs
    per token against the head's ``2hV``).

    :returns: the graphs and the new layer indices, in order.
    """
    if depths <= 0 or not kinds:
        return forward, backward, ()
    by_kind = {t.kind: rep for rep, t in forward.templates.items()}
    missing = [k for k in kinds if k not in by_kind]
    if missing:
        raise SpecError(f"MTP layer kind(s) {', '.join(missing)} not among the captured "
                        f"templates ({', '.join(by_kind)})")
    top = 1 + max((i for t in forward.templates.values() for i in t.indices), default=-1)
    plan = [(top + d * len(kinds) + j, by_kind[k], d) for d in range(depths)
            for j, k in enumerate(kinds)]
    offset = _tensor_ids((forward, backward))
    counter = [offset]
    renamed: dict[tuple[Any, int], int] = {}

    def fresh(key: Any, t: TensorMeta) -> TensorMeta:
        changes: dict[str, Any] = {}
        if t.tensor_id is not None and (key, t.tensor_id) in renamed:
            changes["tensor_id"] = renamed[(key, t.tensor_id)]
        return evolve(t, **changes) if changes else t

    def produce(key: Any, nodes: Sequence[OpNode]) -> None:
        for n in nodes:
            for t in (t for m in (n, *n.fused_from) for t in m.outputs):
                if t.tensor_id is not None and t.param is None and \
                        (key, t.tensor_id) not in renamed:
                    renamed[(key, t.tensor_id)] = counter[0]
                    counter[0] += 1

    def outer_head(graph: OpGraph) -> list[OpNode]:
        positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
        if not positions:
            return []
        if graph.phase == Phase.TRAIN_BACKWARD:
            return list(graph.nodes[:positions[0]])
        return list(graph.nodes[positions[-1] + 1:])

    segments = {g.phase: {rep: [n for n in g.nodes if n.layer_index == rep]
                          for _, rep, _ in plan} for g in (forward, backward)}
    heads = {g.phase: outer_head(g) for g in (forward, backward)}
    for new, rep, _d in plan:
        for g in (forward, backward):
            produce(("layer", new), segments[g.phase][rep])
    for d in range(depths):
        for g in (forward, backward):
            produce(("head", d), heads[g.phase])

    def copy_nodes(nodes: Sequence[OpNode], key: Any, start: int, layer: int | None,
                   suffix: str | None, seq: int) -> tuple[list[OpNode], dict[int, int]]:
        out, ids = [], {}
        for i, n in enumerate(nodes):
            attrs = dict(n.attrs)
            for k in ("seq_nr", "fwd_seq_nr"):
                if isinstance(attrs.get(k), int):
                    attrs[k] += seq

            def t2(t: TensorMeta) -> TensorMeta:
                t = fresh(key, t)
                if suffix and t.param is not None:
                    t = evolve(t, param=f"{t.param}@{suffix}")
                return t

            ids[n.id] = start + i
            out.append(evolve(
                n, id=start + i, layer_index=layer if n.layer_index is not None else None,
                attrs=attrs, inputs=tuple(t2(t) for t in n.inputs),
                outputs=tuple(t2(t) for t in n.outputs),
                fused_from=tuple(evolve(m, inputs=tuple(t2(t) for t in m.inputs),
                                        outputs=tuple(t2(t) for t in m.outputs))
                                 for m in n.fused_from)))
        return out, ids

    def extend(graph: OpGraph) -> OpGraph:
        backward_phase = graph.phase == Phase.TRAIN_BACKWARD
        next_id = _next_id(graph)
        layer_copies: list[OpNode] = []
        head_copies: list[OpNode] = []
        edges = list(graph.edges)
        templates = dict(graph.templates)
        order = list(reversed(plan)) if backward_phase else plan
        for new, rep, d in order:
            suffix = "mtp" if shared_weights else f"mtp{d}"
            made, ids = copy_nodes(segments[graph.phase][rep], ("layer", new), next_id, new,
                                   suffix, _SEQ_OFFSET * (2 + new))
            next_id += len(made)
            layer_copies.extend(made)
            edges.extend((ids[a], ids[b]) for a, b in graph.edges if a in ids and b in ids)
            templates[new] = LayerTemplate(forward.templates[rep].kind, new, (new,))
        for d in range(depths):
            made, ids = copy_nodes(heads[graph.phase], ("head", d), next_id, None, None,
                                   _SEQ_OFFSET * (2 + top + len(plan) + d))
            next_id += len(made)
            head_copies.extend(made)
            edges.extend((ids[a], ids[b]) for a, b in graph.edges if a in ids and b in ids)
        positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
        nodes = list(graph.nodes)
        if backward_phase:
            # the heads' backward first, then the MTP layers', then the decoder's
            nodes = head_copies + nodes[:positions[0]] + layer_copies + nodes[positions[0]:]
        else:
            nodes = nodes[:positions[-1] + 1] + layer_copies + nodes[positions[-1] + 1:] \
                + head_copies
        return evolve(graph.with_nodes(nodes, edges), templates=templates)

    return extend(forward), extend(backward), tuple(new for new, _, _ in plan)


# -- recompute ------------------------------------------------------------------------------------


@frozen
class Recompute:
    """Activation recomputation, as Megatron-LM runs it.

    - ``none``: nothing changes.
    - ``selective`` (``--recompute-granularity selective``, Korthikanti et al. 2022): the
      attention core (the fused attention kernel) is re-run in the backward, just before its
      own backward; its internal outputs (the softmax statistics) are not kept.
    - ``full`` (``--recompute-granularity full --recompute-method uniform
      --recompute-num-layers 1``): only each layer's input is kept; the whole layer forward,
      its TP/SP/EP communication included, re-runs just before that layer's backward.

    Re-run nodes are copies of the forward nodes (phase ``train_backward``,
    ``attrs["recompute"] = True``, new node and tensor ids); the backward nodes of the layer
    read the re-computed tensors instead of saved ones, which is how the memory model sees
    what is no longer kept. A copied collective keeps how the forward runs it (its
    ``attrs["overlap"]``), since a recomputed forward blocks like a forward.

    :param forward: the ``train_forward`` graph the backward came from.
    :param rules: overlap rules, to pin how copied collectives run.
    """

    mode: str
    forward: OpGraph
    rules: OverlapRules | None = None
    name: str = "recompute"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        if graph.phase != Phase.TRAIN_BACKWARD:
            raise SpecError(f"recompute applies to the train_backward graph, not {graph.phase}")
        if self.mode == "none":
            return graph
        if self.mode not in ("selective", "full"):
            raise SpecError(f"unknown recompute mode {self.mode!r}",
                            "use none, selective or full")
        fwd_by_layer: dict[int, list[OpNode]] = {}
        for n in self.forward.nodes:
            if n.layer_index is not None:
                fwd_by_layer.setdefault(n.layer_index, []).append(n)
        node_offset = _next_id(graph)
        tensor_offset = _tensor_ids((graph, self.forward))
        copies: dict[int, list[OpNode]] = {}  # backward node id -> copies inserted before it
        renamed: dict[int, int] = {}  # forward tensor id -> recomputed tensor id
        new_edges: list[tuple[int, int]] = []
        fwd_edges = self.forward.edges

        if self.mode == "full":
            first_bwd: dict[int, int] = {}
            for n in graph.nodes:
                if n.layer_index is not None and n.layer_index not in first_bwd:
                    first_bwd[n.layer_index] = n.id
            for layer, nodes in fwd_by_layer.items():
                if layer not in first_bwd:
                    continue
                made = self._copy(nodes, node_offset, tensor_offset, renamed)
                node_offset += len(made)
                copies.setdefault(first_bwd[layer], []).extend(made)
                new_edges.extend(_copied_edges(nodes, made, fwd_edges))
                new_edges.append((made[-1].id, first_bwd[layer]))
        else:  # selective: the attention core
            for nodes in fwd_by_layer.values():
                groups = _attention_cores(nodes)
                for core in groups:
                    seq = next((c.attrs.get("seq_nr") for c in reversed(core)
                                if c.attrs.get("seq_nr") is not None), None)
                    target = next((n for n in graph.nodes if n.layer_index is not None and
                                   n.attrs.get("fwd_seq_nr") == seq and
                                   (n.category == Category.ATTENTION or
                                    n.attrs.get(CORE_ATTENTION_ATTR))), None)
                    if target is None:
                        continue
                    made = self._copy(core, node_offset, tensor_offset, renamed)
                    node_offset += len(made)
                    copies.setdefault(target.id, []).extend(made)
                    new_edges.extend(_copied_edges(core, made, fwd_edges))
                    new_edges.append((made[-1].id, target.id))

        out: list[OpNode] = []
        recompute_ids = {c.id for cs in copies.values() for c in cs}
        for n in graph.nodes:
            out.extend(copies.get(n.id, ()))
            out.append(_rename_inputs(n, renamed) if n.layer_index is not None else n)
        edges = [*graph.edges, *new_edges]
        meta = {**graph.meta, "recompute": self.mode}
        result = evolve(graph.with_nodes(out, edges), meta=meta)
        assert len(recompute_ids) == sum(len(c) for c in copies.values())
        return result

    def _copy(self, nodes: Sequence[OpNode], node_offset: int, tensor_offset: int,
              renamed: dict[int, int]) -> list[OpNode]:
        made = []
        for i, n in enumerate(nodes):
            for t in n.outputs:
                if t.tensor_id is not None and t.param is None:
                    renamed[t.tensor_id] = t.tensor_id + tensor_offset
            attrs = {k: v for k, v in n.attrs.items() if k != "seq_nr"}
            attrs[RECOMPUTE_ATTR] = True
            if "seq_nr" in n.attrs:
                attrs["fwd_seq_nr"] = n.attrs["seq_nr"]
            if n.category == Category.COLLECTIVE and "overlap" not in attrs:
                attrs["overlap"] = _forward_hint(n, self.rules)
            made.append(evolve(
                n, id=node_offset + i, phase=Phase.TRAIN_BACKWARD, attrs=attrs,
                inputs=tuple(_renamed(t, renamed) for t in n.inputs),
                outputs=tuple(_renamed(t, renamed) for t in n.outputs)))
        return made


def _attention_cores(nodes: Sequence[OpNode]) -> list[list[OpNode]]:
    """The attention cores among a layer's forward nodes: each fused attention node, or each
    run of nodes marked ``core_attention`` (:class:`UnfusedAttention`)."""
    cores: list[list[OpNode]] = []
    run: list[OpNode] = []
    for n in nodes:
        if n.attrs.get(CORE_ATTENTION_ATTR):
            run.append(n)
            continue
        if run:
            cores.append(run)
            run = []
        if n.category == Category.ATTENTION:
            cores.append([n])
    if run:
        cores.append(run)
    return cores


def _forward_hint(node: OpNode, rules: OverlapRules | None) -> str:
    """The ``attrs["overlap"]`` that makes a recomputed collective run as in the forward."""
    from zrt_core.schedule.scheduler import OverlapRules
    from zrt_core.schedule.timeline import ASYNC, PIPELINED

    plan = (rules or OverlapRules()).plan(node)
    if plan.mode == PIPELINED:
        return plan.side
    if plan.mode == ASYNC:
        return "async"
    return "none"


def _renamed(t: TensorMeta, renamed: Mapping[int, int]) -> TensorMeta:
    new = renamed.get(t.tensor_id) if t.tensor_id is not None else None
    return evolve(t, tensor_id=new) if new is not None else t


def _rename_inputs(n: OpNode, renamed: Mapping[int, int]) -> OpNode:
    if not renamed or not any(t.tensor_id in renamed for t in n.inputs):
        return n
    return evolve(n, inputs=tuple(_renamed(t, renamed) for t in n.inputs))


def _copied_edges(originals: Sequence[OpNode], copies: Sequence[OpNode],
                  edges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    mapping = {o.id: c.id for o, c in zip(originals, copies, strict=True)}
    return [(mapping[a], mapping[b]) for a, b in edges if a in mapping and b in mapping]


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
            changed = True
        return graph.with_nodes(nodes, edges) if changed else graph

    return (expand(forward, "fused.cross_entropy", MEGATRON_CE_FORWARD),
            expand(backward, "fused.cross_entropy_backward", MEGATRON_CE_BACKWARD))


# -- mixed precision ----------------------------------------------------------------------------


@frozen
class PrecisionPlan:
    """What a precision recipe runs on a given device.

    :param requested: the recipe asked for (``bf16``, ``fp8``, ``mxfp8``, ``nvfp4``...).
    :param recipe: the recipe that runs (after falling back where the device lacks units).
    :param activation_dtype: dtype of captured activations and weights (bf16 or fp16).
    :param gemm_dtype: dtype of the forward GEMM operands; None keeps ``activation_dtype``.
    :param grad_dtype: dtype of the output gradients fed to backward GEMMs.
    :param block: elements per scale (32 for MXFP8, 16 for NVFP4; 0 per-tensor scaling).
    :param scale_bytes: bytes of one scale.
    :param amax_pass: the recipe reads each tensor once more to find its amax before casting
        (per-tensor current scaling; NVFP4's per-tensor fp32 second-level scale); delayed
        scaling takes it from history, MXFP8's block scales need none.
    :param hadamard: NVFP4's random Hadamard transform on the weight-gradient GEMM's inputs:
        the column-wise copy of every activation and output gradient is cast from ``H·x``
        (16 × 16 blocks) in a kernel of its own, which reads the tensor once more and does
        a 16-point transform per value (32 FLOPs).
    :param high_precision_layers: decoder-layer indices whose linear layers stay in
        ``activation_dtype`` (Megatron's ``--first-last-layers-bf16`` with
        ``--num-layers-at-start-in-bf16`` / ``--num-layers-at-end-in-bf16``).
    :param note: why the recipe differs from the one asked for, if it does.
    """

    requested: str
    recipe: str
    activation_dtype: str
    gemm_dtype: str | None = None
    grad_dtype: str | None = None
    block: int = 0
    scale_bytes: int = 0
    amax_pass: bool = False
    note: str = ""
    hadamard: bool = False
    high_precision_layers: frozenset[int] = field(default=frozenset(), converter=frozenset)

    @property
    def low_precision(self) -> bool:
        return self.gemm_dtype is not None

    @property
    def cast_reads(self) -> int:
        """Times a cast reads its bf16 tensor: the cast itself, the amax pass, the
        column-wise Hadamard cast."""
        return 1 + int(self.amax_pass) + int(self.hadamard)

    def quantized_layer(self, template: LayerTemplate | None, index: int | None) -> bool:
        """Whether the linear layers of a layer template run in the recipe's dtype (a
        template stands for layers that are all kept in high precision or none is, after
        :func:`split_layer_templates`)."""
        if not self.low_precision or index is None:
            return False
        if not self.high_precision_layers:
            return True
        indices = template.indices if template is not None else (index,)
        return not all(i in self.high_precision_layers for i in indices)

    def quantized_bytes(self, elements: int, dtype: str) -> float:
        """Bytes of ``elements`` values in ``dtype`` with their block scales."""
        scales = (elements / self.block) * self.scale_bytes if self.block else 0.0
        return elements * dtype_bytes(dtype) + scales


def precision_plan(precision: str, hardware: HardwareSpec, *,
                   high_precision_layers: Iterable[int] = ()) -> PrecisionPlan:
    """Resolve a training precision on a device (docs/training-model.md, "Precision").

    - ``fp16`` / ``bf16`` / ``fp32``: GEMMs in that dtype (fp32 runs at the TF32 rate).
    - ``fp8``: TransformerEngine's default ``DelayedScaling`` recipe, hybrid format — E4M3
      activations and weights, E5M2 gradients; per-tensor scales from the amax history.
    - ``mxfp8``: ``MXFP8BlockScaling`` — E4M3 everywhere with one E8M0 scale per 32
      values, row- and column-wise copies. A Blackwell tensor-core feature: on a device
      without it (taken as one without fp4 units) it falls back to ``fp8`` with a note.
    - ``nvfp4``: ``NVFP4BlockScaling`` (TransformerEngine; NVIDIA, "Pretraining Large
      Language Models with NVFP4", 2025) — E2M1 with one E4M3 scale per 16 values and a
      per-tensor fp32 scale (an amax pass before each cast), 16 × 16 block scales for
      weights, stochastic rounding of gradients, a random Hadamard transform on the
      weight-gradient GEMM's inputs; needs fp4 units, else falls back to ``mxfp8`` (and on
      to ``fp8``) with a note.
    - a device without fp8 units runs any fp8/fp4 recipe in bf16, with a note.

    ``high_precision_layers``: decoder layers whose linear layers stay bf16 (Megatron's
    ``first_last_layers_bf16``), for the low-precision recipes.
    """
    compute = hardware.compute
    if precision in ("bf16", "fp32"):
        return PrecisionPlan(precision, precision, "bfloat16" if precision == "bf16"
                             else "float32")
    if precision == "fp16":
        return PrecisionPlan(precision, precision, "float16")
    notes = []
    recipe = precision
    if recipe == "nvfp4" and not compute.supports("fp4"):
        notes.append(f"{hardware.id} has no fp4 tensor cores: nvfp4 runs as mxfp8")
        recipe = "mxfp8"
    if recipe == "mxfp8" and not compute.supports("fp4"):
        notes.append(f"{hardware.id} has no MX block-scaled tensor cores (Blackwell): "
                     "mxfp8 runs as fp8 with per-tensor delayed scaling")
        recipe = "fp8"
    if not compute.supports("fp8"):
        notes.append(f"{hardware.id} has no fp8 tensor cores: {precision} runs in bf16")
        return PrecisionPlan(precision, "bf16", "bfloat16", note="; ".join(notes))
    note = "; ".join(notes)
    keep = frozenset(high_precision_layers)
    if recipe == "fp8":
        return PrecisionPlan(precision, "fp8", "bfloat16", gemm_dtype="float8_e4m3fn",
                             grad_dtype="float8_e5m2", note=note, high_precision_layers=keep)
    if recipe == "mxfp8":
        return PrecisionPlan(precision, "mxfp8", "bfloat16", gemm_dtype="mxfp8",
                             grad_dtype="mxfp8", block=32, scale_bytes=1, note=note,
                             high_precision_layers=keep)
    if recipe == "nvfp4":
        return PrecisionPlan(precision, "nvfp4", "bfloat16", gemm_dtype="nvfp4",
                             grad_dtype="nvfp4", block=16, scale_bytes=1, amax_pass=True,
                             hadamard=True, note=note, high_precision_layers=keep)
    raise SpecError(f"unknown training precision {precision!r}",
                    "use fp32, bf16, fp16, fp8, mxfp8 or nvfp4")


@frozen
class Precision:
    """Low-precision GEMMs as TransformerEngine runs them (fp8, mxfp8, nvfp4).

    The linear layers inside decoder layers (TE ``Linear``/``LayerNormLinear``/
    ``GroupedLinear``: every GEMM that reads a weight, its input- and weight-gradient GEMMs)
    take the recipe's dtype; attention, the embedding and the LM head stay in bf16 (Megatron's
    output layer is not a TE module). Each distinct activation or output-gradient tensor
    feeding such GEMMs gets one cast kernel (``precision.quantize``, category elementwise,
    ``attrs["quantize"] = True``): it reads the bf16 tensor (twice with an amax pass) and
    writes the row-wise and column-wise (transposed) low-precision copies with their
    scales — TE's fused ``cast_transpose``. Weights are cast once per step (TE caches them
    across micro-batches), in the optimizer graph. Saved GEMM inputs are the low-precision
    copies, so activation memory shrinks accordingly.
    """

    plan: PrecisionPlan
    forward: OpGraph | None = None
    name: str = "precision"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        """With ``forward`` (the graph a backward came from), the tensors the forward
        touched are saved activations (cast there), the rest output gradients; without
        it, what no backward node produced counts as saved."""
        plan = self.plan
        if not plan.low_precision:
            return graph
        backward = graph.phase == Phase.TRAIN_BACKWARD
        next_id = _next_id(graph)
        casts: dict[int, OpNode] = {}  # source tensor id -> its cast node
        out: list[OpNode] = []
        edges = list(graph.edges)
        producers = {t.tensor_id: n.id for n in graph.nodes for t in n.outputs
                     if t.tensor_id is not None}
        forward_ids = None
        if backward and self.forward is not None:
            # every tensor the forward touched (a layer template's input comes from an
            # unrecorded stand-in): gradients never appear there
            forward_ids = {t.tensor_id for n in self.forward.nodes
                           for m in (n, *n.fused_from) for t in (*m.inputs, *m.outputs)
                           if t.tensor_id is not None}
        for n in graph.nodes:
            if not _is_linear_gemm(n, backward) or not plan.quantized_layer(
                    graph.templates.get(n.layer_index), n.layer_index):
                out.append(n)
                continue
            inputs = []
            extra_read = 0.0
            for t in n.inputs:
                if len(t.shape) < 2 or t.dtype not in _FLOAT_DTYPES:
                    inputs.append(t)
                    continue
                if forward_ids is not None:
                    grad_side = backward and t.param is None and t.tensor_id not in forward_ids
                else:
                    grad_side = backward and t.param is None and not _saved(t, producers)
                dtype = plan.grad_dtype if grad_side else plan.gemm_dtype
                assert dtype is not None
                extra_read += plan.quantized_bytes(t.numel, dtype) - t.numel * dtype_bytes(dtype)
                if t.param is None and t.tensor_id is not None and t.tensor_id not in casts \
                        and (backward is False or grad_side):
                    cast = self._cast(next_id, n, t, dtype)
                    next_id += 1
                    casts[t.tensor_id] = cast
                    out.append(cast)
                    if t.tensor_id in producers:
                        edges.append((producers[t.tensor_id], cast.id))
                if t.param is None and t.tensor_id in casts:
                    edges.append((casts[t.tensor_id].id, n.id))
                inputs.append(evolve(t, dtype=dtype))
            read = sum(t.nbytes for t in inputs) + int(extra_read)
            out.append(evolve(n, inputs=tuple(inputs), bytes_read=read,
                              attrs={**n.attrs, "precision": plan.recipe}))
        meta = {**graph.meta, "precision": plan.recipe}
        return evolve(graph.with_nodes(out, edges), meta=meta)

    def _cast(self, node_id: int, consumer: OpNode, t: TensorMeta, dtype: str) -> OpNode:
        plan = self.plan
        elements = t.numel
        read = elements * dtype_bytes(t.dtype) * plan.cast_reads
        # row-wise and column-wise (transposed) copies, each with its scales
        written = 2 * plan.quantized_bytes(elements, dtype)
        flops = 3 * elements  # scale, round, (and amax) per value
        if plan.hadamard:
            flops += 32 * elements  # a 16-point Hadamard transform per value
        return OpNode(
            id=node_id, op="precision.quantize", category=Category.ELEMENTWISE,
            phase=consumer.phase, inputs=(t,),
            outputs=(TensorMeta(shape=t.shape, dtype=dtype),),
            module_path=consumer.module_path, module_class=consumer.module_class,
            layer_index=consumer.layer_index, layer_kind=consumer.layer_kind, flops=flops,
            bytes_read=int(read), bytes_written=int(written), formula="precision.quantize",
            attrs={QUANTIZE_ATTR: True, "recipe": plan.recipe, "dtype": dtype})


def _saved(t: TensorMeta, producers: Mapping[int | None, int]) -> bool:
    """In a backward graph, a tensor no backward node produced is a saved activation."""
    return t.tensor_id is not None and t.tensor_id not in producers


def _is_linear_gemm(n: OpNode, backward: bool) -> bool:
    """A linear layer's GEMM (TE ``Linear``/``GroupedLinear``): not a convolution (Mamba's
    depthwise conv1d is ``nn.Conv1d`` / ``causal_conv1d`` in bf16)."""
    if n.category != Category.MATMUL or n.layer_index is None or "convolution" in n.op:
        return False
    if backward:
        return n.attrs.get("grad") in (WEIGHT_GRAD, INPUT_GRAD)
    return any(t.param is not None for t in n.inputs)


# -- communication overlap -------------------------------------------------------------------


def tp_overlap_hints(backward: OpGraph, forward: OpGraph, rules: OverlapRules) -> OpGraph:
    """How TransformerEngine overlaps the backward's TP/SP collectives when
    ``--tp-comm-overlap`` is on (``rules.tp_comm_overlap > 0``): the all-gather of an output
    gradient is chunked with the GEMM that reads it (``"consumer"``), a reduce-scatter or
    all-reduce of an input gradient with the GEMM that makes it (``"producer"``), and the
    all-gather of a saved activation for a weight-gradient GEMM runs in bulk beside the
    input-gradient GEMM (``"async"``). Collectives that already carry a hint keep it;
    without TP overlap the scheduler's defaults apply (Megatron's async backward all-reduce).
    """
    if rules.tp_comm_overlap <= 0:
        return backward
    forward_ids = {t.tensor_id for n in forward.nodes for m in (n, *n.fused_from)
                   for t in (*m.inputs, *m.outputs) if t.tensor_id is not None}
    nodes = []
    changed = False
    for n in backward.nodes:
        if n.category == Category.COLLECTIVE and n.attrs.get("group") in ("tp", "etp") \
                and "overlap" not in n.attrs:
            kind = n.attrs.get("collective")
            if kind == "all_gather":
                saved = any(t.tensor_id in forward_ids for t in n.inputs)
                hint = "async" if saved else "consumer"
            elif kind in ("reduce_scatter", "all_reduce"):
                hint = "producer"
            else:
                hint = None
            if hint is not None:
                n = evolve(n, attrs={**n.attrs, "overlap": hint})
                changed = True
        nodes.append(n)
    return backward.with_nodes(nodes, backward.edges) if changed else backward


# -- parameters per layer --------------------------------------------------------------------


@frozen
class ParamGroup:
    """Parameters of one layer template (or of the embedding / head side) on one device.

    ``dense`` and ``expert`` count elements after tensor/expert sharding; ``matrices`` are the
    2-D (and 3-D expert) weight shapes, for Muon.
    """

    key: str
    layer_index: int | None
    dense: int
    expert: int
    matrices: tuple[tuple[int, ...], ...] = field(default=(), converter=tuple)

    @property
    def total(self) -> int:
        return self.dense + self.expert


@frozen
class ParamInventory:
    """Per-device parameter elements by layer template and outer side.

    :param layers: template representative → its :class:`ParamGroup` (one layer's worth).
    :param embedding: parameters used before the first layer (token/position embeddings).
    :param head: parameters used after the last layer (final norm, LM head).
    :param tied_head: elements of the LM head's weight when it is tied to the word
        embedding: Megatron keeps one copy with pp = 1 and a second on the last stage with
        pp > 1 (its gradient all-reduced with the first stage's). 0 when untied (the head's
        weight is then in ``head``).
    """

    layers: Mapping[int, ParamGroup]
    embedding: ParamGroup
    head: ParamGroup
    tied_head: int = 0
    #: the parameters that train when not all do (LoRA's adapters): gradients and optimizer
    #: states; None when every parameter trains
    trainable: ParamInventory | None = None

    def stage(self, layers: Iterable[int], templates: Mapping[int, LayerTemplate], *,
              first: bool, last: bool, pp: int) -> tuple[int, int]:
        """(dense, expert) elements of a pipeline stage holding ``layers``."""
        rep_of = {i: rep for rep, t in templates.items() for i in t.indices}
        dense = expert = 0
        for i in layers:
            g = self.layers.get(rep_of.get(i, i))
            if g is not None:
                dense += g.dense
                expert += g.expert
        if first:
            dense += self.embedding.dense
        if last:
            dense += self.head.dense
            if pp > 1:
                dense += self.tied_head
        return dense, expert


def param_inventory(forward: OpGraph, parallel: Parallel, dims: Any) -> ParamInventory:
    """Parameter elements per device from the forward graph's weight tensors.

    When the graph's weights are still the full model's (the parallel transform, which
    records ``meta["parallel"]``, has not run), Megatron's sharding is
    applied by rule: routed-expert weights ``/ (ep × expert tp)``; 1-D parameters of the
    hidden size (norms, row-parallel biases) and router weights replicated; everything else
    (QKV/output/MLP/SSM projections, vocabulary-parallel embedding and head) ``/ tp``.
    """
    sharded = "parallel" in forward.meta
    hidden = getattr(dims, "hidden", 0)
    experts = getattr(dims, "experts", 0)
    first_layer_pos = next((i for i, n in enumerate(forward.nodes)
                            if n.layer_index is not None), len(forward.nodes))
    seen: set[str] = set()
    per_layer: dict[int | None, list[int]] = {}
    matrices: dict[int | None, list[tuple[int, ...]]] = {}
    outer_side: dict[str, str] = {}
    buckets: dict[str, list[int]] = {"embedding": [0, 0], "head": [0, 0]}
    outer_matrices: dict[str, list[tuple[int, ...]]] = {"embedding": [], "head": []}
    for pos, n in enumerate(forward.nodes):
        for t in n.inputs:
            name = t.param
            if name is None or name in seen:
                continue
            seen.add(name)
            expert = is_expert_param(name)
            numel, shape = _local_param(t, expert, sharded, parallel, hidden, experts)
            if n.layer_index is None:
                side = "embedding" if pos < first_layer_pos else "head"
                outer_side[name] = side
                buckets[side][1 if expert else 0] += numel
                if len(shape) >= 2:
                    outer_matrices[side].append(shape)
            else:
                acc = per_layer.setdefault(n.layer_index, [0, 0])
                acc[1 if expert else 0] += numel
                if len(shape) >= 2:
                    matrices.setdefault(n.layer_index, []).append(shape)
    layers = {i: ParamGroup(f"layer{i}", i, d, e, matrices.get(i, ()))
              for i, (d, e) in per_layer.items() if i is not None}
    tied = 0
    if getattr(dims, "tie_word_embeddings", False):
        # the head's weight has the word embedding's shape (transposed or not)
        word = [sh for sh in outer_matrices["embedding"] if sh and
                max(sh) >= getattr(dims, "vocab", 0) // max(parallel.tp, 1)]
        for sh in list(outer_matrices["head"]):
            if any(sh == w or sh == tuple(reversed(w)) for w in word):
                tied = math.prod(sh)
                outer_matrices["head"].remove(sh)
                buckets["head"][0] -= tied
                break
    return ParamInventory(
        layers=layers,
        embedding=ParamGroup("embedding", None, *buckets["embedding"],
                             outer_matrices["embedding"]),
        head=ParamGroup("head", None, *buckets["head"], outer_matrices["head"]),
        tied_head=tied)


def _local_param(t: TensorMeta, expert: bool, sharded: bool, parallel: Parallel,
                 hidden: int, experts: int) -> tuple[int, tuple[int, ...]]:
    shape = t.shape
    if sharded:
        return t.numel, shape
    if expert:
        ep, etp = parallel.ep, parallel.expert_tp
        if len(shape) == 3 and shape[0] % ep == 0:
            shape = (shape[0] // ep, shape[1], shape[2])
        else:
            return t.numel // (ep * etp), shape
        if etp > 1:
            shape = (shape[0], shape[1], max(1, shape[2] // etp))
        return math.prod(shape), shape
    tp = parallel.tp
    if tp == 1:
        return t.numel, shape
    replicated = (len(shape) == 1 and shape[0] == hidden) or \
        (len(shape) == 2 and experts and shape[0] == experts)
    if replicated:
        return t.numel, shape
    if len(shape) >= 2:
        shape = (max(1, shape[0] // tp), *shape[1:])
        return math.prod(shape), shape
    return max(1, t.numel // tp), (max(1, t.numel // tp),)


# -- data-parallel gradient sync and ZeRO-3 / FSDP gathers ----------------------------------------


def grad_dtype(precision: str) -> str:
    """The gradient buffer's dtype: Megatron accumulates and reduces bf16 (and fp8-recipe)
    gradients in fp32 (``accumulate_allreduce_grads_in_fp32``, forced for bf16); fp16 runs
    keep fp16 gradients (ZeRO's 2 + 2 + 12 bytes); fp32 runs fp32."""
    return "float16" if precision == "fp16" else "float32"


def dp_groups(parallel: Parallel) -> tuple[str, str]:
    """(dense group, expert group) of the gradient reduction: dense weights reduce over
    DP × CP (Megatron's ``dp_cp`` group), routed experts over the expert-DP replicas."""
    return ("dp_cp" if parallel.cp > 1 else "dp"), "edp"


@frozen
class GradientSync:
    """Data-parallel gradient reduction, bucketed per layer and overlapped with backward.

    After the last backward node of each layer (template) the layer's gradients are reduced:
    an all-reduce without a sharded optimizer (ZeRO 0), a reduce-scatter with Megatron's
    distributed optimizer / ZeRO ≥ 1 / FSDP. Dense weights reduce over ``dp`` (``dp_cp``
    with context parallelism), routed experts over ``edp``. ``attrs["overlap"] =
    "backward"``: with ``overlap_grad_reduce`` the bucket runs during the rest of the
    backward and only what is left after the last one is exposed (Megatron's
    ``--overlap-grad-reduce``; DeepSpeed and FSDP alike). Buckets are per layer: Megatron's
    default bucket (40 M parameters, or 1 M × dp) holds about one layer of a large model.

    :param inventory: parameters per device (:func:`param_inventory`).
    :param grad_dtype: the dtype gradients are reduced in (:func:`grad_dtype`).
    """

    inventory: ParamInventory
    grad_dtype: str
    sharded: bool
    algorithm: str | None = None
    name: str = "dp_grad_sync"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        dense_group, expert_group = dp_groups(p)
        dense_size = p.span(dense_group)[0]
        expert_size = p.span(expert_group)[0]
        if dense_size == 1 and expert_size == 1:
            return graph
        kind = "reduce_scatter" if self.sharded else "all_reduce"
        nbytes = dtype_bytes(self.grad_dtype)
        last_of: dict[int, int] = {}
        for n in graph.nodes:
            if n.layer_index is not None:
                last_of[n.layer_index] = n.id
        first_layer = next((i for i, n in enumerate(graph.nodes)
                            if n.layer_index is not None), len(graph.nodes))
        last_layer = max((i for i, n in enumerate(graph.nodes) if n.layer_index is not None),
                         default=-1)
        head_anchor = graph.nodes[first_layer - 1].id if first_layer > 0 else None
        embed_anchor = graph.nodes[-1].id if last_layer < len(graph.nodes) - 1 else None
        next_id = _next_id(graph)
        after: dict[int, list[OpNode]] = {}

        def add(anchor: int | None, group: ParamGroup, layer: int | None, kind_name: str | None
                ) -> None:
            nonlocal next_id
            if anchor is None:
                return
            for elements, grp, size in ((group.dense, dense_group, dense_size),
                                        (group.expert, expert_group, expert_size)):
                if elements <= 0 or size <= 1:
                    continue
                node = collective_node(
                    next_id, kind, grp, p, elements * nbytes, phase=Phase.TRAIN_BACKWARD,
                    layer_index=layer, layer_kind=kind_name, module_path=f"dp.{group.key}",
                    overlap="backward", dtype=self.grad_dtype,
                    extra={"algorithm": self.algorithm} if self.algorithm else None)
                next_id += 1
                after.setdefault(anchor, []).append(node)

        for rep, group in self.inventory.layers.items():
            template = graph.templates.get(rep)
            add(last_of.get(rep), group, rep, template.kind if template else None)
        add(head_anchor, self.inventory.head, None, None)
        add(embed_anchor, self.inventory.embedding, None, None)
        out: list[OpNode] = []
        edges = list(graph.edges)
        for n in graph.nodes:
            out.append(n)
            for c in after.get(n.id, ()):
                out.append(c)
                edges.append((n.id, c.id))
        return graph.with_nodes(out, edges)


@frozen
class ParamGather:
    """ZeRO-3 / FSDP parameter all-gathers: before each layer's forward and again before its
    backward (and its recompute), each layer's weights are gathered from their ``dp`` shards
    (``attrs["overlap"] = "prefetch"``: issued one layer ahead, as FSDP's
    ``forward_prefetch``/``backward_prefetch`` and DeepSpeed's prefetch bucket do).

    :param algorithm: the collective algorithm to price (None: the tuner's choice);
        ``"pairwise"`` for DeepSpeed ZeRO-3 as of 2021, whose gathers and gradient
        reduce-scatters ran at one scale-out link per GPU (docs/training-model.md).
    """

    inventory: ParamInventory
    param_dtype: str
    algorithm: str | None = None
    name: str = "zero3_param_gather"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        dense_group, expert_group = dp_groups(p)
        if p.span(dense_group)[0] == 1 and p.span(expert_group)[0] == 1:
            return graph
        nbytes = dtype_bytes(self.param_dtype)
        first_of: dict[int, int] = {}
        consumers: dict[int, list[int]] = {}
        for n in graph.nodes:
            if n.layer_index is None:
                continue
            first_of.setdefault(n.layer_index, n.id)
            if any(t.param is not None for t in n.inputs):
                consumers.setdefault(n.layer_index, []).append(n.id)
        next_id = _next_id(graph)
        before: dict[int, list[OpNode]] = {}
        edges = list(graph.edges)
        for rep, group in self.inventory.layers.items():
            anchor = first_of.get(rep)
            if anchor is None:
                continue
            template = graph.templates.get(rep)
            for elements, grp in ((group.dense, dense_group), (group.expert, expert_group)):
                size = p.span(grp)[0]
                if elements <= 0 or size <= 1:
                    continue
                node = collective_node(
                    next_id, "all_gather", grp, p, elements * nbytes, phase=graph.phase,
                    layer_index=rep, layer_kind=template.kind if template else None,
                    module_path=f"zero3.{group.key}", overlap="prefetch",
                    dtype=self.param_dtype,
                    extra={"algorithm": self.algorithm} if self.algorithm else None)
                next_id += 1
                before.setdefault(anchor, []).append(node)
                edges.extend((node.id, c) for c in consumers.get(rep, ()))
        out: list[OpNode] = []
        for n in graph.nodes:
            out.extend(before.get(n.id, ()))
            out.append(n)
        return graph.with_nodes(out, edges)


# -- the optimizer step ------------------------------------------------------------------------

#: Bytes per element an optimizer keeps in fp32 beyond the bf16/fp16 weight: master weights
#: and moments (Adam/AdamW: master, m, v; Muon and SGD: master, momentum).
STATE_BYTES = {"adam": 12, "adamw": 12, "muon": 8, "sgd": 8}
#: FLOPs per element of one fused AdamW update (moments, bias corrections, the update, decay).
ADAM_FLOPS_PER_ELEMENT = 18
#: Newton–Schulz iterations of Muon's orthogonalisation (Keller Jordan's reference, Moonlight).
MUON_NS_STEPS = 5


def optimizer_graph(
    inventory: ParamInventory,
    templates: Mapping[int, LayerTemplate],
    stage_layers: Sequence[int],
    parallel: Parallel,
    train: TrainSpec,
    *,
    first: bool,
    last: bool,
    plan: PrecisionPlan,
    host_link_gb_per_s: float | None = None,
) -> OpGraph:
    """The ``optimizer`` phase of one pipeline rank (its stages' parameters).

    Per layer template (nodes carry the template, so they run once per layer of the rank):

    - ``optimizer.grad_norm``: the global-norm pass of gradient clipping over the local
      gradient shard (``multi_tensor_l2norm``: reads each gradient once).
    - ``optimizer.adam`` (``adam``/``adamw``): one fused multi-tensor step over the local
      shard: reads the fp32 master weight, both moments and the gradient, writes the three
      states and the bf16/fp16 weight: ``4+4+4+g`` read, ``4+4+4+2`` written per element.
    - ``optimizer.muon`` + Newton–Schulz GEMMs (``muon``): for every 2-D (and expert 3-D)
      weight, ``MUON_NS_STEPS`` iterations of ``A = X·Xᵀ; B = bA + cA²; X = aX + B·X`` in
      bf16 (``4m²n + 2m³`` FLOPs per iteration, m ≤ n); other parameters take AdamW. With a
      sharded optimizer whole matrices are spread over the data-parallel ranks (Moonlight's
      distributed Muon), so a rank orthogonalises ``⌈layers / dp⌉`` layers' worth.
    - With ZeRO ≥ 1 / FSDP the step covers ``1/dp`` of the elements; the updated weights are
      then all-gathered (``comm.all_gather``, ``attrs["overlap"] = "next_step"``: Megatron's
      ``--overlap-param-gather`` runs it under the next step's forward). ZeRO-3/FSDP
      gathers per layer in the step itself instead, so no gather here.
    - fp8-family recipes cast the weights once per step (``precision.weight_cast``).
    - ``offload_optimizer``: the states live in host memory and the step runs on the host
      (DeepSpeed ZeRO-Offload / Megatron's ``--optimizer-cpu-offload``); the device sends
      its gradient shard and receives the updated weights over the host link
      (``offload.d2h``/``offload.h2d``, priced at ``host_link_gb_per_s``).
    """
    rep_of = {i: rep for rep, t in templates.items() for i in t.indices}
    counts: dict[int, int] = {}
    for i in stage_layers:
        rep = rep_of.get(i, i)
        counts[rep] = counts.get(rep, 0) + 1
    dense_group, expert_group = dp_groups(parallel)
    dense_shard = parallel.span(dense_group)[0] if train.zero >= 1 or train.fsdp else 1
    expert_shard = parallel.span(expert_group)[0] if train.zero >= 1 or train.fsdp else 1
    gdtype = grad_dtype(train.precision)
    gbytes = dtype_bytes(gdtype)
    pbytes = dtype_bytes(plan.activation_dtype)
    optimizer = train.optimizer
    nodes: list[OpNode] = []
    new_templates: dict[int, LayerTemplate] = {}

    def node(op: str, category: str, layer: int | None, kind: str | None, *, flops: float = 0,
             read: float = 0, written: float = 0, inputs: tuple[TensorMeta, ...] = (),
             outputs: tuple[TensorMeta, ...] = (), attrs: Mapping[str, Any] | None = None
             ) -> None:
        nodes.append(OpNode(
            id=len(nodes), op=op, category=category, phase=Phase.OPTIMIZER, inputs=inputs,
            outputs=outputs, module_path=f"optimizer.{kind or 'outer'}", layer_index=layer,
            layer_kind=kind, flops=int(flops), bytes_read=int(read), bytes_written=int(written),
            formula=op, attrs=dict(attrs or {})))

    def step(layer: int | None, kind: str | None, group: ParamGroup, count: int,
             frozen: ParamGroup | None = None) -> None:
        cast = frozen or group  # LoRA: TE still casts the frozen weights every step
        dense = math.ceil(group.dense / dense_shard) if group.dense else 0
        expert = math.ceil(group.expert / expert_shard) if group.expert else 0
        elements = dense + expert
        if elements == 0 and cast.total == 0:
            return
        if train.offload_optimizer:
            if not host_link_gb_per_s:
                raise SpecError("offloading optimizer states needs the host link bandwidth",
                                "pass host_link_gb_per_s (PCIe or C2C GB/s per device)")
            link = host_link_gb_per_s * 1e9
            node("offload.d2h", Category.COPY, layer, kind, read=elements * gbytes,
                 attrs={"host_link_s": elements * gbytes / link})
            node("offload.h2d", Category.COPY, layer, kind, written=elements * pbytes,
                 attrs={"host_link_s": elements * pbytes / link})
            return
        node("optimizer.grad_norm", Category.REDUCTION, layer, kind, flops=2 * elements,
             read=elements * gbytes)
        adam_elements = elements
        if optimizer == "muon" and group.matrices:
            muon_elements = 0
            for shape in group.matrices:
                experts = shape[0] if len(shape) == 3 else 1
                m, n = sorted(shape[-2:])
                muon_elements += experts * m * n
                # whole matrices are spread over the data-parallel ranks: the busiest rank
                # orthogonalises ⌈matrices / shard⌉ of them, batched as one bmm per GEMM
                shard = expert_shard if len(shape) == 3 else dense_shard
                batch = math.ceil(experts * count / shard)
                for _ in range(MUON_NS_STEPS):
                    for rows, cols, inner in ((m, m, n), (m, m, m), (m, n, m)):
                        node("aten.bmm.default", Category.MATMUL, None, kind,
                             flops=2 * batch * rows * cols * inner,
                             read=2 * batch * (rows * inner + inner * cols),
                             written=2 * batch * rows * cols,
                             inputs=(TensorMeta((batch, rows, inner), "bfloat16"),
                                     TensorMeta((batch, inner, cols), "bfloat16")),
                             outputs=(TensorMeta((batch, rows, cols), "bfloat16"),),
                             attrs={"optimizer": "muon_newton_schulz"})
            muon_local = min(elements, math.ceil(muon_elements / max(dense_shard, 1)))
            # momentum update and the scaled weight update: read master, momentum, grad;
            # write master, momentum, weight
            node("optimizer.muon", Category.OPTIMIZER, layer, kind, flops=6 * muon_local,
                 read=muon_local * (4 + 4 + gbytes), written=muon_local * (4 + 4 + pbytes))
            adam_elements = max(0, elements - muon_local)
        if adam_elements:
            op = "optimizer.sgd" if optimizer == "sgd" else "optimizer.adam"
            states = STATE_BYTES.get(optimizer, 12) if optimizer != "muon" else 12
            node(op, Category.OPTIMIZER, layer, kind,
                 flops=ADAM_FLOPS_PER_ELEMENT * adam_elements,
                 read=adam_elements * (states + gbytes),
                 written=adam_elements * (states + pbytes))
        if plan.quantized_layer(templates.get(layer) if layer is not None else None, layer):
            full = cast.dense + cast.expert  # every weight of the rank is cast, unsharded
            node("precision.weight_cast", Category.ELEMENTWISE, layer, kind, flops=3 * full,
                 read=full * pbytes,
                 written=2 * plan.quantized_bytes(full, plan.gemm_dtype or "float8_e4m3fn"),
                 attrs={QUANTIZE_ATTR: True, "recipe": plan.recipe})
        if (train.zero in (1, 2)) and not train.fsdp:
            for full_elements, grp, shard in ((group.dense, dense_group, dense_shard),
                                              (group.expert, expert_group, expert_shard)):
                if full_elements and shard > 1:
                    nodes.append(collective_node(
                        len(nodes), "all_gather", grp, parallel, full_elements * pbytes,
                        phase=Phase.OPTIMIZER, layer_index=layer, layer_kind=kind,
                        module_path=f"optimizer.{kind or 'outer'}", overlap="next_step",
                        dtype=plan.activation_dtype))

    trainable = inventory.trainable or inventory
    for rep, count in counts.items():
        group = inventory.layers.get(rep)
        if group is None:
            continue
        adapters = trainable.layers.get(rep, ParamGroup(group.key, rep, 0, 0))
        template = templates.get(rep)
        kind = template.kind if template else None
        indices = [i for i in (template.indices if template else (rep,)) if i in stage_layers]
        if rep not in indices:
            indices = [rep, *indices[1:]]
        new_templates[rep] = LayerTemplate(kind or "layer", rep, tuple(indices[:count]) or (rep,))
        step(rep, kind, adapters, count, frozen=group)
    if first:
        step(None, None, trainable.embedding, 1)
    if last:
        head = trainable.head
        if parallel.pp > 1 and trainable.tied_head:
            head = evolve(head, dense=head.dense + trainable.tied_head)
        step(None, None, head, 1)
    return OpGraph(phase=Phase.OPTIMIZER, nodes=nodes, templates=new_templates,
                   meta={"optimizer": optimizer, "zero": train.zero, "fsdp": train.fsdp,
                         "offload_optimizer": train.offload_optimizer})


# -- stage layout -----------------------------------------------------------------------------


