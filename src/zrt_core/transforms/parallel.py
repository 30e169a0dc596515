"""Parallel transforms: every node's true per-rank shapes, FLOPs and bytes under TP, SP, CP
and EP, the collectives those layouts need, pipeline stages and data-parallel replicas.

How sharding is found
    Seeds come from the weights. Tensor parallelism follows the model's tensor-parallel plan
    (transformers puts ``base_model_tp_plan`` on each config class: ``colwise`` /
    ``rowwise`` per module) and, for parameters the plan does not name, module-name rules
    (``q/k/v/gate/up`` column-parallel, ``o/down`` row-parallel, experts by their FFN
    dimension, embedding and LM head vocabulary-parallel). Expert weights are split over
    EP along the expert axis; the sequence over CP: integer inputs (token ids, labels)
    and what the model builds from nothing before its first layer (positions from
    ``arange``, OPT's all-ones mask) split along their sequence axis, however they reach
    the embedding or the rotary tables, as Megatron slices a CP rank's batch. From the seeds a single
    pass over the dataflow carries each sharded axis through views, reshapes, transposes,
    elementwise ops, matmuls, attention and the MoE dispatch/combine, so every tensor gets
    its per-rank shape (heads/tp, ffn/tp, seq/cp, experts/ep). FLOPs and bytes are then
    re-evaluated by each node's registered formula on the per-rank shapes.

What is inserted (collective nodes follow docs/architecture.md)
    * A matmul that contracts over a sharded axis (a row-parallel linear, the input
      gradient of a column-parallel one, a vocabulary-parallel embedding) leaves a partial
      sum; it is reduced where something other than a view, an add of partial sums or the
      MoE combine first reads it: ``all_reduce`` (``reduce_scatter`` along tokens with SP).
    * With SP, tokens stay split over the TP ranks between the row- and column-parallel
      regions (norms and residuals run on seq/tp); an ``all_gather`` brings them back
      before each matmul with sharded weights.
    * CP: ring attention gets one ``send_recv`` of the (cp-1) KV blocks the ring passes,
      overlappable with the attention (``overlap="consumer"``); Ulysses an ``all_to_all``
      before (q, k, v) and after (output) the attention.
    * EP: an ``all_to_all`` after the dispatch and before the combine (the ranks of the EP
      group hold different tokens), or, when they hold the same tokens (EP inside the TP
      group, vLLM's TP+EP), each rank runs the rows routed to its experts and the combine
      output is reduced over the group.
    * Serving phases all-gather vocabulary-parallel logits at the end of the graph.

A single pass handles every group, so one layout costs one walk over the graph. The
engine (:func:`propagate_shapes`) is shared with shape rescaling (batch, KV length) in
:mod:`zrt_core.estimate`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.errors import LayoutError
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    _frozen_mapping,
    dtype_bytes,
)

if TYPE_CHECKING:
    from zrt_core.formulas.registry import FormulaRegistry
    from zrt_core.modelinfo import ModelDims
    from zrt_core.strategy import Parallel
    from zrt_core.transforms.base import TransformContext

#: Groups a parallel layout splits tensors over. ``sp`` marks token axes split over the TP
#: ranks (sequence parallelism); its collectives run on the ``tp`` group.
PARALLEL_GROUPS = frozenset({"tp", "sp", "cp", "ep", "etp"})
#: Groups whose split axis is a token axis: a view that splits a merged axis gives them to
#: the innermost (sequence) part that divides; the others take the outermost (heads).
_TOKEN_GROUPS = frozenset({"sp", "cp", "seq", "kv"})

Factors = tuple[tuple[str, Fraction], ...]


# -- layouts ------------------------------------------------------------------------------


class Layout:
    """A tensor's per-rank shape and how it got there.

    ``axes[i]`` lists the ``(group, factor)`` pairs applied to axis ``i`` (new size = old
    size × the product of factors); ``partial`` the groups over which the tensor is a
    partial sum still to be reduced.
    """

    __slots__ = ("axes", "partial", "shape")

    def __init__(self, shape: tuple[int, ...], axes: tuple[Factors, ...],
                 partial: frozenset[str] = frozenset()) -> None:
        self.shape = shape
        self.axes = axes
        self.partial = partial

    @classmethod
    def plain(cls, meta: TensorMeta) -> Layout:
        return cls(meta.shape, ((),) * len(meta.shape))

    def groups(self, axis: int) -> set[str]:
        return {g for g, _ in self.axes[axis]}

    @property
    def changed(self) -> bool:
        return any(self.axes) or bool(self.partial)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Layout({self.shape}, {self.axes}, partial={set(self.partial)})"


def _scaled(old: int, factors: Factors) -> int:
    if old <= 0 or not factors:
        return old
    v = Fraction(old)
    for _, f in factors:
        v *= f
    if v.denominator == 1:
        return max(int(v), 1)
    return max(round(v), 1)


def _layout(old: tuple[int, ...], axes: Sequence[Factors], partial: Iterable[str] = (),
            sizes: Mapping[int, int] | None = None) -> Layout:
    shape = tuple(sizes[i] if sizes and i in sizes else _scaled(d, axes[i])
                  for i, d in enumerate(old))
    return Layout(shape, tuple(axes), frozenset(partial))


def _merge_factors(a: Factors, b: Factors) -> Factors:
    seen = {g for g, _ in a}
    return a + tuple(p for p in b if p[0] not in seen)


def _product(factors: Factors) -> Fraction:
    v = Fraction(1)
    for _, f in factors:
        v *= f
    return v


def _without(factors: Factors, group: str) -> Factors:
    return tuple(p for p in factors if p[0] != group)


# -- the propagation engine ---------------------------------------------------------------


def op_base(op: str) -> str:
    """``aten.mm.default`` → ``mm``; ``zrt.attention.default`` → ``attention``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


_VIEW_LIKE = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "flatten",
                        "unflatten", "view_as"})
_SAME_SHAPE = frozenset({"alias", "detach", "lift_fresh", "lift_fresh_copy", "clone",
                         "contiguous", "_to_copy", "to", "copy"})
_MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm",
                     "_grouped_mm", "_scaled_grouped_mm", "grouped_mm_fallback"})
_REDUCE = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                     "var", "std", "prod", "any", "all", "logsumexp", "norm",
                     "linalg_vector_norm"})
_SOFTMAX = frozenset({"_softmax", "_log_softmax", "softmax", "log_softmax"})
#: Ops through which a partial sum stays a partial sum (linear, no mixing with others).
_PARTIAL_SAFE = frozenset({"view", "_unsafe_view", "reshape", "alias", "detach", "t",
                           "transpose", "permute", "unsqueeze", "squeeze", "expand",
                           "lift_fresh", "flatten", "unflatten", "_reshape_alias"})
#: Ops that read only their input's shape (a dropout mask's ``empty_like``): the output is
#: a fresh tensor shaped like the reduced input, never a partial sum itself.
_SHAPE_ONLY = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                         "randn_like"})


@frozen
class Inserted:
    """A node the pass inserts, before or after the node being processed."""

    node: OpNode
    after: bool = False


