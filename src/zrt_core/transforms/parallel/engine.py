"""The propagation engine: one pass over a graph that carries each tensor's layout through its
nodes by their rules, re-prices every node on its per-rank shapes, and inserts collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import frozen

from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    _frozen_mapping,
)
from zrt_core.transforms.parallel._ops.registry import rule_for
from zrt_core.transforms.parallel.layout import Factors, Layout, _layout, _merge_factors
from zrt_core.transforms.parallel.op_families import _VIEW_LIKE, op_base

if TYPE_CHECKING:
    from zrt_core.formulas.registry import FormulaRegistry


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
                ins = self._unify_carried_state(metas_in, ins, 0, 1, 3, {0: 0, 1: 1, 2: 2})
            elif op_base(node.op) in ("gated_delta_chunk", "gated_delta_recurrent"):
                ins = self._unify_carried_state(metas_in, ins, 5, 2, 4, {0: 0, 1: 2})
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

    def _unify_carried_state(self, metas: list[TensorMeta], ins: list[Layout], state: int,
                             source: int, source_ndim: int,
                             axes_from: Mapping[int, int]) -> list[Layout]:
        """A recurrent state ``[b, h, ...]`` (input ``state``, 4-D) carried in from an
        earlier phase (no node of this graph made it) holds what its rank's input
        ``source`` (``source_ndim``-D) holds on the axes ``axes_from`` maps (state axis →
        source axis): the Mamba-2 decode step's ``state [b, h, p, n]`` takes ``x [b, h, p]``'s
        first three, a Gated DeltaNet's ``initial_state [b, h_v, d_k, d_v]`` takes ``v [b, s,
        h_v, d_v]``'s batch and heads."""
        if len(metas) <= max(state, source) or len(metas[state].shape) != 4 or \
                len(metas[source].shape) != source_ndim:
            return ins
        m, lay = metas[state], ins[state]
        if m.tensor_id is None or m.tensor_id in self._slot_of:
            return ins
        src = ins[source]
        axes = [_merge_factors(lay.axes[i], src.axes[axes_from[i]]) if i in axes_from
                else lay.axes[i] for i in range(4)]
        if tuple(axes) == lay.axes:
            return ins
        merged = _layout(m.shape, axes, lay.partial)
        self.state[m.tensor_id] = merged
        return [*ins[:state], merged, *ins[state + 1:]]

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
