"""The parallel pass: seeds from the weights (TP plan, EP experts, CP sequence), propagation,
and the collectives TP, SP, CP and EP need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    dtype_bytes,
)
from zrt_core.transforms.parallel._ops.matrix_ops import _matmul_operands
from zrt_core.transforms.parallel.engine import ShapePass, reprice, scaled_layout
from zrt_core.transforms.parallel.expert_load import expert_share, rank_load_factor
from zrt_core.transforms.parallel.layout import Layout, _layout, _scaled, _without
from zrt_core.transforms.parallel.op_families import (
    _MATMUL,
    _PARTIAL_SAFE,
    _REDUCE,
    _SHAPE_ONLY,
    _SOFTMAX,
    op_base,
)
from zrt_core.transforms.parallel.tp_plan import _KV_PROJ, COLWISE, ROWWISE, VOCAB, TPPlan

if TYPE_CHECKING:
    from zrt_core.formulas.registry import FormulaRegistry
    from zrt_core.modelinfo import ModelDims
    from zrt_core.strategy import Parallel


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
                 attrs: Mapping[str, Mapping[Any, Any]] | None = None,
                 roots: dict[int, int] | None = None) -> None:
        super().__init__(graph, registry, state=state, attrs=attrs)
        self.extra = extra
        #: each gathered tensor's view root, shared across the phases of one capture: a
        #: backward graph's saved activations have no producer there, and the views of one
        #: forward tensor (q, k and v of one normed input) share one re-gather
        self.roots: dict[int, int] = {} if roots is None else roots
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
        self.moe_load = p.moe_load
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
            factors[0] = ("ep", expert_share(self.experts, self.ep, self.moe_load))
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
            if self.ep_shared >= self.ep:  # no all-to-all: the busiest rank's rows here
                rows = _scaled(node.outputs[0].shape[0], (("ep", f),))
                f *= rank_load_factor(self.moe_load, self.experts, self.ep, rows * self.ep)
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
        """The tensor a chain of zero-cost single-input views starts from; for a tensor an
        earlier phase produced (a saved activation in a backward graph), the root it had
        there."""
        start, seen = tensor_id, 0
        while tensor_id is not None and seen < 16:
            producer = self.producer(tensor_id)
            if producer is None:
                tensor_id = self.roots.get(tensor_id, tensor_id)
                break
            if not producer.zero_cost or len(
                    [t for t in producer.inputs if t.tensor_id is not None]) != 1:
                break
            tensor_id = producer.inputs[0].tensor_id
            seen += 1
        if start is not None and tensor_id is not None:
            self.roots.setdefault(start, tensor_id)
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
        if op_base(node.op) == "moe_dispatch" and lay.shape:
            # the busiest EP rank receives more than the rows it sends (docs/moe-training.md)
            load = rank_load_factor(self.moe_load, self.experts, self.ep,
                                    lay.shape[0] * self.ep)
            if load != 1:
                axes = (lay.axes[0] + (("ep", load),), *lay.axes[1:])
                lay = _layout(t.shape, axes, lay.partial)
                outs = [lay, *outs[1:]]
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
