"""List scheduling of a costed graph on one device's streams.

Every non-collective node runs on the ``compute`` stream; each collective runs on the
stream of its group (``comm.tp``, ``comm.ep``, ``comm.dp``...). Streams execute in issue
order (as CUDA streams do) and a node starts when its stream is free and its inputs are
ready. How a collective overlaps is decided by :class:`OverlapRules`, which mirror what
Megatron-LM, TransformerEngine, FSDP and serving engines actually do — written down in
``docs/overlap-rules.md``.

A layer template's nodes are scheduled once (:func:`schedule_region`) and its region is
placed once per layer it stands for (:func:`schedule_phase`), so scheduling cost does not
grow with depth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import groupby
from typing import TYPE_CHECKING

from attrs import field, frozen, validators

from zrt_core.errors import SpecError
from zrt_core.ir.graph import Category, OpGraph, OpNode, Phase
from zrt_core.schedule.timeline import (
    ASYNC,
    COMPUTE,
    DEFERRED,
    NEXT_STEP,
    PIPELINED,
    PREFETCH,
    PREFETCH_BEHIND,
    SYNC,
    Event,
    Region,
    Timeline,
    comm_stream,
)

if TYPE_CHECKING:
    from zrt_core.cost.backend import NodeCost

_fraction = validators.and_(validators.instance_of(float), validators.ge(0.0),
                            validators.le(1.0))

#: ``attrs["overlap"]`` values a transform may set on a collective to say how the framework
#: runs it (see docs/overlap-rules.md). The rule flags still apply: an "async" TP
#: collective under ``OverlapRules.serving()`` is synchronous.
OVERLAP_HINTS = ("none", "async", "producer", "consumer", "backward", "prefetch",
                 "next_step", "microbatch")

_DP_GROUPS = frozenset({"dp", "dp_cp", "edp"})
_TP_GROUPS = frozenset({"tp", "etp"})


@frozen
class CommPlan:
    """How one collective runs: a mode, and for PIPELINED the hidden fraction and whether it
    is chunked with its producer (a GEMM feeding a reduce-scatter) or its consumer (an
    all-gather feeding a GEMM)."""

    mode: str
    fraction: float = 0.0
    side: str = ""


@frozen
class OverlapRules:
    """Which communication overlaps with what; the defaults are Megatron-LM's training.

    :param tp_comm_overlap: fraction of each forward TP/SP collective hidden by chunking it
        with the adjacent GEMM (TransformerEngine userbuffers, ``--tp-comm-overlap``);
        0 leaves forward TP collectives blocking the compute stream.
    :param tp_backward_async: backward TP collectives run beside the weight-gradient GEMM
        (Megatron's async input-gradient all-reduce / reduce-scatter).
    :param cp_comm_overlap: ring attention's KV exchange runs under the attention blocks.
    :param ep_async: EP all-to-all runs on its own stream, so independent compute (shared
        experts) overlaps it (``--moe-shared-expert-overlap``); otherwise it blocks.
    :param ep_batch_overlap: the EP all-to-all of one micro-batch runs under the
        computation of another (Megatron-Core ``--overlap-moe-expert-parallel-comm``: the
        combined 1F1B schedule pairs micro-batch i+1's forward with micro-batch i's backward
        layer by layer, DualPipe's idea); applied per stage by the training estimate.
    :param overlap_grad_reduce: DP gradient reduce-scatter/all-reduce is bucketed and runs
        during the rest of backward; only what is left after the last bucket is exposed.
    :param overlap_param_gather: ZeRO-3/FSDP parameter all-gathers are prefetched one layer
        ahead; the distributed optimizer's post-step all-gather runs under the next step's
        forward (``--overlap-param-gather``).
    :param gather_behind_reduce: a prefetched parameter all-gather queues behind the
        gradient reductions issued before it (DeepSpeed's ZeRO-3 of early 2021, whose every
        all-gather first waited for the earlier communication: deepspeedai/DeepSpeed
        PR #1188); otherwise it is served in issue order, ahead of the previous layer's
        reduce-scatter (FSDP2, Megatron-FSDP; :meth:`Timeline.compose`).
    :param serial: every collective blocks the compute stream — serving engines (vLLM,
        SGLang, TensorRT-LLM) in prefill and decode; with ``ep_async`` the EP all-to-alls
        are the exception (``--moe-shared-expert-overlap`` in serving: the shared experts
        run on their own stream beside the routed path, docs/moe-training.md).
    """

    tp_comm_overlap: float = field(default=0.0, converter=float, validator=_fraction)
    tp_backward_async: bool = True
    cp_comm_overlap: bool = True
    ep_async: bool = False
    ep_batch_overlap: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    gather_behind_reduce: bool = False
    serial: bool = False

    @classmethod
    def megatron(cls, **changes: object) -> OverlapRules:
        """Megatron-LM training defaults (what ``OverlapRules()`` gives)."""
        return cls(**changes)  # type: ignore[arg-type]

    @classmethod
    def serving(cls, *, ep_async: bool = False) -> OverlapRules:
        """No overlap: every collective is on the critical path (prefill and decode); with
        ``ep_async`` the EP dispatch/combine run asynchronously, so the shared experts'
        independent kernels fill the compute stream under them."""
        return cls(tp_backward_async=False, cp_comm_overlap=False, overlap_grad_reduce=False,
                   overlap_param_gather=False, serial=True, ep_async=ep_async)

    @classmethod
    def for_phase(cls, phase: str) -> OverlapRules:
        """Serving rules for prefill/decode, Megatron training rules otherwise."""
        return cls.serving() if phase in (Phase.PREFILL, Phase.DECODE) else cls()

    def plan(self, node: OpNode) -> CommPlan:
        """The plan for one collective node (``category == "collective"``)."""
        group = _group(node)
        kind = node.attrs.get("collective") or node.op.removeprefix("comm.")
        hint = node.attrs.get("overlap")
        if hint is not None and hint not in OVERLAP_HINTS:
            raise SpecError(
                f"node {node.id} ({node.op}): attrs['overlap']={hint!r} is not a known hint",
                f"use one of {', '.join(OVERLAP_HINTS)}")
        if hint in ("none", "microbatch"):
            return CommPlan(SYNC)
        if self.serial:
            return CommPlan(ASYNC) if self.ep_async and group == "ep" else CommPlan(SYNC)
        phase = node.phase

        if hint == "async":
            return CommPlan(ASYNC)
        if hint in ("producer", "consumer"):
            fraction = 1.0 if group == "cp" else self.tp_comm_overlap
            return CommPlan(PIPELINED, fraction, hint) if fraction > 0 else CommPlan(SYNC)
        if hint == "backward":
            return CommPlan(DEFERRED) if self.overlap_grad_reduce else CommPlan(SYNC)
        if hint == "prefetch":
            if not self.overlap_param_gather:
                return CommPlan(SYNC)
            return CommPlan(PREFETCH_BEHIND if self.gather_behind_reduce else PREFETCH)
        if hint == "next_step":
            return CommPlan(NEXT_STEP) if self.overlap_param_gather else CommPlan(SYNC)

        if group in _TP_GROUPS:
            if phase == Phase.TRAIN_BACKWARD and self.tp_backward_async:
                return CommPlan(ASYNC)
            if self.tp_comm_overlap > 0 and kind in ("all_gather", "reduce_scatter",
                                                     "all_reduce"):
                side = "consumer" if kind == "all_gather" else "producer"
                return CommPlan(PIPELINED, self.tp_comm_overlap, side)
            return CommPlan(SYNC)
        if group == "cp":
            if self.cp_comm_overlap and kind in ("send_recv", "all_gather"):
                return CommPlan(PIPELINED, 1.0, "consumer")
            return CommPlan(SYNC)
        if group == "ep":
            return CommPlan(ASYNC) if self.ep_async else CommPlan(SYNC)
        if group in _DP_GROUPS:
            if kind == "all_gather":
                if not self.overlap_param_gather:
                    return CommPlan(SYNC)
                if phase == Phase.OPTIMIZER:
                    return CommPlan(NEXT_STEP)
                return CommPlan(PREFETCH_BEHIND if self.gather_behind_reduce else PREFETCH)
            if kind in ("reduce_scatter", "all_reduce") and phase == Phase.TRAIN_BACKWARD:
                return CommPlan(DEFERRED) if self.overlap_grad_reduce else CommPlan(SYNC)
            return CommPlan(SYNC)
        if group == "pp":
            return CommPlan(ASYNC)
        return CommPlan(SYNC)


def _group(node: OpNode) -> str:
    group = node.attrs.get("group")
    if not group:
        raise SpecError(f"collective node {node.id} ({node.op}) has no attrs['group']",
                        "parallel transforms must set the group (tp, cp, ep, dp, ...)")
    return str(group)


Costs = Mapping[int, "NodeCost"] | Callable[[OpNode], "NodeCost"]


def _cost_lookup(costs: Costs) -> Callable[[OpNode], NodeCost | None]:
    if callable(costs):
        return costs  # type: ignore[return-value]
    return lambda node: costs.get(node.id)


def _region_order(graph: OpGraph, nodes: list[OpNode]) -> tuple[list[OpNode],
                                                                 dict[int, list[int]]]:
    """Nodes in execution order and each node's predecessors inside the region.

    Graphs list nodes in execution order; if an edge runs backwards in that order, the
    nodes are re-sorted topologically (ties kept in listed order). A cycle is an error.
    """
    position = {n.id: i for i, n in enumerate(nodes)}
    preds: dict[int, list[int]] = {}
    backwards = False
    for a, b in graph.edges:
        pa, pb = position.get(a), position.get(b)
        if pa is None or pb is None or a == b:
            continue
        preds.setdefault(b, []).append(a)
        if pa > pb:
            backwards = True
    if not backwards:
        return nodes, preds
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(position)
    g.add_edges_from((a, b) for b, ps in preds.items() for a in ps)
    try:
        order = list(nx.lexicographical_topological_sort(g, key=position.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        raise SpecError(f"graph has a dependency cycle through nodes {cycle[:4]}",
                        "edges must run from producer to consumer") from None
    by_id = {n.id: n for n in nodes}
    return [by_id[i] for i in order], preds


def schedule_region(
    graph: OpGraph,
    costs: Costs,
    rules: OverlapRules | None = None,
    *,
    nodes: Iterable[OpNode] | Callable[[OpNode], bool] | None = None,
    name: str = "",
) -> Region:
    """List-schedule some of ``graph``'s nodes (default all) on compute and comm streams.

    Dependencies on nodes outside the region count as already satisfied.

    :param costs: a ``NodeCost`` per node id (or a function of the node). A node without a
        cost is an error unless it is ``zero_cost``.
    :param rules: overlap rules; default :meth:`OverlapRules.for_phase` of the graph.
    """
    rules = rules or OverlapRules.for_phase(graph.phase)
    if nodes is None:
        selected = list(graph.nodes)
    elif callable(nodes):
        selected = [n for n in graph.nodes if nodes(n)]
    else:
        selected = list(nodes)
    order, preds = _region_order(graph, selected)
    price = _cost_lookup(costs)

    end: dict[int, float] = {}
    durations: dict[int, float] = {}
    # For a PIPELINED collective chunked with its consumer: the time the consumer may
    # start before the collective ends (up to fraction × duration, at most the consumer).
    consumer_early: dict[int, float] = {}
    prefetched: set[int] = set()
    on_comm: set[int] = set()
    # Views and metadata ops run on no stream: their output is their input's storage. Each
    # maps to the nodes that really produced what it reads (views of views followed), and
    # its readers depend on those — so a collective chunked with a GEMM finds the GEMM
    # behind a reshape, and a view of an async collective's output holds nothing up.
    through: dict[int, tuple[int, ...]] = {}
    stream_free: dict[str, float] = {}
    compute_free = 0.0
    events: list[Event] = []
    for node in order:
        cost = price(node)
        if cost is None:
            if not node.zero_cost:
                raise SpecError(f"node {node.id} ({node.op}) has no cost",
                                "price the graph before scheduling it")
            duration = 0.0
            rule = backend = source = ""
        else:
            duration = float(cost.time_s)
            rule, backend, source = cost.rule, cost.backend, cost.source
        durations[node.id] = duration

        inputs = preds.get(node.id, ())
        if through and any(p in through for p in inputs):
            inputs = _real_inputs(inputs, through)
        if node.zero_cost and duration == 0.0 and node.category != Category.COLLECTIVE:
            through[node.id] = tuple(inputs)
            continue
        ready = 0.0
        for p in inputs:
            if p in prefetched:
                continue
            available = end[p] - min(consumer_early.get(p, 0.0), duration) \
                if p in consumer_early else end[p]
            if available > ready:
                ready = available

        if node.category != Category.COLLECTIVE:
            start = max(ready, compute_free)
            finish = start + duration
            compute_free = finish
            stream, mode = COMPUTE, ""
        else:
            plan = rules.plan(node)
            mode = plan.mode
            on_comm.add(node.id)
            stream = comm_stream(_group(node))
            free = stream_free.get(stream, 0.0)
            if mode in (PREFETCH, PREFETCH_BEHIND):
                # Issued during the previous region (Timeline.compose places it); here the
                # consumers do not wait for it.
                start = free
                prefetched.add(node.id)
            elif mode in (ASYNC, DEFERRED, NEXT_STEP):
                start = max(ready, free)
            elif mode == PIPELINED and plan.side == "producer":
                # Chunked with the GEMM that produces its input (the latest-ending compute
                # input): it may start up to fraction × duration before that GEMM ends,
                # never before it starts.
                producer = max((p for p in inputs if p not in on_comm), key=end.__getitem__,
                               default=None)
                early = 0.0
                if producer is not None:
                    early = min(plan.fraction * duration, durations[producer])
                start = max(ready - early, free, compute_free - early)
            else:  # SYNC, or PIPELINED with its consumer: issued in compute-stream order
                start = max(ready, free, compute_free)
            finish = start + duration
            stream_free[stream] = finish
            if mode == SYNC or (mode == PIPELINED and plan.side == "producer"):
                compute_free = max(compute_free, finish)
            elif mode == PIPELINED:
                early = plan.fraction * duration
                consumer_early[node.id] = early
                compute_free = max(compute_free, finish - early)
        end[node.id] = finish
        if duration > 0:
            events.append(Event(
                name=node.op, node_id=node.id, stream=stream, start_s=start, end_s=finish,
                category=node.category, layer_index=node.layer_index, phase=node.phase,
                mode=mode, args=_NodeArgs(node, (rule, backend, source))))
    return Region.from_events(name or graph.phase, events)


def _real_inputs(preds: Iterable[int], through: Mapping[int, tuple[int, ...]]
                 ) -> tuple[int, ...]:
    """``preds`` with every view replaced by the nodes it resolves to, each once."""
    out: list[int] = []
    for p in preds:
        for q in through.get(p, (p,)):
            if q not in out:
                out.append(q)
    return tuple(out)


class _NodeArgs(Mapping[str, object]):
    """What a trace shows beside a node's event, built when first read: op, category,
    FLOPs, bytes, collective group and size, module, and the cost rule that priced it."""

    __slots__ = ("_items", "_node", "_price")

    def __init__(self, node: OpNode, price: tuple[str, str, str]) -> None:
        self._node = node
        self._price = price
        self._items: dict[str, object] | None = None

    def _build(self) -> dict[str, object]:
        if self._items is None:
            node, (rule, backend, source) = self._node, self._price
            args: dict[str, object] = {"op": node.op, "category": node.category}
            if node.flops:
                args["flops"] = node.flops
            if node.bytes:
                args["bytes"] = node.bytes
            if node.category == Category.COLLECTIVE:
                args["group"] = node.attrs.get("group")
                args["comm_bytes"] = node.attrs.get("bytes")
            if node.module_path:
                args["module"] = node.module_path
            if rule:
                args["rule"] = f"{backend}:{rule}" if backend else rule
                args["source"] = source
            self._items = args
        return self._items

    def __getitem__(self, key: str) -> object:
        return self._build()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())


# -- whole phases ---------------------------------------------------------------------------


@frozen
class _Segment:
    """A run of nodes: a layer template's (every run of its nodes joined), or outer nodes
    (``representative`` None) in one consecutive run."""

    representative: int | None
    node_ids: tuple[int, ...]


def _segments(graph: OpGraph) -> list[_Segment]:
    runs = [(key, tuple(n.id for n in group))
            for key, group in groupby(graph.nodes, key=lambda n: n.layer_index)]
    joined: dict[int, list[int]] = {}
    for key, ids in runs:
        if key is not None:
            joined.setdefault(key, []).extend(ids)
    out: list[_Segment] = []
    for key, ids in runs:
        if key is None:
            out.append(_Segment(None, ids))
        elif key in joined:
            out.append(_Segment(key, tuple(joined.pop(key))))
    return out


def schedule_phase(
    graph: OpGraph,
    costs: Costs,
    rules: OverlapRules | None = None,
    *,
    layers: Iterable[int] | None = None,
    embedding_side: bool = True,
    head_side: bool = True,
    regions: dict[tuple[int | None, int], Region] | None = None,
) -> Timeline:
    """The timeline of a whole phase graph (or one pipeline stage of it).

    Each layer template is scheduled once and placed once per layer it stands for, in layer
    order (reversed for ``train_backward``). Nodes outside the layers go where they run:
    in execution order, those before the first layer node and those after the last; nodes
    between layers follow the layer they come after.

    :param layers: only these layer indices (a pipeline stage); default every layer.
    :param embedding_side: include the outer nodes on the embedding side (before the
        layers in forward, after them in backward) — the first stage has them.
    :param head_side: include the outer nodes on the head side (final norm, head, loss) —
        the last stage has them.
    :param regions: the scheduled regions (one per layer template and outer segment),
        kept by the caller across calls for this same ``graph``, ``costs`` and ``rules``
        (the stages of one phase): each region is scheduled once.
    """
    rules = rules or OverlapRules.for_phase(graph.phase)
    by_id = graph.by_id()
    segments = _segments(graph)
    wanted = None if layers is None else set(layers)
    backward = graph.phase == Phase.TRAIN_BACKWARD
    layer_positions = [i for i, s in enumerate(segments) if s.representative is not None]
    first_layer = layer_positions[0] if layer_positions else len(segments)
    last_layer = layer_positions[-1] if layer_positions else -1

    if regions is None:
        regions = {}

    def region_of(seg: _Segment) -> Region:
        key = (seg.representative, seg.node_ids[0])
        if key not in regions:
            label = (f"{graph.phase}/layer{seg.representative}" if seg.representative is not None
                     else f"{graph.phase}/outer{seg.node_ids[0]}")
            regions[key] = schedule_region(graph, costs, rules,
                                           nodes=[by_id[i] for i in seg.node_ids], name=label)
        return regions[key]

    # Which template each layer index runs, and the outer segments that follow a layer.
    template_of: dict[int, _Segment] = {}
    after_layer: dict[int, list[_Segment]] = {}
    leading: list[_Segment] = []
    trailing: list[_Segment] = []
    last_rep: int | None = None
    for pos, seg in enumerate(segments):
        if seg.representative is not None:
            template = graph.templates.get(seg.representative)
            indices = template.indices if template is not None else (seg.representative,)
            for i in indices:
                template_of[i] = seg
            last_rep = seg.representative
        elif pos < first_layer:
            leading.append(seg)
        elif pos > last_layer:
            trailing.append(seg)
        else:
            after_layer.setdefault(last_rep, []).append(seg)  # type: ignore[arg-type]

    embedding_segments, head_segments = (trailing, leading) if backward else (leading, trailing)
    parts: list[tuple[Region, int | None]] = []
    before = head_segments if backward else embedding_segments
    after = embedding_segments if backward else head_segments
    include_before = head_side if backward else embedding_side
    include_after = embedding_side if backward else head_side
    if include_before:
        parts.extend((region_of(s), None) for s in before)
    for index in sorted(template_of, reverse=backward):
        if wanted is not None and index not in wanted:
            continue
        seg = template_of[index]
        parts.append((region_of(seg), index))
        rep = seg.representative
        if rep is not None and template_of.get(rep) is seg:
            # outer nodes that sit between layers follow each layer of that template
            parts.extend((region_of(s), None) for s in after_layer.get(rep, ()))
    if include_after:
        parts.extend((region_of(s), None) for s in after)
    if not parts:
        raise SpecError(f"nothing to schedule in the {graph.phase} graph for layers "
                        f"{sorted(wanted) if wanted is not None else 'all'}",
                        "check the stage's layer range against the model's layers")
    return Timeline.compose(parts)


def is_weight_grad(node: OpNode) -> bool:
    """Whether a backward node computes a parameter's gradient (a zero-bubble W pass).

    The capture and analytic front-ends mark such nodes ``attrs["grad"] == "weight"``;
    without the mark, a backward matmul that writes a tensor naming a parameter counts.
    """
    mark = node.attrs.get("grad")
    if mark is not None:
        return mark == "weight"
    return (node.phase == Phase.TRAIN_BACKWARD and node.category == Category.MATMUL
            and any(t.param for t in node.outputs))


def weight_grad_s(graph: OpGraph, costs: Costs, *, layers: Iterable[int] | None = None
                  ) -> float:
    """Total time of the weight-gradient nodes of a backward graph, every layer counted
    (or only ``layers``): the W that zero-bubble schedules move off the critical path."""
    price = _cost_lookup(costs)
    wanted = None if layers is None else set(layers)
    total = 0.0
    for node in graph.nodes:
        if not is_weight_grad(node):
            continue
        if node.layer_index is None:
            count = 1 if wanted is None else 0
        else:
            template = graph.templates.get(node.layer_index)
            indices = template.indices if template is not None else (node.layer_index,)
            count = len(indices) if wanted is None else sum(1 for i in indices if i in wanted)
        cost = price(node)
        if count and cost is not None:
            total += count * cost.time_s
    return total