class ShapePass:
    """One walk over a graph: layouts per tensor id, rebuilt nodes, inserted nodes.

    Subclasses (the parallel transform) override :meth:`seed`, :meth:`before` and
    :meth:`after` to add collectives; the base class only carries shapes, which is what
    rescaling needs.
    """

    def __init__(self, graph: OpGraph, registry: FormulaRegistry | None, *,
                 state: dict[int, Layout] | None = None, id_base: int | None = None,
                 attrs: Mapping[str, Mapping[Any, Any]] | None = None) -> None:
        self.graph = graph
        self.registry = registry
        # attr name -> {captured value: new value}: positions a rescale moves (start_pos)
        self.attr_map: Mapping[str, Mapping[Any, Any]] = attrs or {}
        self.state: dict[int, Layout] = state if state is not None else {}
        self.replace: dict[int, int] = {}  # tensor id -> id of the tensor that replaces it
        self.metas: dict[int, TensorMeta] = {}
        self.produced: set[int] = set()
        self.consumers: dict[int, int] = {}
        self.old_meta: dict[int, TensorMeta] = {}
        for n in graph.nodes:
            for t in n.outputs:
                if t.tensor_id is not None:
                    self.produced.add(t.tensor_id)
                    self.old_meta[t.tensor_id] = t
            for t in n.inputs:
                if t.tensor_id is not None:
                    self.consumers[t.tensor_id] = self.consumers.get(t.tensor_id, 0) + 1
        self._next_node = max((n.id for n in graph.nodes), default=-1) + 1
        phase_index = Phase.ALL.index(graph.phase) if graph.phase in Phase.ALL else 0
        self._next_tensor = id_base if id_base is not None else \
            2_000_000_000 + 100_000_000 * phase_index

    # -- hooks ---------------------------------------------------------------------------

    def seed(self, meta: TensorMeta, node: OpNode) -> Layout | None:
        """The layout of a tensor no node of this graph produced (a weight, an input, a
        cache); None leaves it as captured."""
        return None

    def before(self, node: OpNode, ins: list[Layout]) -> list[Layout]:
        """Called with the input layouts before the rule runs; may insert nodes (through
        :meth:`insert`) and return changed input layouts."""
        return ins

    def after(self, node: OpNode, ins: list[Layout], outs: list[Layout]) -> list[Layout]:
        return outs

    def finish(self) -> None:
        """Called after the last node (the parallel pass reduces what is still partial)."""

    def root(self, meta: TensorMeta, node: OpNode, lay: Layout) -> Layout:
        """The layout of an output of a node that makes a tensor from nothing (``zeros``,
        ``ones``, ``arange``: no tensor inputs); ``lay`` is its rule's (whole)."""
        return lay

    # -- helpers for hooks ---------------------------------------------------------------

    def new_node_id(self) -> int:
        i = self._next_node
        self._next_node += 1
        return i

    def new_tensor(self, like: TensorMeta, layout: Layout, dtype: str | None = None
                   ) -> TensorMeta:
        """A tensor a hook creates (a collective's output). ``like`` holds the captured
        (whole-model) shape the layout's factors apply to; the returned meta has the
        per-rank shape."""
        tid = self._next_tensor
        self._next_tensor += 1
        reference = TensorMeta(shape=like.shape, dtype=dtype or like.dtype, tensor_id=tid)
        self.state[tid] = layout
        self.metas[tid] = reference
        return with_shape(reference, layout.shape)

    def captured(self, meta: TensorMeta) -> TensorMeta:
        """The captured (reference-shape) meta of a tensor id, for one a rebuilt node holds."""
        tid = meta.tensor_id
        if tid is None:
            return meta
        return self.metas.get(tid) or self.old_meta.get(tid, meta)

    def insert(self, node: OpNode, *, after: bool = False) -> None:
        self._pending.append(Inserted(node, after))

    # -- the walk ------------------------------------------------------------------------

    def layout_of(self, meta: TensorMeta, node: OpNode) -> Layout:
        tid = meta.tensor_id
        if tid is None:
            return Layout.plain(meta)
        tid = self.replace.get(tid, tid)
        lay = self.state.get(tid)
        if lay is None:
            lay = self.seed(meta, node)
            if lay is None:
                lay = Layout.plain(meta)
            self.state[tid] = lay
        return lay

    def run(self) -> OpGraph:
        self._slots: list[_Slot] = []
        self._slot_of: dict[int, _Slot] = {}
        self._pending: list[Inserted] = []
        for node in self.graph.nodes:
            self._pending = []
            metas_in = [self._current_meta(t) for t in node.inputs]
            ins = [self.layout_of(t, node) for t in metas_in]
            self.before(node, ins)
            # hooks may have replaced inputs (a reduced or gathered tensor)
            metas_in = [self._current_meta(t) for t in node.inputs]
            ins = [self.layout_of(t, node) for t in metas_in]
            if self._adopt_fills(node, metas_in, ins):
                ins = [self.layout_of(t, node) for t in metas_in]
            outs = rule_for(node, self.registry)(node, metas_in, ins)
            if op_base(node.op) == "cat":
                ins = self._unify_cat_inputs(node, metas_in, ins, outs)
            elif op_base(node.op) == "ssm_state_update":
                ins = self._unify_state_input(metas_in, ins)
            if node.category == Category.CREATION and not any(
                    t.tensor_id is not None for t in node.inputs):
                outs = [self.root(t, node, o) for t, o in zip(node.outputs, outs, strict=True)]
            outs = self.after(node, ins, outs)
            for t, lay in zip(node.outputs, outs, strict=True):
                if t.tensor_id is not None:
                    self.state[t.tensor_id] = lay
            rebuilt = self._rebuild(node, metas_in, ins, outs)
            for p in self._pending:
                if not p.after:
                    self._emit(p.node)
            self._emit(rebuilt).source = node
            for p in self._pending:
                if p.after:
                    self._emit(p.node)
        self._pending = []
        self.finish()
        for p in self._pending:
            self._emit(p.node)
        out_nodes = list(_flatten(self._slots))
        return replace_graph(self.graph, nodes=out_nodes,
                             edges=_rewire(self.graph, out_nodes))

    def _unify_cat_inputs(self, node: OpNode, metas: list[TensorMeta], ins: list[Layout],
                          outs: list[Layout]) -> list[Layout]:
        """A piece of a ``cat`` that no node of this graph produced before it (the KV cache
        a decode step extends, a convolution state it writes back afterwards) takes the
        split of the pieces it joins on the other axes: a cache holds the heads its rank
        holds."""
        if not outs or not node.outputs:
            return ins
        out = outs[0]
        nd = len(out.axes)
        dim = int(node.attrs.get("dim", 0)) % max(nd, 1)
        new = list(ins)
        for k, (m, lay) in enumerate(zip(metas, ins, strict=True)):
            tid = m.tensor_id
            if tid is None or tid in self._slot_of or len(m.shape) != nd or m.numel == 0:
                continue
            axes = [lay.axes[i] if i == dim else _merge_factors(lay.axes[i], out.axes[i])
                    for i in range(nd)]
            if tuple(axes) == lay.axes:
                continue
            merged = _layout(m.shape, axes, lay.partial)
            self.state[tid] = merged
            new[k] = merged
        return new

    def _adopt_fills(self, node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> bool:
        """Buffers the model made from nothing just before (``zeros``) take the layout of
        what they stand for, and their maker is emitted again at that shape: the
        destination of ``copy_(dst, src)`` (a Mamba mixer's convolution state) is laid out
        like ``src``; the zero gradient of the final states an SSD scan's backward gets
        like the states, ``[b, h, p, n]`` of ``grad_y [b, s, h, p]``."""
        base = op_base(node.op)
        if base == "copy_" and len(ins) >= 2 and \
                self.captured(metas[0]).shape == self.captured(metas[1]).shape:
            return self._adopt_root(metas[0], ins[0], ins[1].axes)
        if base == "ssd_chunk_scan_backward" and len(ins) >= 2 and \
                len(metas[0].shape) == 4 and len(metas[1].shape) == 4:
            g = ins[0].axes
            return self._adopt_root(metas[1], ins[1], (g[0], g[2], g[3], ins[1].axes[3]))
        return False

    def _adopt_root(self, meta: TensorMeta, lay: Layout, axes: tuple[Factors, ...]) -> bool:
        tid = meta.tensor_id
        slot = self._slot_of.get(tid) if tid is not None else None
        source = slot.source if slot is not None else None
        if (source is None or source.category != Category.CREATION or len(source.outputs) != 1
                or any(t.tensor_id is not None for t in source.inputs) or lay.axes == axes):
            return False
        new = _layout(self.captured(meta).shape, axes)
        self.state[tid] = new  # type: ignore[index]
        slot.node = self._rebuild(source, list(source.inputs),
                                  [Layout.plain(t) for t in source.inputs], [new])
        return True

    def _unify_state_input(self, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
        """The recurrent state ``[b, h, p, n]`` a decode step updates in place, carried in
        from earlier steps (no node of this graph made it), holds the heads its rank's
        ``x [b, h, p]`` holds."""
        if len(metas) < 2 or len(metas[0].shape) != 4 or len(metas[1].shape) != 3:
            return ins
        m, lay = metas[0], ins[0]
        if m.tensor_id is None or m.tensor_id in self._slot_of:
            return ins
        x = ins[1]
        axes = [_merge_factors(lay.axes[i], x.axes[i]) for i in range(3)] + [lay.axes[3]]
        if tuple(axes) == lay.axes:
            return ins
        merged = _layout(m.shape, axes, lay.partial)
        self.state[m.tensor_id] = merged
        return [merged, *ins[1:]]

    def emitted(self) -> list[OpNode]:
        """The nodes emitted so far, in order (for :meth:`finish`)."""
        return list(_flatten(self._slots))

    def _emit(self, node: OpNode, parent: _Slot | None = None) -> _Slot:
        slot = _Slot(node)
        (parent.followers if parent is not None else self._slots).append(slot)
        for t in node.outputs:
            if t.tensor_id is not None:
                self._slot_of[t.tensor_id] = slot
        return slot

    def producer(self, tensor_id: int | None) -> OpNode | None:
        """The emitted node that produced a tensor (None for graph inputs)."""
        slot = self._slot_of.get(tensor_id) if tensor_id is not None else None
        return slot.node if slot is not None else None

    def placement(self, tensor_id: int | None, consumer: OpNode) -> OpNode:
        """Where a collective on ``tensor_id`` read by ``consumer`` goes: right after the
        tensor's producer (Megatron reduces a row-parallel output where it is made) when
        that producer is outside the layers or in the consumer's layer; otherwise just
        before the consumer (a layer template's node runs once per layer it stands for,
        so a collective must sit in the layer that needs it)."""
        producer = self.producer(tensor_id)
        if producer is not None and (producer.layer_index is None or
                                     producer.layer_index == consumer.layer_index):
            return producer
        return consumer

    def place(self, node: OpNode, tensor_id: int | None, consumer: OpNode) -> None:
        """Emit ``node`` where :meth:`placement` says."""
        where = self.placement(tensor_id, consumer)
        slot = self._slot_of.get(tensor_id) if tensor_id is not None else None
        if slot is not None and where is slot.node:
            self._emit(node, parent=slot)
        else:
            self.insert(node)

    def _current_meta(self, meta: TensorMeta) -> TensorMeta:
        tid = meta.tensor_id
        if tid is None:
            return meta
        new = self.replace.get(tid)
        if new is None:
            return meta
        # a replacement made by a hook: follow chains (reduced, then gathered)
        while new in self.replace:
            new = self.replace[new]
        return self.metas[new]

    def _rebuild(self, node: OpNode, metas_in: list[TensorMeta], ins: list[Layout],
                 outs: list[Layout]) -> OpNode:
        new_in = tuple(_retensor(m, lay) for m, lay in zip(metas_in, ins, strict=True))
        new_out = tuple(_retensor(m, lay) for m, lay in zip(node.outputs, outs, strict=True))
        moved = {k: self.attr_map[k][v] for k, v in node.attrs.items()
                 if k in self.attr_map and _hashable(v) and v in self.attr_map[k]} \
            if self.attr_map and node.attrs else {}
        if new_in == node.inputs and new_out == node.outputs and not moved:
            return node
        attrs = _updated_attrs(node, new_in, new_out)
        if moved:
            attrs = MappingProxyType({**attrs, **moved})
        attrs = _derived_attrs(node, new_in, new_out, attrs, self.registry)
        if node.zero_cost:
            return replace_node(node, inputs=new_in, outputs=new_out, attrs=attrs)
        flops, read, written, formula = reprice(node, new_in, new_out, attrs, self.registry)
        return replace_node(node, inputs=new_in, outputs=new_out, attrs=attrs, flops=flops,
                            bytes_read=read, bytes_written=written, formula=formula)


class _Slot:
    __slots__ = ("followers", "node", "source")

    def __init__(self, node: OpNode) -> None:
        self.node = node
        self.source: OpNode | None = None  # the captured node it was rebuilt from
        self.followers: list[_Slot] = []


def _flatten(slots: Iterable[_Slot]) -> Iterable[OpNode]:
    for slot in slots:
        yield slot.node
        yield from _flatten(slot.followers)


def _retensor(meta: TensorMeta, layout: Layout) -> TensorMeta:
    if meta.shape == layout.shape:
        return meta
    return with_shape(meta, layout.shape)


_set = object.__setattr__


def with_shape(meta: TensorMeta, shape: tuple[int, ...]) -> TensorMeta:
    """``evolve(meta, shape=shape)`` without re-running attrs converters (hot path: a
    layout change rebuilds every tensor; the shape is already a tuple of ints)."""
    out = TensorMeta.__new__(TensorMeta)
    _set(out, "shape", tuple(shape))
    _set(out, "dtype", meta.dtype)
    _set(out, "is_view", meta.is_view)
    _set(out, "tensor_id", meta.tensor_id)
    _set(out, "param", meta.param)
    return out


def replace_node(node: OpNode, **changes: Any) -> OpNode:
    """``evolve(node, ...)`` for the hot path: fields are copied as they are (already
    frozen), ``attrs`` given as a plain dict is frozen the way the constructor does."""
    out = OpNode.__new__(OpNode)
    for name in _NODE_FIELDS:
        _set(out, name, changes[name] if name in changes else getattr(node, name))
    if "attrs" in changes and not isinstance(changes["attrs"], MappingProxyType):
        _set(out, "attrs", _frozen_mapping(changes["attrs"]))
    for name in ("inputs", "outputs", "fused_from"):
        if name in changes and not isinstance(changes[name], tuple):
            _set(out, name, tuple(changes[name]))
    return out


def replace_graph(graph: OpGraph, **changes: Any) -> OpGraph:
    """``evolve(graph, ...)`` for the hot path: ``nodes`` and ``edges`` as lists of nodes
    and ``(int, int)`` pairs, ``meta`` as a mapping; templates are kept."""
    out = OpGraph.__new__(OpGraph)
    _set(out, "phase", graph.phase)
    _set(out, "nodes", tuple(changes.get("nodes", graph.nodes)))
    _set(out, "edges", tuple(changes["edges"]) if "edges" in changes else graph.edges)
    _set(out, "templates", graph.templates)
    meta = changes.get("meta")
    _set(out, "meta", graph.meta if meta is None else _frozen_mapping(meta))
    return out


_NODE_FIELDS = ("id", "op", "category", "phase", "inputs", "outputs", "module_path",
                "module_class", "layer_index", "layer_kind", "flops", "bytes_read",
                "bytes_written", "formula", "zero_cost", "attrs", "fused_from")


def reprice(node: OpNode, inputs: tuple[TensorMeta, ...], outputs: tuple[TensorMeta, ...],
            attrs: Mapping[str, Any], registry: FormulaRegistry | None
            ) -> tuple[int, int, int, str | None]:
    """FLOPs and bytes of a node on new tensors: its registered formula when it has one,
    else the captured counts scaled by the output size (a fused or unknown op)."""
    if registry is None:
        registry = core_registry()
    if node.formula is not None and not node.fused_from:
        from zrt_core.formulas.registry import OpCall

        try:
            return registry.evaluate(OpCall(op=node.op, inputs=inputs, outputs=outputs,
                                            attrs=attrs))
        except Exception:  # a formula that does not fit the new call: scale instead
            pass
    old = sum(t.numel for t in node.outputs) or 1
    new = sum(t.numel for t in outputs)
    ratio = new / old
    if not node.outputs:
        old = sum(t.numel for t in node.inputs) or 1
        ratio = sum(t.numel for t in inputs) / old
    read = sum(t.nbytes for t in inputs)
    written = sum(t.nbytes for t in outputs if not t.is_view)
    if node.bytes_read or node.bytes_written:
        old_read = sum(t.nbytes for t in node.inputs) or 1
        old_written = sum(t.nbytes for t in node.outputs if not t.is_view) or 1
        read = round(node.bytes_read * read / old_read)
        written = round(node.bytes_written * written / old_written)
    return round(node.flops * ratio), read, written, node.formula


_CORE_REGISTRY: list[FormulaRegistry] = []


def core_registry() -> FormulaRegistry:
    """The core's own formulas (aten and ``zrt::`` ops), for callers without a plugin host;
    pass ``host.formulas`` to include the formulas plugins contribute."""
    if not _CORE_REGISTRY:
        from zrt_core.formulas.aten import core_formulas
        from zrt_core.formulas.registry import FormulaRegistry

        reg = FormulaRegistry()
        for f in core_formulas():
            reg.register(f, "zrt-core")
        _CORE_REGISTRY.append(reg)
    return _CORE_REGISTRY[0]


def _updated_attrs(node: OpNode, inputs: tuple[TensorMeta, ...],
                   outputs: tuple[TensorMeta, ...]) -> Mapping[str, Any]:
    attrs = node.attrs
    if not attrs:
        return attrs
    changes: dict[str, Any] = {}
    base = op_base(node.op)
    if "size" in attrs and outputs and base in _VIEW_LIKE | {"expand", "new_zeros",
                                                              "new_empty", "zeros", "ones",
                                                              "full", "empty"}:
        changes["size"] = tuple(outputs[0].shape)
    if base in ("split", "split_with_sizes") and inputs and outputs:
        dim = int(attrs.get("dim", 0)) % len(inputs[0].shape)
        if "split_size" in attrs:
            changes["split_size"] = outputs[0].shape[dim]
        if "split_sizes" in attrs:
            changes["split_sizes"] = tuple(o.shape[dim] for o in outputs)
    if "group_rows" in attrs:
        rows = _group_rows(node, inputs, outputs)
        if rows is not None:
            changes["group_rows"] = rows
    if base == "convolution" and int(attrs.get("groups") or 1) > 1 and len(inputs) > 1 \
            and node.inputs[1].shape and node.inputs[1].shape[0]:
        # grouped / depthwise (Mamba's conv1d): the groups follow the output channels
        old_w, new_w = node.inputs[1].shape[0], inputs[1].shape[0]
        if old_w != new_w:
            changes["groups"] = int(attrs["groups"]) * new_w // old_w
    if not changes:
        return attrs
    return MappingProxyType({**attrs, **changes})


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _derived_attrs(node: OpNode, inputs: tuple[TensorMeta, ...],
                   outputs: tuple[TensorMeta, ...], attrs: Mapping[str, Any],
                   registry: FormulaRegistry | None) -> Mapping[str, Any]:
    """``attrs`` with what the node's formula derives from its new shapes and attrs
    (``OpFormula.derived_attrs``: V4's window keys after a rescaled cache)."""
    if node.formula is None or node.fused_from:
        return attrs
    formula = (registry or core_registry()).lookup(node.op)
    derive = getattr(formula, "derived_attrs", None) if formula is not None else None
    if derive is None:
        return attrs
    from zrt_core.formulas.registry import OpCall

    changes = derive(OpCall(op=node.op, inputs=inputs, outputs=outputs, attrs=attrs))
    if not changes or all(attrs.get(k) == v for k, v in changes.items()):
        return attrs
    return MappingProxyType({**attrs, **changes})


def _group_rows(node: OpNode, inputs: tuple[TensorMeta, ...],
                outputs: tuple[TensorMeta, ...]) -> tuple[int, ...] | None:
    """Rows per local group of a grouped GEMM on its new shapes, keeping the captured
    routing's proportions (balanced routing stays balanced)."""
    old = tuple(int(r) for r in node.attrs["group_rows"])
    if not old or op_base(node.op) not in ("_grouped_mm", "grouped_mm_fallback",
                                           "_scaled_grouped_mm", "transpose"):
        return None
    groups = len(old)
    total = None
    for t in (*inputs, *outputs):
        if len(t.shape) == 3:
            groups = t.shape[0]
            break
    for t, old_t in zip(inputs, node.inputs, strict=False):
        if len(t.shape) == 2 and t.param is None:
            # rows: the axis that had sum(old) rows
            for axis, size in enumerate(old_t.shape):
                if size == sum(old):
                    total = t.shape[axis]
                    break
            if total is not None:
                break
    if total is None:
        total = sum(old)
    kept = old[:groups] if groups <= len(old) else old + (0,) * (groups - len(old))
    if max(old) - min(old) <= 1 and total != sum(kept):
        # balanced routing stays balanced at any row count: the capture's histogram
        # (routing_histogram) as even as integers allow — a batch-1 decode's 2 rows over 8
        # experts scaled by proportion would leave 6 experts idle at every batch
        base, extra = divmod(total, groups)
        return tuple(base + 1 if i < extra else base for i in range(groups))
    kept_sum = sum(kept) or 1
    rows = [total * r // kept_sum for r in kept]
    for i in range(total - sum(rows)):
        rows[i % groups] += 1
    return tuple(rows)


def _rewire(graph: OpGraph, nodes: Sequence[OpNode]) -> list[tuple[int, int]]:
    """Edges of the new node list: tensor dataflow from the nodes' (new) inputs, plus the
    original edges that no tensor explains (ordering dependencies)."""
    old_producer: dict[int, int] = {}
    for n in graph.nodes:
        for t in n.outputs:
            if t.tensor_id is not None:
                old_producer[t.tensor_id] = n.id
    keep = {n.id for n in nodes}
    old_inputs = {n.id: {old_producer.get(t.tensor_id) for t in n.inputs} for n in graph.nodes}
    edges: dict[tuple[int, int], None] = {}
    for a, b in graph.edges:
        if a in keep and b in keep and a not in old_inputs.get(b, ()):
            edges[(a, b)] = None
    producer: dict[int, int] = {}
    for n in nodes:
        for t in n.inputs:
            p = producer.get(t.tensor_id) if t.tensor_id is not None else None
            if p is not None and p != n.id:
                edges[(p, n.id)] = None
        for t in n.outputs:
            if t.tensor_id is not None:
                producer[t.tensor_id] = n.id
    return list(edges)


# -- rules --------------------------------------------------------------------------------

Rule = Callable[[OpNode, list[TensorMeta], list[Layout]], list[Layout]]


def rule_for(node: OpNode, registry: FormulaRegistry | None = None) -> Rule:
    """The layout rule of a node: the one its formula declares (``OpFormula.layout``, for
    plugin kernels), else the core's rule for its op."""
    if registry is not None:
        formula = registry.lookup(node.op)
        if formula is not None and formula.layout is not None:
            return LAYOUT_RULES[formula.layout]
    base = op_base(node.op)
    if node.op.startswith("comm."):
        return _rule_same
    if base in _VIEW_LIKE:
        return _rule_view
    if base in ("t", "transpose", "permute", "swapaxes", "movedim"):
        return _rule_permute
    if base == "unsqueeze":
        return _rule_unsqueeze
    if base == "squeeze":
        return _rule_squeeze
    if base in ("split", "split_with_sizes", "chunk", "slice", "narrow", "unbind",
                "slice_backward", "constant_pad_nd", "repeat", "roll", "flip"):
        return _rule_positional
    if base in ("select", "select_backward"):
        return _rule_select
    if base in ("cat", "concat", "stack"):
        return _rule_cat
    if base in _MATMUL:
        return _rule_matmul
    if base in ("attention", "attention_backward", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_cudnn_attention",
                "_scaled_dot_product_flash_attention_for_cpu"):
        return _rule_attention
    if base == "embedding":
        return _rule_embedding
    if base in ("moe_dispatch", "moe_combine", "moe_dispatch_backward",
                "moe_combine_backward"):
        return _rule_moe
    if base == "index":
        return _rule_index
    if base in ("view_as_complex", "view_as_real"):
        return _rule_complex
    if base in ("ssd_chunk_scan", "ssm_state_update"):
        return _rule_ssm
    if base == "convolution_backward":
        return _rule_conv_backward
    if base == "ssd_chunk_scan_backward":
        return _rule_gradients
    if base in _REDUCE or base in ("topk", "sort", "cumsum", "nll_loss_forward"):
        return _rule_reduce
    if base in _SHAPE_ONLY:
        return _rule_fresh
    return _rule_broadcast


def _rule_fresh(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``*_like``: the input's per-rank shape, never its partial sums."""
    return [Layout(o.shape, o.axes) for o in _rule_broadcast(node, metas, ins)]


def _rule_same(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    if ins and len(node.outputs) == 1 and len(ins[0].shape) == len(node.outputs[0].shape):
        lay = ins[0]
        return [_layout(node.outputs[0].shape, lay.axes, lay.partial,
                        dict(enumerate(lay.shape)))]
    return [Layout.plain(t) for t in node.outputs]


def _rule_broadcast(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Elementwise and everything else: each output axis takes the factors of the inputs'
    right-aligned axes of the same size (broadcast axes carry none); the most-split input
    wins (a replicated operand is sliced locally, which costs nothing)."""
    tensors = [(m, lay) for m, lay in zip(metas, ins, strict=True) if m.shape]
    partial: set[str] = set()
    for _, lay in tensors:
        partial |= lay.partial
    outs = []
    for out in node.outputs:
        nd = len(out.shape)
        axes: list[Factors] = []
        for j in range(nd):
            best: Factors = ()
            best_ratio = Fraction(1)
            for m, lay in tensors:
                k = j - (nd - len(m.shape))
                if k < 0 or m.shape[k] != out.shape[j] or not lay.axes[k]:
                    continue
                ratio = _product(lay.axes[k])
                if not best or ratio < best_ratio:
                    best, best_ratio = lay.axes[k], ratio
            axes.append(best)
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_positional(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                     ) -> list[Layout]:
    """Ops that keep the rank of their first input (split, slice, pad, repeat...): axis i
    of each output takes axis i's factors; a slice down to one element (the last token)
    leaves its axis whole."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, lay = metas[0], ins[0]
    base = op_base(node.op)
    outs = []
    for out in node.outputs:
        if base == "unbind":
            dim = int(node.attrs.get("dim", 0)) % len(src.shape)
            axes = [a for i, a in enumerate(lay.axes) if i != dim]
            outs.append(_layout(out.shape, axes, lay.partial))
            continue
        if len(out.shape) != len(src.shape):
            outs.append(Layout.plain(out))
            continue
        axes = []
        for i, factors in enumerate(lay.axes):
            if factors and out.shape[i] != src.shape[i]:
                ratio = _product(factors)
                scaled = out.shape[i] * ratio
                if out.shape[i] == 1 or (scaled < 1):
                    factors = ()
            axes.append(factors)
        outs.append(_layout(out.shape, axes, lay.partial))
    return outs


def _rule_index(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``self[idx₀, idx₁, ...]`` (advanced indexing of the leading axes): the output is the
    indices' broadcast shape, then ``self``'s remaining axes — a lookup table indexed by
    token ids (V4's hash-routing ``tid2eid[input_ids]``) has the tokens' batch, which
    right-aligned size matching cannot see."""
    out = node.outputs[0] if node.outputs else None
    if out is None or len(metas) < 2 or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, idx = metas[0], list(zip(metas[1:], ins[1:], strict=True))
    k = len(idx)
    nd = max(len(m.shape) for m, _ in idx)
    lead = tuple(out.shape[:nd])
    if len(out.shape) != nd + len(src.shape) - k or tuple(out.shape[nd:]) != \
            tuple(src.shape[k:]):
        return _rule_broadcast(node, metas, ins)
    axes: list[Factors] = []
    for j in range(nd):
        acc: Factors = ()
        for m, lay in idx:
            i = j - (nd - len(m.shape))
            if i >= 0 and m.shape[i] == lead[j]:
                acc = _merge_factors(acc, lay.axes[i])
        axes.append(acc)
    axes.extend(ins[0].axes[k:])
    partial: set[str] = set()
    for lay in ins:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial)]


def _rule_complex(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``view_as_complex`` drops the trailing pair axis, ``view_as_real`` adds one (Llama 4's
    rotary embedding); the other axes keep their factors."""
    lay, out = ins[0], node.outputs[0]
    axes = list(lay.axes[:-1]) if op_base(node.op) == "view_as_complex" else [*lay.axes, ()]
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]


def _rule_conv_backward(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                        ) -> list[Layout]:
    """``convolution_backward(grad_out, input, weight)`` → the gradients of the input, the
    weight and the bias ``[c_out]`` (the weight's first axis), each laid out like its
    forward tensor."""
    if len(ins) < 3:
        return _rule_broadcast(node, metas, ins)
    like = (ins[1], ins[2])
    outs = []
    for k, out in enumerate(node.outputs):
        if k < 2 and len(out.shape) == len(like[k].axes):
            outs.append(_layout(out.shape, like[k].axes))
        elif k == 2 and len(out.shape) == 1 and ins[2].axes:
            outs.append(_layout(out.shape, [ins[2].axes[0]]))
        else:
            outs.append(Layout.plain(out))
    return outs


def _rule_ssm(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Mamba-2's kernels, split by heads as Megatron and vLLM split them:
    ``ssd_chunk_scan(x [b, s, h, p], dt, A, B [b, s, g, n], ...)`` → ``y`` like ``x`` and
    the final states ``[b, h, p, n]``; ``ssm_state_update(state [b, h, p, n], x [b, h, p],
    ...)`` → ``y`` like ``x`` (the state takes ``x``'s split: :meth:`ShapePass.run`)."""
    base = op_base(node.op)
    xi = 0 if base == "ssd_chunk_scan" else 1
    if len(ins) <= xi or len(metas[xi].shape) != (4 if xi == 0 else 3):
        return _rule_broadcast(node, metas, ins)
    lx = ins[xi]
    outs = []
    for k, out in enumerate(node.outputs):
        if k == 0 and len(out.shape) == len(lx.axes):  # y
            outs.append(_layout(out.shape, lx.axes, lx.partial))
        elif k == 1 and xi == 0 and len(out.shape) == 4:  # final states [b, h, p, n]
            outs.append(_layout(out.shape, [lx.axes[0], lx.axes[2], lx.axes[3], ()]))
        else:
            outs.append(Layout.plain(out))
    return outs


def _rule_permute(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay = ins[0]
    nd = len(lay.axes)
    base = op_base(node.op)
    order = list(range(nd))
    if base == "t":
        if nd == 2:
            order = [1, 0]
    elif base in ("transpose", "swapaxes"):
        a = int(node.attrs.get("dim0", 0)) % nd
        b = int(node.attrs.get("dim1", 1)) % nd
        order[a], order[b] = order[b], order[a]
    elif base == "permute":
        order = [int(d) % nd for d in node.attrs.get("dims", order)]
    elif base == "movedim":
        return _rule_broadcast(node, metas, ins)
    axes = [lay.axes[i] for i in order]
    return [_layout(node.outputs[0].shape, axes, lay.partial)]


def _rule_unsqueeze(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay = ins[0]
    out = node.outputs[0]
    dim = int(node.attrs.get("dim", 0)) % len(out.shape)
    axes = list(lay.axes)
    axes.insert(dim, ())
    return [_layout(out.shape, axes, lay.partial)]


def _rule_squeeze(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """squeeze: the squeezed axes (``dim`` when given, else every size-1 axis of the
    captured input) drop out; a squeeze of one named axis keeps the others' factors, the
    batch of 1 of a batch-1 capture among them."""
    lay, src, out = ins[0], metas[0], node.outputs[0]
    if len(out.shape) == len(src.shape):
        return [_layout(out.shape, lay.axes, lay.partial)]
    dims = node.attrs.get("dim")
    if dims is not None and src.shape:
        named = {int(d) % len(src.shape) for d in (dims if isinstance(dims, tuple | list)
                                                   else (dims,))}
        axes = [a for i, a in enumerate(lay.axes) if not (i in named and src.shape[i] == 1)]
        if len(axes) == len(out.shape):
            return [_layout(out.shape, axes, lay.partial)]
    axes = [a for i, a in enumerate(lay.axes) if not (src.shape[i] == 1)]
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]


def _rule_select(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    lay, src, out = ins[0], metas[0], node.outputs[0]
    base = op_base(node.op)
    if base == "select":
        dim = int(node.attrs.get("dim", 0)) % max(len(src.shape), 1)
        axes = [a for i, a in enumerate(lay.axes) if i != dim]
    else:  # select_backward: the selected axis comes back, whole
        dim = int(node.attrs.get("dim", 0)) % max(len(out.shape), 1)
        axes = list(lay.axes)
        axes.insert(dim, ())
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, lay.partial)]


def view_groups(a: Sequence[int], b: Sequence[int], *, ones_forward: bool = False
                ) -> list[tuple[list[int], list[int]]]:
    """Pair the axes of a reshape: groups of input axes whose product equals a group of
    output axes (``[1, 512, 4096] → [512, 4096]`` gives ``([0, 1], [0]), ([2], [1])``).
    Size-1 axes join the group before them (or after, at the start); with
    ``ones_forward`` the group after them when there is one (a batch of 1 is the major
    part of what it merges with: ``[h, 1, s, d] → [h, 1·s, d]``)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        ia, jb = [i], [j]
        pa, pb = a[i], b[j]
        i += 1
        j += 1
        while pa != pb:
            if pa < pb:
                if i >= na:
                    return []
                pa *= a[i]
                ia.append(i)
                i += 1
            else:
                if j >= nb:
                    return []
                pb *= b[j]
                jb.append(j)
                j += 1
        # absorb trailing size-1 axes into this group
        while i < na and a[i] == 1 and (j >= nb or b[j] != 1) and not (
                ones_forward and any(x != 1 for x in a[i:])):
            ia.append(i)
            i += 1
        while j < nb and b[j] == 1 and (i >= na or a[i] != 1) and not (
                ones_forward and any(x != 1 for x in b[j:])):
            jb.append(j)
            j += 1
        groups.append((ia, jb))
    while i < na:
        if groups:
            groups[-1][0].append(i)
        i += 1
    while j < nb:
        if groups:
            groups[-1][1].append(j)
        else:
            groups.append(([], [j]))
        j += 1
    return groups


def _rule_view(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Reshape: the factors of each group of input axes go to the group's output axes —
    heads and features (tp, ep, batch) to the outermost output axis they divide, tokens
    (sp, cp, seq) to the innermost, so ``[S] → [B, S]`` splits S, ``[H] → [heads, d]``
    splits the heads."""
    lay, src, out = ins[0], metas[0], node.outputs[0]
    if not any(lay.axes):
        return [_layout(out.shape, ((),) * len(out.shape), lay.partial)]
    if 0 in src.shape or 0 in out.shape:
        return [Layout.plain(out)]
    # a batch multiplier of a batch-1 capture sits on a size-1 axis, or lands on one
    batch = any(g == "batch" for factors in lay.axes for g, _ in factors)
    groups = view_groups(src.shape, out.shape, ones_forward=batch)
    if not groups:
        return _rule_broadcast(node, metas, ins)
    axes: list[list[tuple[str, Fraction]]] = [[] for _ in out.shape]
    for in_axes, out_axes in groups:
        if not out_axes:
            continue
        pairs: list[tuple[str, Fraction]] = []
        for i in in_axes:
            pairs.extend(lay.axes[i])
        if not pairs:
            continue
        if len(out_axes) == 1:
            axes[out_axes[0]].extend(pairs)
            continue
        # merge factors of one group, then place each on an output axis it divides
        merged: dict[str, Fraction] = {}
        for g, f in pairs:
            merged[g] = merged.get(g, Fraction(1)) * f
        for g, f in merged.items():
            order = list(reversed(out_axes)) if g in _TOKEN_GROUPS else list(out_axes)
            placed = False
            for j in order:
                current = out.shape[j] * _product(tuple(axes[j])) * f
                # a split needs an axis it divides; a multiplier (a larger batch) may
                # land on a size-1 axis (the batch of 1 that was captured)
                if current.denominator == 1 and current >= 1 and (out.shape[j] > 1 or f > 1):
                    axes[j].append((g, f))
                    placed = True
                    break
            if not placed:
                target = next((j for j in order if out.shape[j] > 1), order[0])
                axes[target].append((g, f))
    return [_layout(out.shape, [tuple(a) for a in axes], lay.partial)]


def _rule_cat(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """cat: the cat axis is the sum of the pieces' per-rank sizes; other axes take the
    pieces' factors (a piece with no layout of its own — a KV cache from another phase —
    adopts them)."""
    out = node.outputs[0]
    nd = len(out.shape)
    base = op_base(node.op)
    pieces = [(m, lay) for m, lay in zip(metas, ins, strict=True) if m.numel > 0 or
              len(m.shape) == nd]
    if base == "stack" and pieces:
        return _rule_stack(node, pieces)
    if not pieces:
        return _rule_broadcast(node, metas, ins)
    dim = int(node.attrs.get("dim", 0)) % nd
    axes: list[Factors] = []
    for j in range(nd):
        acc: Factors = ()
        for m, lay in pieces:
            if len(m.shape) == nd and (j == dim or m.shape[j] == out.shape[j]):
                acc = _merge_factors(acc, lay.axes[j]) if j != dim else acc
        axes.append(acc)
    total = 0
    cat_groups: list[str] = []
    for m, lay in pieces:
        if len(m.shape) != nd:
            continue
        total += lay.shape[dim]
        cat_groups.extend(g for g, _ in lay.axes[dim] if g not in cat_groups)
    sizes = {dim: total}
    if total != out.shape[dim] and out.shape[dim]:
        axes[dim] = ((cat_groups[0] if cat_groups else "seq",
                      Fraction(total, out.shape[dim])),)
    partial: set[str] = set()
    for _, lay in pieces:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial, sizes)]


def _rule_stack(node: OpNode, pieces: list[tuple[TensorMeta, Layout]]) -> list[Layout]:
    """stack: a new whole axis at ``dim``; the others take the pieces' factors in order
    (right-aligning the pieces with the output, as broadcasting does, put a batch factor
    on the axis after it: V4's ``rotate_half`` stacks ``[B, 1, S, d]`` halves)."""
    out = node.outputs[0]
    nd = len(out.shape)
    dim = int(node.attrs.get("dim", 0)) % max(nd, 1)
    axes: list[Factors] = []
    for j in range(nd - 1):
        acc: Factors = ()
        for m, lay in pieces:
            if len(m.shape) == nd - 1:
                acc = _merge_factors(acc, lay.axes[j])
        axes.append(acc)
    axes.insert(dim, ())
    partial: set[str] = set()
    for _, lay in pieces:
        partial |= lay.partial
    return [_layout(out.shape, axes, partial)]


def _rule_reduce(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Reductions over ``dim``: reduced axes lose their factors; a sum over an axis split
    by a parallel group is a partial sum over that group."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    src, lay = metas[0], ins[0]
    nd = len(src.shape)
    base = op_base(node.op)
    dims = node.attrs.get("dim")
    if dims is None:
        dims = tuple(range(nd)) if base not in ("topk", "sort", "cumsum") else (-1,)
    if isinstance(dims, int):
        dims = (dims,)
    reduced = {int(d) % nd for d in dims} if nd else set()
    if base == "nll_loss_forward":
        reduced = set(range(nd))
    partial = set(lay.partial)
    if base in ("sum", "mean", "nll_loss_forward", "norm", "linalg_vector_norm", "logsumexp"):
        for i in reduced:
            partial |= {g for g in lay.groups(i) if g in PARALLEL_GROUPS}
    outs = []
    for out in node.outputs:
        if base in ("cumsum", "sort") and len(out.shape) == nd:
            # the axis keeps its entries (OPT's positions: a cumsum over the mask's keys)
            outs.append(_layout(out.shape, lay.axes, partial))
            continue
        if len(out.shape) == nd:
            axes = [() if i in reduced else a for i, a in enumerate(lay.axes)]
            # topk keeps the axis (k entries): no factors on it
        else:
            axes = [a for i, a in enumerate(lay.axes) if i not in reduced]
            if len(axes) != len(out.shape):
                axes = [()] * len(out.shape)
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_matmul(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``[.., M, K] @ [.., K, N]``: M from the left, N from the right, batch axes from
    either; a contraction over an axis split by a parallel group on either side is a
    partial sum over it (the hooks gathered SP/CP-split contractions first)."""
    base = op_base(node.op)
    out = node.outputs[0]
    a_i, b_i = _matmul_operands(node, metas)
    if a_i is None:
        return _rule_broadcast(node, metas, ins)
    a, b = metas[a_i], metas[b_i]
    la, lb = ins[a_i], ins[b_i]
    partial = set(la.partial) | set(lb.partial)
    grouped = base in ("_grouped_mm", "_scaled_grouped_mm", "grouped_mm_fallback")
    if base == "linear":  # x [.., K] · w[N, K]ᵀ
        k_a, k_b = la.axes[-1], lb.axes[-1]
        axes = [*list(la.axes[:-1]), lb.axes[0]]
    elif grouped and len(a.shape) == 2 and len(b.shape) == 2:
        # dW of grouped experts: [K, M] x [M, N] -> [G, K, N], groups along M (rows)
        k_a, k_b = (), ()
        axes = [(), la.axes[0], lb.axes[1]]
    elif grouped and len(a.shape) == 2 and len(b.shape) == 3:
        k_a, k_b = la.axes[1], lb.axes[1]
        axes = [la.axes[0], lb.axes[2]]
    else:
        k_a, k_b = la.axes[-1], lb.axes[-2] if len(b.shape) >= 2 else lb.axes[-1]
        batch_nd = len(out.shape) - 2
        axes = []
        for j in range(batch_nd):
            ka = j - (batch_nd - (len(a.shape) - 2))
            kb = j - (batch_nd - (len(b.shape) - 2))
            fa = la.axes[ka] if ka >= 0 else ()
            fb = lb.axes[kb] if kb >= 0 else ()
            axes.append(fa if len(fa) >= len(fb) else fb)
        axes.append(la.axes[-2] if len(a.shape) >= 2 else ())
        axes.append(lb.axes[-1] if len(b.shape) >= 2 else ())
    for g, _ in (*k_a, *k_b):
        if g in ("tp", "etp", "ep"):
            partial.add(g)
        elif g in ("sp", "cp") and {x for x, _ in k_a} & {x for x, _ in k_b} & {g}:
            partial.add("tp" if g == "sp" else g)
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, partial)] + [Layout.plain(t) for t in node.outputs[1:]]


def _matmul_operands(node: OpNode, metas: list[TensorMeta]) -> tuple[int | None, int | None]:
    base = op_base(node.op)
    shaped = [i for i, m in enumerate(metas) if len(m.shape) >= 2]
    if base in ("addmm", "baddbmm"):
        shaped = [i for i in shaped if i > 0] or shaped
        if len(metas) >= 3:
            return 1, 2
    if base == "linear":
        return (0, 1) if len(metas) >= 2 else (None, None)
    if len(shaped) >= 2:
        return shaped[0], shaped[1]
    return None, None


def _rule_attention(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                    ) -> list[Layout]:
    """Attention ``q [b, h, s_q, d], k/v [b, h_kv, s_kv, d]`` → ``o [b, s_q, h, d_v]`` and
    ``lse [b, h, s_q]``; backward gives dq, dk, dv like q, k, v. Keys split over CP
    without the queries (decode against a split cache) leave a partial output."""
    base = op_base(node.op)
    first = 1 if base == "attention_backward" else 0
    if len(metas) < first + 3 or any(len(m.shape) != 4 for m in metas[first:first + 3]):
        return _rule_broadcast(node, metas, ins)
    lq, lk, lv = ins[first:first + 3]
    partial = set(lq.partial) | set(lk.partial) | set(lv.partial)
    if "cp" in lk.groups(2) and "cp" not in lq.groups(2):
        partial.add("cp")
    outs = []
    if first:  # backward: dq, dk, dv, then extras
        for k, out in enumerate(node.outputs):
            src = ins[first + k] if k < 3 else None
            if src is not None and len(out.shape) == 4:
                outs.append(_layout(out.shape, src.axes))
            else:
                outs.append(Layout.plain(out))
        return outs
    for out in node.outputs:
        if len(out.shape) == 4:  # [b, s_q, h, d_v]
            axes = [lq.axes[0], lq.axes[2], lq.axes[1], lv.axes[3]]
        elif len(out.shape) == 3:  # lse [b, h, s_q]
            axes = [lq.axes[0], lq.axes[1], lq.axes[2]]
        else:
            outs.append(Layout.plain(out))
            continue
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_query_attention(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                          ) -> list[Layout]:
    """A plugin's attention kernel: outputs follow the query ``[b, h, s_q, d]`` (input 0)
    alone — ``[b, s_q, h, d]`` and ``[b, h, s_q]`` — whatever the keys look like (a latent
    cache, window and compressed entries, top-k indices)."""
    if not ins or len(metas[0].shape) != 4:
        return _rule_broadcast(node, metas, ins)
    lq = ins[0]
    partial: set[str] = set()
    for lay in ins:
        partial |= lay.partial
    outs = []
    for out in node.outputs:
        if len(out.shape) == 4:
            axes = [lq.axes[0], lq.axes[2], lq.axes[1], ()]
        elif len(out.shape) == 3:
            axes = [lq.axes[0], lq.axes[1], lq.axes[2]]
        else:
            outs.append(Layout.plain(out))
            continue
        outs.append(_layout(out.shape, axes, partial))
    return outs


def _rule_leading(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """Row-wise kernels: each output's leading axes follow input 0's axes but its last (the
    rows: batch, tokens); the outputs' own trailing axes stay whole."""
    if not ins or not metas[0].shape:
        return _rule_broadcast(node, metas, ins)
    lead = ins[0].axes[:-1]
    outs = []
    for out in node.outputs:
        axes = [lead[j] if j < len(lead) else () for j in range(len(out.shape))]
        outs.append(_layout(out.shape, axes, ins[0].partial))
    return outs


def _rule_gradients(node: OpNode, metas: list[TensorMeta], ins: list[Layout]
                    ) -> list[Layout]:
    """A plugin kernel's backward: each output (a gradient) takes the layout of the last
    input of its captured shape (the forward input it is the gradient of)."""
    outs = []
    for out in node.outputs:
        match = None
        for m, lay in zip(metas, ins, strict=True):
            if m.shape == out.shape:
                match = lay
        outs.append(_layout(out.shape, match.axes) if match is not None
                    else Layout.plain(out))
    return outs


def _rule_indexer(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """A top-k selection kernel ``(q [b, s_q, ...], keys [b, t, ...], ...) → indices
    [b, s_q, k]`` with ``k = min(attrs["topk"], t)`` (DSA's and CSA's lightning indexers):
    batch and queries follow the query, ``k`` the keys' rows — a capture with fewer keys
    than ``topk`` picks them all, and so does its rescale to a longer cache, up to
    ``topk``."""
    if len(metas) < 2 or len(metas[0].shape) < 2 or len(metas[1].shape) < 2:
        return _rule_broadcast(node, metas, ins)
    lq, lk = ins[0], ins[1]
    topk = int(node.attrs.get("topk") or 0)
    outs = []
    for out in node.outputs:
        nd = len(out.shape)
        if nd < 3:
            outs.append(Layout.plain(out))
            continue
        axes: list[Factors] = [lq.axes[0], lq.axes[1]] + [()] * (nd - 2)
        sizes: dict[int, int] = {}
        if topk > 0 and out.shape[-1]:
            k = min(topk, lk.shape[1])
            if k != out.shape[-1]:
                axes[-1] = (("kv", Fraction(k, out.shape[-1])),)
                sizes[nd - 1] = k
        outs.append(_layout(out.shape, axes, (), sizes))
    return outs


#: Layout rules a formula may name (``OpFormula.layout``) for ops the core has no rule for.
LAYOUT_RULES: Mapping[str, Rule] = {
    "attention": _rule_query_attention,
    "leading": _rule_leading,
    "gradients": _rule_gradients,
    "indexer": _rule_indexer,
}


def _rule_embedding(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """``embedding(weight [V, H], idx [...]) → [..., H]``: a vocabulary split leaves a
    partial sum (each rank looks up the rows it holds)."""
    if len(ins) < 2:
        return _rule_broadcast(node, metas, ins)
    lw, li = ins[0], ins[1]
    out = node.outputs[0]
    axes = [*list(li.axes), lw.axes[1] if len(lw.axes) > 1 else ()]
    partial = {g for g in lw.groups(0) if g in PARALLEL_GROUPS} | set(li.partial)
    if len(axes) != len(out.shape):
        return _rule_broadcast(node, metas, ins)
    return [_layout(out.shape, axes, partial)]


def _rule_moe(node: OpNode, metas: list[TensorMeta], ins: list[Layout]) -> list[Layout]:
    """MoE permutation ops. dispatch: ``x [T, H], idx [T, k] → rows [T·k, H], row_token,
    row_expert``; combine: ``rows [T·k, H], row_token, w [T, k] → [T, H]``. Rows follow
    the tokens (the EP hook divides them when ranks share tokens)."""
    base = op_base(node.op)
    outs = []
    if base == "moe_dispatch":
        lx = ins[0]
        for out in node.outputs:
            axes = [lx.axes[0]] + ([lx.axes[1]] if len(out.shape) == 2 else [])
            outs.append(_layout(out.shape, axes[:len(out.shape)]))
        return outs
    if base == "moe_combine":  # tokens follow the rows (rows/k), not the EP row split
        lr = ins[0]
        out = node.outputs[0]
        axes = [_without(lr.axes[0], "ep"), lr.axes[1] if len(lr.axes) > 1 else ()]
        return [_layout(out.shape, axes[:len(out.shape)], lr.partial)]
    if base == "moe_dispatch_backward":  # (grad_rows [T·k, H], row_token) -> [T, H]
        lg = ins[0]
        out = node.outputs[0]
        axes = [_without(lg.axes[0], "ep"), lg.axes[1] if len(lg.axes) > 1 else ()]
        return [_layout(out.shape, axes[:len(out.shape)], lg.partial)]
    # moe_combine_backward: (grad_out [T, H], rows [T·k, H], row_token, w [T, k])
    lrows = ins[1] if len(ins) > 1 else ins[0]
    lw = ins[3] if len(ins) > 3 else ins[0]
    for k, out in enumerate(node.outputs):
        src = lrows if k == 0 else lw
        outs.append(_layout(out.shape, src.axes[:len(out.shape)]
                            if len(src.axes) == len(out.shape) else [()] * len(out.shape)))
    return outs


def propagate_shapes(graph: OpGraph, seeds: Mapping[int, Layout] | Callable[
        [TensorMeta, OpNode], Layout | None], registry: FormulaRegistry | None, *,
        attrs: Mapping[str, Mapping[Any, Any]] | None = None) -> OpGraph:
    """Carry seeded per-tensor layouts through a graph and re-price every changed node.

    :param seeds: layouts by tensor id, or a function giving the layout of a tensor that no
        node of the graph produces, or of what a node makes from nothing (``zeros``,
        ``arange``: the function receives that node); None: as captured.
    :param attrs: node attrs to move, ``{name: {captured value: new value}}``.
    """
    class _Seeded(ShapePass):
        def seed(self, meta: TensorMeta, node: OpNode) -> Layout | None:
            if callable(seeds):
                return seeds(meta, node)
            return seeds.get(meta.tensor_id) if meta.tensor_id is not None else None

        def root(self, meta: TensorMeta, node: OpNode, lay: Layout) -> Layout:
            if callable(seeds):
                return seeds(meta, node) or lay
            return lay

    return _Seeded(graph, registry, attrs=attrs).run()


def scaled_layout(meta: TensorMeta, factors: Mapping[int, tuple[str, Fraction]]) -> Layout:
    """A seed: ``meta`` with some axes scaled, ``{axis: (group, factor)}``."""
    axes = [((factors[i],) if i in factors else ()) for i in range(len(meta.shape))]
    return _layout(meta.shape, axes)


# -- the tensor-parallel plan ------------------------------------------------------------

COLWISE, ROWWISE, VOCAB, REPLICATED = "colwise", "rowwise", "vocab", "replicated"

_NAME_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    # every rank computes a shared key cache in full (vLLM's ReplicatedLinear): V4's KV
    # compressors and the DSA / CSA lightning indexers (V3.2, V4), whatever their
    # projections are called (q_b_proj, gate_proj inside them stay whole)
    (re.compile(r"(^|\.)(compressor|indexer)(\.|$)"), REPLICATED),
    (re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|embed_in|tok_embeddings|"
                r"embeddings)$"), VOCAB),
    (re.compile(r"(^|\.)(lm_head|embed_out)$"), COLWISE),
    # o_a_proj: DeepSeek-V4's grouped output projection, column-parallel over its groups
    # (vLLM's wo_a, n_local_groups = o_groups / tp); in_proj, conv1d and the per-head
    # A_log / D / dt_bias and gated norm: a Mamba-2 mixer split by heads (Megatron's
    # MambaMixer, vLLM's MambaMixer2); sinks: per-head attention sinks (GPT-OSS, V4)
    (re.compile(r"(^|\.)(q_proj|k_proj|v_proj|q_b_proj|kv_b_proj|query|key|value|qkv_proj|"
                r"c_attn|query_key_value|W_pack|Wqkv|gate_proj|up_proj|gate_up_proj|c_fc|"
                r"fc1|fc_in|dense_h_to_4h|w1|w3|wi|wi_0|wi_1|o_a_proj|in_proj|"
                r"mixer\.conv1d|mixer\.norm|A_log|D|dt_bias|sinks)$"), COLWISE),
    (re.compile(r"(^|\.)(o_proj|out_proj|c_proj|down_proj|fc2|fc_out|dense_4h_to_h|w2|wo|"
                r"o_b_proj|self_attention\.dense|attention\.dense)$"), ROWWISE),
)
_KV_PROJ = re.compile(r"(^|\.)(k_proj|v_proj|key|value)$")
_ROUTER = re.compile(r"(Router|TopK|Gate)$")


def _style(value: str) -> tuple[str, bool]:
    s = value.lower()
    packed = "packed" in s
    if s.startswith("embedding"):  # nemotron_h's "embedding_rowwise": the vocabulary rows
        return VOCAB, False
    if "colwise" in s:
        return COLWISE, packed
    if "rowwise" in s:
        return ROWWISE, packed
    return REPLICATED, False


@frozen
class TPPlan:
    """Which weights tensor parallelism splits and how.

    :param entries: ``(pattern, style)`` from a config's ``base_model_tp_plan``
        (``"layers.*.self_attn.q_proj": "colwise"``); a pattern matches the end of a
        module path or parameter name, ``*`` one path component.
    :param source: where the plan came from, for reports.
    """

    entries: tuple[tuple[str, str], ...] = field(default=(), converter=tuple)
    source: str = "module-name rules"

    @classmethod
    def from_mapping(cls, plan: Mapping[str, str] | None, source: str = "") -> TPPlan:
        if not plan:
            return cls()
        return cls(entries=tuple((str(k), str(v)) for k, v in plan.items()),
                   source=source or "config base_model_tp_plan")

    def _compiled(self) -> list[tuple[re.Pattern[str], str, bool]]:
        cached = _PLAN_CACHE.get(self.entries)
        if cached is None:
            cached = []
            for pattern, style in self.entries:
                rx = re.escape(pattern).replace(r"\*", r"[^.]+")
                kind, packed = _style(style)
                cached.append((re.compile(rf"(^|\.){rx}$"), kind, packed))
            _PLAN_CACHE[self.entries] = cached
        return cached

    def style_of(self, param: str) -> tuple[str, bool] | None:
        """``(style, packed)`` for a parameter name, or None when nothing splits it."""
        module, _, leaf = param.rpartition(".")
        for rx, kind, packed in self._compiled():
            if rx.search(module) or rx.search(param):
                return (None if kind == REPLICATED else (kind, packed))
        for rx, kind in _NAME_RULES:
            if rx.search(module):
                return None if kind == REPLICATED else (kind, False)
            if leaf not in ("weight", "bias") and rx.search(param):
                return None if kind == REPLICATED else (kind, leaf == "gate_up_proj")
        return None


_PLAN_CACHE: dict[tuple[tuple[str, str], ...], list[tuple[re.Pattern[str], str, bool]]] = {}


# -- the parallel transform ----------------------------------------------------------------


def _reduce_group(partial: frozenset[str], parallel: Parallel) -> list[str]:
    """The collective groups that reduce a partial sum over ``partial``."""
    groups = set(partial)
    if "sp" in groups:
        groups.discard("sp")
        groups.add("tp")
    out: list[str] = []
    if {"ep", "etp"} <= groups and parallel.ep * parallel.expert_tp == parallel.tp:
        groups -= {"ep", "etp"}
        groups.add("tp")
    if "ep" in groups and parallel.ep * parallel.expert_tp <= parallel.tp:
        groups.discard("ep")
        if parallel.ep * parallel.expert_tp == parallel.tp:
            groups.add("tp")
        else:
            out.append("ep")
    for g in ("tp", "etp", "ep", "cp"):
        if g in groups:
            out.append(g)
    return out


def collective(node_id: int, kind: str, group: str, parallel: Parallel, nbytes: float,
               inputs: Sequence[TensorMeta], outputs: Sequence[TensorMeta], like: OpNode,
               **attrs: Any) -> OpNode:
    """A collective node as docs/architecture.md defines it, placed in ``like``'s layer."""
    size, span = parallel.span(group)
    return OpNode(
        id=node_id, op=f"comm.{kind}", category=Category.COLLECTIVE, phase=like.phase,
        inputs=tuple(inputs), outputs=tuple(outputs), module_path=like.module_path,
        module_class=like.module_class, layer_index=like.layer_index,
        layer_kind=like.layer_kind, formula="zrt.collective",
        attrs={"collective": kind, "group": group, "group_size": size, "span": span,
               "bytes": int(nbytes), **attrs})


class _ParallelPass(ShapePass):
    """TP/SP/CP/EP in one walk (see the module docstring)."""

    def __init__(self, graph: OpGraph, ctx_parallel: Parallel, dims: ModelDims | None,
                 plan: TPPlan, registry: FormulaRegistry | None, *, training: bool,
                 state: dict[int, Layout] | None = None,
                 extra: Callable[[TensorMeta, OpNode],
                                 Mapping[int, tuple[str, Fraction]] | None] | None = None,
                 attrs: Mapping[str, Mapping[Any, Any]] | None = None) -> None:
        super().__init__(graph, registry, state=state, attrs=attrs)
        self.extra = extra
        p = ctx_parallel
        self.p = p
        self.dims = dims
        self.plan = plan
        self.training = training
        self.sp = p.sequence_parallel(training) and p.tp > 1
        self.tp = p.tp
        self.etp = p.expert_tp
        self.expert_group = "tp" if p.expert_tp == p.tp else "etp"
        self.ep = p.ep
        self.cp = p.cp
        # EP ranks holding the same tokens: TP peers inside one EP group (not with SP)
        self.ep_shared = 1
        if p.ep > 1 and not self.sp:
            self.ep_shared = max(1, min(p.ep, p.tp // max(p.expert_tp, 1)))
        self.gathered: dict[tuple[int | None, str], int] = {}
        self.gathered_root: dict[tuple[int, str], int] = {}
        self.serving = graph.phase in (Phase.PREFILL, Phase.DECODE)
        self.backward = graph.phase == Phase.TRAIN_BACKWARD
        self.experts = dims.experts if dims is not None else 0
        self.kv_heads = dims.kv_heads if dims is not None else 0
        self.head_dim = dims.head_dim if dims is not None else 0
        self.cache_inputs = _cache_inputs(graph)
        last = max((i for i, n in enumerate(graph.nodes) if n.layer_index is not None),
                   default=-1)
        self.head_ids = {n.id for n in graph.nodes[last + 1:]} if last >= 0 else set()
        # CP splits what the batch brings along the sequence (Megatron's
        # get_batch_on_this_cp_rank slices tokens, labels, positions and masks): integer
        # inputs (token ids, labels), and tensors the model makes from nothing before its
        # first layer (cache positions, the all-ones mask OPT derives positions from).
        self.cp_seq = 0
        self.cp_roots: set[int] = set()
        if self.cp > 1 and graph.phase in (Phase.PREFILL, Phase.TRAIN_FORWARD,
                                           Phase.TRAIN_BACKWARD):
            self.cp_seq = int(graph.meta.get("seq_len") or 0)
            first = next((i for i, n in enumerate(graph.nodes) if n.layer_index is not None),
                         len(graph.nodes))
            if graph.phase != Phase.TRAIN_BACKWARD:
                self.cp_roots = {n.id for n in graph.nodes[:first]
                                 if n.category == Category.CREATION and not any(
                                     t.tensor_id is not None for t in n.inputs)}

    # -- seeds ---------------------------------------------------------------------------

    def seed(self, meta: TensorMeta, node: OpNode) -> Layout | None:
        lay = self._seed(meta, node)
        extra = self.extra(meta, node) if self.extra is not None else None
        if not extra:
            return lay
        axes = list(lay.axes) if lay is not None else [()] * len(meta.shape)
        for axis, pair in extra.items():
            axes[axis] = (pair, *axes[axis])
        return _layout(meta.shape, axes)

    def root(self, meta: TensorMeta, node: OpNode, lay: Layout) -> Layout:
        extra = self.extra(meta, node) if self.extra is not None else None
        if not extra:
            return lay
        axes = list(lay.axes)
        for axis, pair in extra.items():
            axes[axis] = (pair, *axes[axis])
        return _layout(meta.shape, axes, lay.partial)

    def _seed(self, meta: TensorMeta, node: OpNode) -> Layout | None:
        if meta.param is not None:
            return self._param_seed(meta, node)
        if meta.tensor_id in self.produced:
            return None
        if self.cp > 1:
            if meta.tensor_id in self.cache_inputs:  # a KV cache split along its sequence
                axis = self.cache_inputs[meta.tensor_id]
                return scaled_layout(meta, {axis: ("cp", Fraction(1, self.cp))})
            if meta.dtype.startswith(("int", "uint", "bool")):  # token ids, labels
                return self._sequence_split(meta)
        return None

    def _sequence_split(self, meta: TensorMeta) -> Layout | None:
        """``meta`` split over CP along its sequence axis (the first of the captured
        sequence length, after the batch axis), or None when it has none."""
        axis = sequence_axis(meta.shape, self.cp_seq, self.graph.meta.get("batch"))
        if axis is None:
            return None
        return scaled_layout(meta, {axis: ("cp", Fraction(1, self.cp))})

    def _param_seed(self, meta: TensorMeta, node: OpNode) -> Layout | None:
        name = meta.param
        assert name is not None
        nd = len(meta.shape)
        factors: dict[int, tuple[str, Fraction]] = {}
        is_expert = nd == 3 and self.experts and meta.shape[0] == self.experts
        if is_expert and self.ep > 1:
            factors[0] = ("ep", Fraction(1, self.ep))
        style = self.plan.style_of(name) if (self.tp > 1 or self.etp > 1) else None
        if style is not None:
            kind, _packed = style
            degree, group = self.tp, "tp"
            if is_expert:
                degree, group = self.etp, self.expert_group
            if degree > 1 and nd >= 1:
                conv1d = node.module_class == "Conv1D" or _is_conv1d(name, node)
                axis = None
                if kind == VOCAB:
                    axis = 0
                elif nd == 1:
                    axis = 0 if kind == COLWISE else None
                elif nd == 3 and not is_expert:  # a convolution [out, in / groups, k]
                    axis = 0 if kind == COLWISE else 1
                elif kind == COLWISE:
                    axis = nd - 1 if conv1d else nd - 2
                elif kind == ROWWISE:
                    axis = nd - 2 if conv1d else nd - 1
                if axis is not None:
                    divisor = degree
                    module = name.rpartition(".")[0]
                    if (_KV_PROJ.search(module) and self.kv_heads and
                            degree > self.kv_heads and
                            meta.shape[axis] == self.kv_heads * self.head_dim):
                        divisor = self.kv_heads  # one KV head per rank, replicated
                    if meta.shape[axis] % divisor == 0 or kind == VOCAB:
                        factors[axis] = (group, Fraction(1, divisor))
        if not factors:
            return None
        return scaled_layout(meta, factors)

    # -- hooks ---------------------------------------------------------------------------

    def before(self, node: OpNode, ins: list[Layout]) -> list[Layout]:
        base = op_base(node.op)
        metas = [self._current_meta(t) for t in node.inputs]
        # 1. partial sums reach something that is not linear in them: reduce first
        safe = (base in _PARTIAL_SAFE or node.zero_cost) and base not in _SHAPE_ONLY
        if base == "add" or base == "sub":
            shaped = [lay for m, lay in zip(metas, ins, strict=True) if m.shape]
            safe = bool(shaped) and all(lay.partial and lay.partial == shaped[0].partial
                                        for lay in shaped)
        if base == "moe_combine":
            safe = True
        if not safe:
            for _k, (m, lay) in enumerate(zip(metas, ins, strict=True)):
                if lay.partial and m.tensor_id is not None:
                    self._reduce(node, m, lay)
        # 2. tokens split by SP reach a matmul with split weights: gather them
        if base in _MATMUL and (self.sp or self.cp > 1):
            self._gather_for_matmul(node)
        if base in ("attention", "attention_backward") and self.cp > 1:
            self._context_parallel_attention(node)
        if base in ("attention", "attention_backward") and self.sp:
            first = 1 if base == "attention_backward" else 0
            for t in node.inputs[first:first + 3]:
                m = self._current_meta(t)
                lay = self.layout_of(m, node)
                for axis in range(len(lay.axes)):
                    if "sp" in lay.groups(axis):
                        self._gather(node, m, axis, "sp")
        if self.ep > 1 and base in ("moe_combine", "moe_dispatch_backward"):
            self._expert_all_to_all(node, before=True)
        if base == "embedding_dense_backward" and self.sp:
            m = self._current_meta(node.inputs[0])
            lay = self.layout_of(m, node)
            for axis in range(len(lay.axes)):
                if "sp" in lay.groups(axis):
                    self._gather(node, m, axis, "sp")
        if base in _SOFTMAX or base in ("_log_softmax_backward_data",
                                        "_softmax_backward_data"):
            self._softmax_stats(node)
        return ins

    def after(self, node: OpNode, ins: list[Layout], outs: list[Layout]) -> list[Layout]:
        base = op_base(node.op)
        if node.id in self.cp_roots:
            outs = [self._sequence_split(t) or o for t, o in zip(node.outputs, outs,
                                                                 strict=True)]
        if base == "moe_dispatch" and self.ep_shared > 1:
            f = Fraction(1, self.ep_shared)
            outs = [_layout(node.outputs[k].shape,
                            [(*lay, ("ep", f)) if i == 0 else lay
                             for i, lay in enumerate(o.axes)])
                    for k, o in enumerate(outs)]
        if base == "moe_combine" and self.ep > 1 and self.ep_shared == self.ep:
            outs = [Layout(o.shape, o.axes, o.partial | {"ep"}) for o in outs]
        if base == "moe_dispatch_backward" and self.ep > 1 and self.ep_shared == self.ep:
            outs = [Layout(o.shape, o.axes, o.partial | {"ep"}) for o in outs]
        if self.backward and (base in _MATMUL or base in _REDUCE):
            outs = [self._gradient_partial(node, o) for o in outs]
        if self.ep > 1 and base in ("_grouped_mm", "grouped_mm_fallback") and \
                len(node.inputs) >= 2 and len(node.inputs[0].shape) == 2 and \
                len(node.inputs[1].shape) == 2 and len(node.outputs[0].shape) == 3:
            # dW of grouped experts: one gradient per local expert
            o = outs[0]
            axes = list(o.axes)
            axes[0] = axes[0] + (("ep", Fraction(1, self.ep)),)
            outs = [_layout(node.outputs[0].shape, axes, o.partial), *outs[1:]]
        if node.id in self._ulysses:
            outs = self._ulysses_back(node, outs)
        if node.id in self._ring_kv and base == "attention_backward":
            # dK/dV accumulators return to their owner: local sequence blocks
            local = self._ring_kv[node.id]
            outs = [local[k - 1] if k in (1, 2) and len(o.shape) == 4 else o
                    for k, o in enumerate(outs)]
        if base == "embedding_dense_backward" and self.tp > 1 and node.module_path:
            style = self.plan.style_of(node.module_path + ".weight")
            if style is not None and style[0] == VOCAB:
                o = outs[0]
                axes = list(o.axes)
                axes[0] = axes[0] + (("tp", Fraction(1, self.tp)),)
                outs = [_layout(node.outputs[0].shape, axes, o.partial), *outs[1:]]
        if self.ep > 1 and base in ("moe_dispatch", "moe_combine_backward"):
            outs = self._expert_all_to_all_after(node, outs)
        return outs

    def finish(self) -> None:
        """Reduce partial sums left at the end (a loss) and, when serving, gather logits
        split over the vocabulary."""
        consumed = set()
        emitted = self.emitted()
        for n in emitted:
            for t in n.inputs:
                if t.tensor_id is not None:
                    consumed.add(t.tensor_id)
        for n in emitted:
            if n.category == Category.COLLECTIVE:
                continue
            for t in n.outputs:
                tid = t.tensor_id
                if tid is None or tid in consumed or tid in self.replace:
                    continue
                lay = self.state.get(tid)
                if lay is None:
                    continue
                t = self.captured(t)
                if lay.partial and not self.backward:
                    self._reduce(n, t, lay, at_end=True)
                    t = self._current_meta(t)
                    lay = self.state[t.tensor_id]  # type: ignore[index]
                if self.serving and n.id in self.head_ids and t.shape and \
                        lay.groups(len(lay.axes) - 1) & {"tp"}:
                    self._gather(n, t, len(lay.axes) - 1, "tp", at_end=True)

    # -- collectives ---------------------------------------------------------------------

    def _reduce(self, node: OpNode, meta: TensorMeta, lay: Layout, *,
                at_end: bool = False) -> None:
        """Reduce a partial sum before ``node`` reads it: an all-reduce per group, or a
        reduce-scatter along tokens on the TP group with SP."""
        current, current_lay = meta, lay
        for group in _reduce_group(lay.partial, self.p):
            remaining = frozenset(g for g in current_lay.partial
                                  if g not in _covered(group, self.p))
            shape, axes = list(current_lay.shape), list(current_lay.axes)
            kind = "all_reduce"
            axis = _token_axis(current_lay, self.tp) \
                if (group == "tp" and self.sp and not at_end) else None
            if axis is not None and shape[axis] % self.tp == 0:
                kind = "reduce_scatter"
                shape[axis] //= self.tp
                axes[axis] = axes[axis] + (("sp", Fraction(1, self.tp)),)
            out = self.new_tensor(current, Layout(tuple(shape), tuple(axes), remaining))
            like = self.placement(current.tensor_id, node)
            coll = collective(self.new_node_id(), kind, group, self.p,
                              _nbytes(current_lay.shape, current.dtype),
                              [evolve(current, shape=current_lay.shape)], [out], like)
            self.place(coll, current.tensor_id, node)
            self.replace[current.tensor_id] = out.tensor_id  # type: ignore[index]
            current, current_lay = out, self.state[out.tensor_id]  # type: ignore[index]

    def _gather(self, node: OpNode, meta: TensorMeta, axis: int, group: str, *,
                at_end: bool = False) -> None:
        """All-gather ``meta`` along ``axis`` over ``group`` before ``node`` reads it. Views
        of one tensor share one gather (q, k and v projections read one gathered norm
        output); the later ones get a free view of the gathered tensor."""
        key = (meta.tensor_id, group)
        if key in self.gathered:
            self.replace[meta.tensor_id] = self.gathered[key]  # type: ignore[index]
            return
        lay = self.layout_of(meta, node)
        degree = 1
        for g, f in lay.axes[axis]:
            if g == group:
                degree = round(1 / f)
        if degree <= 1:
            return
        axes = list(lay.axes)
        axes[axis] = _without(lay.axes[axis], group)
        shape = list(lay.shape)
        shape[axis] = shape[axis] * degree
        out_lay = Layout(tuple(shape), tuple(axes), lay.partial)
        out = self.new_tensor(meta, out_lay)
        root = self._view_root(meta.tensor_id)
        root_key = (root, group)
        source = self.gathered_root.get(root_key) if root is not None else None
        like = self.placement(meta.tensor_id, node)
        if source is not None:  # already gathered through another view: a free view
            src_meta = self.metas[source]
            view = OpNode(id=self.new_node_id(), op="aten.view.default",
                          category=Category.VIEW, phase=like.phase,
                          inputs=(evolve(src_meta, shape=self.state[source].shape),),
                          outputs=(out,), module_path=like.module_path,
                          module_class=like.module_class, layer_index=like.layer_index,
                          layer_kind=like.layer_kind, zero_cost=True,
                          attrs={"size": tuple(out.shape), "shares_gather": True})
            self.insert(view)
        else:
            coll_group = "tp" if group == "sp" else group
            coll = collective(self.new_node_id(), "all_gather", coll_group, self.p,
                              _nbytes(out_lay.shape, meta.dtype),
                              [evolve(meta, shape=lay.shape)], [out], like)
            self.place(coll, meta.tensor_id, node)
            if root is not None:
                self.gathered_root[root_key] = out.tensor_id  # type: ignore[assignment]
        self.replace[meta.tensor_id] = out.tensor_id  # type: ignore[index]
        self.gathered[key] = out.tensor_id  # type: ignore[assignment]

    def _view_root(self, tensor_id: int | None) -> int | None:
        """The tensor a chain of zero-cost single-input views starts from."""
        seen = 0
        while tensor_id is not None and seen < 16:
            producer = self.producer(tensor_id)
            if producer is None or not producer.zero_cost or len(
                    [t for t in producer.inputs if t.tensor_id is not None]) != 1:
                return tensor_id
            tensor_id = producer.inputs[0].tensor_id
            seen += 1
        return tensor_id

    def _gather_for_matmul(self, node: OpNode) -> None:
        metas = [self._current_meta(t) for t in node.inputs]
        a_i, b_i = _matmul_operands(node, metas)
        if a_i is None or b_i is None:
            return
        la = self.layout_of(metas[a_i], node)
        lb = self.layout_of(metas[b_i], node)
        weight_split = any(g in ("tp", "etp") for axis in lb.axes for g, _ in axis) or \
            any(g in ("tp", "etp") for axis in la.axes for g, _ in axis)
        base = op_base(node.op)
        k_a = len(la.axes) - 1
        k_b = len(lb.axes) - 2 if len(lb.axes) >= 2 else 0
        if base == "linear":
            k_b = len(lb.axes) - 1
        for group in ("sp", "cp"):
            in_a = group in la.groups(k_a)
            in_b = group in lb.groups(k_b) if lb.axes else False
            # a contraction split on one side only: gather it. This holds for a grouped
            # dW too (rows are its contraction): with SP, dY arrives from the combine's
            # backward split over TP while the saved input holds every row; left split,
            # the dW GEMM counted half its rows and MoE HFU fell below MFU
            if in_a != in_b:
                if in_a:
                    self._gather(node, metas[a_i], k_a, group)
                else:
                    self._gather(node, metas[b_i], k_b, group)
            if group == "sp" and weight_split:  # tokens split, weights split: gather
                for idx, lay in ((a_i, la), (b_i, lb)):
                    for axis in range(len(lay.axes)):
                        if axis in ((k_a,) if idx == a_i else (k_b,)):
                            continue
                        if "sp" in lay.groups(axis):
                            self._gather(node, self._current_meta(node.inputs[idx]), axis,
                                         "sp")

    def _context_parallel_attention(self, node: OpNode) -> None:
        base = op_base(node.op)
        first = 1 if base == "attention_backward" else 0
        metas = [self._current_meta(t) for t in node.inputs]
        if len(metas) < first + 3:
            return
        lq, lk = self.layout_of(metas[first], node), self.layout_of(metas[first + 1], node)
        if "cp" not in lq.groups(2) or "cp" not in lk.groups(2):
            return  # decode against a split cache: a partial output, reduced later
        if self.p.cp_kind == "ulysses":
            # sequence split -> heads split for every 4-D input (q, k, v; grad_out and out
            # backward), and back for the outputs (after the node)
            for m in metas:
                if len(m.shape) == 4 and m.tensor_id is not None:
                    self._ulysses_swap(node, m, self.layout_of(m, node), to_heads=True)
            self._ulysses.add(node.id)
            return
        # ring: the KV blocks of the other cp-1 ranks pass by while attention runs
        cp = self.cp
        sources, gathered = [], []
        kv_bytes = 0
        self._ring_kv[node.id] = tuple(self.layout_of(m, node)
                                       for m in metas[first + 1:first + 3])
        for m in metas[first + 1:first + 3]:
            lay = self.layout_of(m, node)
            kv_bytes += _nbytes(lay.shape, m.dtype)
            axes = list(lay.axes)
            axes[2] = _without(axes[2], "cp")
            shape = list(lay.shape)
            shape[2] *= cp
            sources.append(evolve(m, shape=lay.shape))
            gathered.append(self.new_tensor(m, Layout(tuple(shape), tuple(axes),
                                                      lay.partial)))
        if first:
            kv_bytes *= 2  # backward also passes the dK/dV accumulators around the ring
        self.insert(collective(self.new_node_id(), "send_recv", "cp", self.p,
                               (cp - 1) * kv_bytes, sources, gathered, node,
                               overlap="consumer", cp_kind="ring", steps=cp - 1))
        for src, out in zip(sources, gathered, strict=True):
            self.replace[src.tensor_id] = out.tensor_id  # type: ignore[index]
        self._ring.add(node.id)

    def _ulysses_swap(self, node: OpNode, meta: TensorMeta, lay: Layout, *, to_heads: bool,
                      after: bool = False) -> TensorMeta | None:
        """All-to-all between a sequence split and a heads split of a 4-D tensor laid out
        ``[b, h, s, d]`` (q, k, v) or ``[b, s, h, d]`` (attention output)."""
        seq = next((i for i in (2, 1) if "cp" in lay.groups(i)), None) if to_heads else \
            next((i for i in (1, 2) if "cp" in lay.groups(i)), None)
        if seq is None:
            return None
        other = 1 if seq == 2 else 2
        src_axis, dst_axis = (seq, other) if to_heads else (other, seq)
        if to_heads:
            src_axis, dst_axis = seq, other
        else:
            src_axis, dst_axis = seq, other  # seq here holds the heads split
        cp = self.cp
        axes = list(lay.axes)
        shape = list(lay.shape)
        axes[src_axis] = _without(axes[src_axis], "cp")
        axes[dst_axis] = axes[dst_axis] + (("cp", Fraction(1, cp)),)
        shape[src_axis] *= cp
        shape[dst_axis] = max(1, shape[dst_axis] // cp)
        out = self.new_tensor(meta, Layout(tuple(shape), tuple(axes), lay.partial))
        self.insert(collective(self.new_node_id(), "all_to_all", "cp", self.p,
                               _nbytes(lay.shape, meta.dtype),
                               [evolve(meta, shape=lay.shape)], [out], node,
                               cp_kind="ulysses"), after=after)
        self.replace[meta.tensor_id] = out.tensor_id  # type: ignore[index]
        return out

    def _ulysses_back(self, node: OpNode, outs: list[Layout]) -> list[Layout]:
        """After a Ulysses attention: outputs split by heads go back to a sequence split."""
        for t, lay in zip(node.outputs, outs, strict=True):
            if len(t.shape) == 4 and t.tensor_id is not None:
                self.state[t.tensor_id] = lay
                # heads are axis 2 of [b, s, h, d] outputs and axis 1 of dq/dk/dv
                heads = 2 if op_base(node.op) == "attention" else 1
                if "cp" in lay.groups(heads):
                    self._ulysses_swap(node, t, lay, to_heads=False, after=True)
        return outs

    _ring: set[int]
    _ulysses: set[int]

    def run(self) -> OpGraph:
        self._ring = set()
        self._ring_kv: dict[int, tuple[Layout, ...]] = {}
        self._ulysses = set()
        graph = super().run()
        if self._ring:
            graph = _ring_attention_costs(graph, self._ring, self.cp, self.registry)
        return graph

    def _dispatcher_attrs(self) -> dict[str, Any]:
        """A deduplicating dispatcher (``Parallel.ep_dispatcher``: DeepEP, HybridEP) prices
        its all-to-all by destination GPUs and nodes (``cost.collectives``, ``dedup``)."""
        if self.p.ep_dispatcher == "alltoall" or self.dims is None \
                or self.dims.experts < 1 or self.dims.top_k < 1:
            return {}
        return {"algorithm": "dedup", "dispatcher": self.p.ep_dispatcher,
                "routing": (self.dims.experts, self.dims.top_k)}

    def _expert_all_to_all(self, node: OpNode, *, before: bool) -> None:
        if self.ep_shared >= self.ep:
            return
        m = self._current_meta(node.inputs[0])
        lay = self.layout_of(m, node)
        out = self.new_tensor(m, Layout(lay.shape, lay.axes, lay.partial))
        self.insert(collective(self.new_node_id(), "all_to_all", "ep", self.p,
                               _nbytes(lay.shape, m.dtype), [m], [out], node,
                               moe=("combine" if op_base(node.op) == "moe_combine"
                                    else "dispatch_backward"),
                               sent_bytes=int(_nbytes(lay.shape, m.dtype)
                                              * (self.ep - 1) / self.ep),
                               **self._dispatcher_attrs()))
        self.replace[m.tensor_id] = out.tensor_id  # type: ignore[index]

    def _expert_all_to_all_after(self, node: OpNode, outs: list[Layout]) -> list[Layout]:
        if self.ep_shared >= self.ep:
            return outs
        t = node.outputs[0]
        lay = outs[0]
        self.state[t.tensor_id] = lay  # type: ignore[index]
        src = evolve(t, shape=lay.shape)
        out = self.new_tensor(t, Layout(lay.shape, lay.axes, lay.partial))
        self.insert(collective(self.new_node_id(), "all_to_all", "ep", self.p,
                               _nbytes(lay.shape, t.dtype), [src], [out], node,
                               moe=("dispatch" if op_base(node.op) == "moe_dispatch"
                                    else "combine_backward"),
                               sent_bytes=int(_nbytes(lay.shape, t.dtype)
                                              * (self.ep - 1) / self.ep),
                               **self._dispatcher_attrs()),
                    after=True)
        self.replace[t.tensor_id] = out.tensor_id  # type: ignore[index]
        return outs

    def _softmax_stats(self, node: OpNode) -> None:
        """Softmax over a vocabulary split across TP (vocab-parallel cross entropy): each
        rank reduces its slice, then an all-reduce of the per-row max and sum (fp32)."""
        m = self._current_meta(node.inputs[0])
        lay = self.layout_of(m, node)
        dim = int(node.attrs.get("dim", -1)) % max(len(lay.axes), 1)
        groups = lay.groups(dim) & {"tp"} if lay.axes else set()
        if not groups:
            return
        rows = 1
        for i, d in enumerate(lay.shape):
            if i != dim:
                rows *= d
        stats = TensorMeta(shape=(rows, 2), dtype="float32")
        self.insert(collective(self.new_node_id(), "all_reduce", "tp", self.p, rows * 2 * 4,
                               [stats], [stats], node, purpose="softmax_stats"))

    def _gradient_partial(self, node: OpNode, lay: Layout) -> Layout:
        """A weight gradient summed over tokens split by DP/CP is synchronised by the
        gradient reduction (the training transforms), not here."""
        if not lay.partial:
            return lay
        if any(t.param is not None for t in node.inputs):
            return lay  # an input gradient (dY·W): reduced here
        keep = frozenset(g for g in lay.partial if g not in ("cp",))
        return Layout(lay.shape, lay.axes, keep)


def sequence_axis(shape: Sequence[int], seq_len: int, batch: object = None) -> int | None:
    """The axis of ``shape`` that runs along a ``seq_len``-token sequence: the first of that
    size, past a leading batch axis of the same size (``[B, S]`` token ids, ``[S]``
    positions, ``[B, 1, S, S]`` masks: the query axis); None without one (or for one
    token, which nothing splits)."""
    if seq_len <= 1:
        return None
    axes = [i for i, d in enumerate(shape) if d == seq_len]
    if len(axes) > 1 and axes[0] == 0 and len(shape) >= 2 and shape[0] == batch:
        axes = axes[1:]
    return axes[0] if axes else None


def _covered(group: str, parallel: Parallel) -> set[str]:
    if group == "tp":
        covered = {"tp", "sp"}
        if parallel.ep * parallel.expert_tp <= parallel.tp:
            covered |= {"ep"}
        if parallel.expert_tp <= parallel.tp:
            covered |= {"etp"}
        return covered
    return {group}


def _token_axis(lay: Layout, degree: int = 1) -> int | None:
    """The axis a reduce-scatter splits: the sequence (Megatron splits ``s`` of
    ``[s, b, h]``; a captured ``[b, s, h]`` or ``[b·s, h]`` has it innermost), i.e. the
    innermost non-feature axis, not yet split, that the TP degree divides (the per-rank
    sizes match Megatron's)."""
    nd = len(lay.shape)
    for i in reversed(range(nd - 1)):
        if lay.shape[i] > 1 and not lay.axes[i] and lay.shape[i] % degree == 0:
            return i
    for i in range(nd - 1):
        if lay.shape[i] > 1 and not lay.axes[i]:
            return i
    for i in range(nd - 1):
        if lay.shape[i] > 1:
            return i
    return None


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return int(n * dtype_bytes(dtype))


def _is_conv1d(name: str, node: OpNode) -> bool:
    return node.module_class == "Conv1D"


def _cache_inputs(graph: OpGraph) -> dict[int, int]:
    """KV-cache tensors of a decode graph: inputs no node produces that a ``cat`` extends
    along its sequence axis, mapped to that axis."""
    produced = {t.tensor_id for n in graph.nodes for t in n.outputs if t.tensor_id is not None}
    out: dict[int, int] = {}
    for n in graph.nodes:
        if op_base(n.op) != "cat" or not n.outputs:
            continue
        nd = len(n.outputs[0].shape)
        dim = int(n.attrs.get("dim", 0)) % max(nd, 1)
        for t in n.inputs:
            if (t.tensor_id is not None and t.tensor_id not in produced and t.param is None
                    and len(t.shape) == nd and nd >= 3 and t.shape[dim] > 0):
                out[t.tensor_id] = dim
    return out


def cache_inputs(graph: OpGraph) -> dict[int, int]:
    """Public view of the KV-cache inputs of a graph: ``{tensor id: sequence axis}``."""
    return _cache_inputs(graph)


def _ring_attention_costs(graph: OpGraph, ids: set[int], cp: int,
                          registry: FormulaRegistry | None) -> OpGraph:
    """Ring attention: each rank does 1/cp of the whole attention (load-balanced causal
    chunks: the FLOPs of full-length queries over the whole sequence, divided by cp) and
    reads every KV block once as it passes (the node's inputs hold the whole KV)."""
    nodes = []
    for n in graph.nodes:
        if n.id not in ids:
            nodes.append(n)
            continue
        first = 1 if op_base(n.op) == "attention_backward" else 0
        q = n.inputs[first]
        full_q = evolve(q, shape=(*q.shape[:2], q.shape[2] * cp, *q.shape[3:]))
        ins = list(n.inputs)
        ins[first] = full_q
        if first:  # grad_out [b, s, h, d] and out too
            for i in (0, 4):
                if i < len(ins) and len(ins[i].shape) == 4:
                    t = ins[i]
                    ins[i] = evolve(t, shape=(t.shape[0], t.shape[1] * cp, *t.shape[2:]))
        flops, _, _, _ = reprice(n, tuple(ins), n.outputs, n.attrs, registry)
        nodes.append(evolve(n, flops=flops // cp, attrs={**n.attrs, "cp": cp,
                                                        "cp_kind": "ring"}))
    return graph.with_nodes(nodes, graph.edges)


class ParallelTransform:
    """TP (+SP), CP and EP of ``ctx.parallel`` applied to one graph.

    :param plan: the tensor-parallel plan (None: module-name rules).
    :param state: tensor layouts shared across the phases of one capture (prefill before
        decode, forward before backward), so a decode graph's KV cache and a backward
        graph's saved activations keep the layouts their producing phase gave them. Use
        :func:`apply_phases` to run several phases with one state.
    """

    name = "parallel"

    def __init__(self, plan: TPPlan | None = None, *,
                 state: dict[int, Layout] | None = None,
                 extra_seeds: ExtraSeeds | None = None,
                 extra_attrs: ExtraAttrs | None = None) -> None:
        self.plan = plan or TPPlan()
        self.state = state
        self.extra_seeds = extra_seeds
        self.extra_attrs = extra_attrs

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        extra = self.extra_seeds(graph) if self.extra_seeds is not None else None
        attrs = self.extra_attrs(graph) if self.extra_attrs is not None else None
        if p.tp == 1 and p.cp == 1 and p.ep == 1 and p.expert_tp == 1 and extra is None \
                and not attrs:
            return _with_layout_meta(graph, p, ctx.training)
        out = _ParallelPass(graph, p, ctx.dims, self.plan, ctx.host.formulas
                            if ctx.host is not None else None, training=ctx.training,
                            state=self.state, extra=extra, attrs=attrs).run()
        return _with_layout_meta(out, p, ctx.training)


#: Given a graph, a function of (tensor, reading node) giving ``{axis: (group, factor)}``
#: to apply to tensors no node produced, besides the parallel layout's own (a rescaled
#: batch or cache length, see :class:`zrt_core.estimate.serving.Rescale`); None for none.
ExtraSeeds = Callable[[OpGraph], Callable[[TensorMeta, OpNode],
                                          Mapping[int, tuple[str, Fraction]] | None] | None]
#: Given a graph, node attrs to move, ``{name: {captured value: new value}}`` (a rescaled
#: cache moves ``start_pos``); None for none.
ExtraAttrs = Callable[[OpGraph], Mapping[str, Mapping[Any, Any]] | None]


def _with_layout_meta(graph: OpGraph, p: Parallel, training: bool) -> OpGraph:
    meta = {**graph.meta, "parallel": p.to_json(),
            "sequence_parallel": p.sequence_parallel(training)}
    return replace_graph(graph, meta=meta)


class TensorParallel(ParallelTransform):
    """TP (and SP when the layout asks for it) alone: ``ctx.parallel`` with cp = ep = 1."""

    name = "tp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        only = evolve(ctx.parallel, cp=1, ep=1, dp=ctx.parallel.dp * ctx.parallel.cp)
        return super().apply(graph, evolve(ctx, parallel=only))


class SequenceParallel(ParallelTransform):
    """TP with sequence parallelism forced on (norms and residuals on seq/tp)."""

    name = "sp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        return super().apply(graph, evolve(ctx, parallel=evolve(ctx.parallel, sp=True)))


class ContextParallel(ParallelTransform):
    """CP alone (ring or Ulysses by ``ctx.parallel.cp_kind``)."""

    name = "cp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        only = evolve(p, tp=1, ep=1, etp=None, sp=False, dp=p.dp * p.tp)
        return super().apply(graph, evolve(ctx, parallel=only))


class ExpertParallel(ParallelTransform):
    """EP alone (experts split over ``ep`` ranks, expert TP ``etp``)."""

    name = "ep"


def apply_phases(graphs: Mapping[str, OpGraph], ctx: TransformContext,
                 plan: TPPlan | None = None) -> dict[str, OpGraph]:
    """Apply :class:`ParallelTransform` to several phases of one capture with shared
    layouts, in capture order (prefill, decode, train_forward, train_backward)."""
    state: dict[int, Layout] = {}
    out = {}
    transform = ParallelTransform(plan, state=state)
    order = sorted(graphs, key=lambda ph: Phase.ALL.index(ph) if ph in Phase.ALL else 99)
    for phase in order:
        out[phase] = transform.apply(graphs[phase], ctx)
    return {ph: out[ph] for ph in graphs}


# -- pipeline stages ---------------------------------------------------------------------


@frozen
class Stage:
    """One (virtual) pipeline stage: the layer indices it holds and whether it holds the
    embedding (first) and the head (last); ``rank`` is the pipeline rank running it."""

    index: int
    rank: int
    layers: tuple[int, ...] = field(converter=tuple)
    embedding: bool
    head: bool

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "rank": self.rank, "layers": [self.layers[0],
                self.layers[-1]] if self.layers else [], "embedding": self.embedding,
                "head": self.head}


@frozen
class PipelinePlan:
    """Contiguous layer ranges per virtual stage (``pp × vp`` of them, stage ``v`` on rank
    ``v mod pp``), embedding on the first, head on the last."""

    pp: int
    vp: int
    stages: tuple[Stage, ...] = field(converter=tuple)

    @classmethod
    def build(cls, num_layers: int, pp: int, vp: int = 1) -> PipelinePlan:
        n = pp * vp
        if num_layers % n:
            raise LayoutError(
                f"pp × vp = {pp} × {vp} = {n} does not divide the {num_layers} layers",
                "choose pp and vp so that layers split evenly into stages")
        per = num_layers // n
        stages = tuple(Stage(index=v, rank=v % pp, layers=tuple(range(v * per, (v + 1) * per)),
                             embedding=v == 0, head=v == n - 1) for v in range(n))
        return cls(pp=pp, vp=vp, stages=stages)

    def layer_counts(self, graph: OpGraph) -> list[dict[str, int]]:
        """Per stage, how many layers of each template kind it runs."""
        return [{t.kind: t.count_in(s.layers) for t in graph.templates.values()
                 if t.count_in(s.layers)} for s in self.stages]

    def to_json(self) -> dict[str, Any]:
        return {"pp": self.pp, "vp": self.vp, "stages": [s.to_json() for s in self.stages]}


class PipelineStages:
    """Records the stage plan in ``meta["pp_plan"]``; :func:`stage_graph` cuts a stage out
    with its boundary send/recv."""

    name = "pp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        layers = ctx.dims.layers if ctx.dims is not None else int(graph.meta.get(
            "num_layers", 0))
        plan = PipelinePlan.build(layers, p.pp, p.vp)
        return evolve(graph, meta={**graph.meta, "pp_plan": plan.to_json()})


def boundary_bytes(graph: OpGraph) -> int:
    """Bytes one rank sends at a stage boundary: the hidden states of its tokens as they
    leave a layer (B × S × H / cp, / tp with SP), read from the graph's per-rank shapes."""
    layer_nodes = [n for n in graph.nodes if n.layer_index is not None]
    if not layer_nodes:
        return 0
    first_layer = layer_nodes[0].layer_index
    produced_in_layer = {t.tensor_id for n in graph.nodes if n.layer_index == first_layer
                         for t in n.outputs}
    # the residual stream entering the first layer: an input of it produced outside
    for n in graph.nodes:
        if n.layer_index != first_layer:
            continue
        for t in n.inputs:
            if (t.tensor_id is not None and t.param is None and t.tensor_id not in
                    produced_in_layer and len(t.shape) >= 2 and t.dtype.startswith(
                        ("bfloat", "float"))):
                return t.nbytes
    return 0


def stage_graph(graph: OpGraph, plan: PipelinePlan, stage: int, parallel: Parallel
                ) -> OpGraph:
    """The part of ``graph`` one pipeline stage runs, with a ``send_recv`` receiving the
    hidden states first (not on the first stage) and one sending them last (not on the
    last stage). Templates keep only the stage's layers."""
    st = plan.stages[stage]
    wanted = set(st.layers)
    layer_positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
    first = layer_positions[0] if layer_positions else len(graph.nodes)
    last = layer_positions[-1] if layer_positions else -1
    backward = graph.phase == Phase.TRAIN_BACKWARD
    templates = []
    relabel: dict[int, int] = {}
    for rep, t in graph.templates.items():
        kept = tuple(i for i in t.indices if i in wanted)
        if kept:
            templates.append(evolve(t, representative=kept[0], indices=kept))
            relabel[rep] = kept[0]
    nodes = []
    for i, n in enumerate(graph.nodes):
        if n.layer_index is not None:
            if n.layer_index in relabel:
                nodes.append(evolve(n, layer_index=relabel[n.layer_index]))
            continue
        before = i < first
        after = i > last
        embedding_side = before if not backward else after
        head_side = after if not backward else before
        if (embedding_side and st.embedding) or (head_side and st.head) or \
                (not before and not after and relabel):
            nodes.append(n)
    nbytes = boundary_bytes(graph)
    next_id = max((n.id for n in graph.nodes), default=0) + 1
    like = nodes[0] if nodes else graph.nodes[0]
    hidden = TensorMeta(shape=(max(nbytes // 2, 1),), dtype="bfloat16")
    plain_like = evolve(like, layer_index=None, layer_kind=None, module_path="pipeline",
                        module_class="")
    recv_needed = (st.index > 0) if not backward else (st.index < len(plan.stages) - 1)
    send_needed = (st.index < len(plan.stages) - 1) if not backward else (st.index > 0)
    if recv_needed:
        nodes.insert(0, collective(next_id, "send_recv", "pp", parallel, nbytes, [hidden],
                                   [hidden], plain_like, direction="recv", stage=st.index))
        next_id += 1
    if send_needed:
        nodes.append(collective(next_id, "send_recv", "pp", parallel, nbytes, [hidden],
                                [hidden], plain_like, direction="send", stage=st.index))
    meta = {**graph.meta, "pp_stage": st.to_json()}
    return OpGraph(phase=graph.phase, nodes=nodes,
                   edges=[(a, b) for a, b in graph.edges if a in {n.id for n in nodes}
                          and b in {n.id for n in nodes}],
                   templates=templates, meta=meta)


class DataParallelReplicas:
    """Serving replicas: the graph is what one replica runs; ``meta["dp"]`` records how
    many run side by side (throughput multiplies, latency does not). Gradient
    synchronisation for training is the training transforms' (ZeRO, DP all-reduce)."""

    name = "dp"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        return replace_graph(graph, meta={**graph.meta, "dp": ctx.parallel.dp})
