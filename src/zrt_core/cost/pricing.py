"""Price a whole graph: per-node costs, the serial total, breakdowns and price coverage.

Backends come from the ``zrt_cost_backends`` hook; each node goes to them in descending
priority and the first :class:`NodeCost` wins (the roofline, lowest, prices the rest).
Identical nodes are priced once: the cache key (:func:`node_price_key`) is the op,
category, phase, FLOPs, bytes read and written, ``zero_cost``, the number of inputs and the
first one's dtype, the output shapes, and the attrs other than the identity ones in
:data:`IDENTITY_ATTRS`. A backend must price from what that key pins down (shapes of the
inputs follow from it for every op zrt knows; module paths, tensor ids and parameter names
are never part of a price).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.cost.backend import CostBackend, NodeCost, PriceSource
from zrt_core.cost.errors import CostError

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.ir.graph import OpGraph, OpNode
    from zrt_core.plugins import PluginHost

#: Node attrs that identify a node rather than describe its work; not part of the cache key.
IDENTITY_ATTRS = frozenset({"seq_nr", "fwd_seq_nr", "overlap", "stream", "name"})
#: ``time_by_layer_kind`` key of nodes outside decoder layers (embedding, head, loss...).
OUTSIDE_LAYERS = "outside_layers"


def _read_only(value: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(value))


@frozen
class Coverage:
    """Where the predicted numbers came from, as fractions by :class:`PriceSource`.

    :param ops: share of executed ops (each node counted ``multiplicity`` times).
    :param time: share of the serial predicted time.
    """

    ops: Mapping[str, float] = field(converter=_read_only)
    time: Mapping[str, float] = field(converter=_read_only)


@frozen
class CostedGraph:
    """A graph with a price on every node, for one hardware.

    :param costs: node id → the cost of one execution of that node on one device.
    :param total_time_s: Σ time × multiplicity: every node run back to back (no overlap;
        the scheduler decides what overlaps).
    :param time_by_category: the same sum split by node category.
    :param time_by_layer_kind: split by layer template kind; nodes outside decoder layers
        under :data:`OUTSIDE_LAYERS`.
    :param time_by_backend: split by the backend that priced each node.
    """

    graph: OpGraph
    hardware_id: str
    costs: Mapping[int, NodeCost] = field(converter=_read_only)
    total_time_s: float
    time_by_category: Mapping[str, float] = field(converter=_read_only)
    time_by_layer_kind: Mapping[str, float] = field(converter=_read_only)
    time_by_backend: Mapping[str, float] = field(converter=_read_only)
    coverage: Coverage
    backends: tuple[str, ...] = ()

    def cost(self, node: OpNode | int) -> NodeCost:
        """The cost of one execution of a node (or node id)."""
        return self.costs[node if isinstance(node, int) else node.id]


def build_backends(hardware: HardwareSpec, host: PluginHost) -> list[CostBackend]:
    """Every contributed backend that serves ``hardware``, highest priority first."""
    specs = sorted(host.cost_backends, key=lambda s: -s.priority)
    built = []
    for spec in specs:
        backend = spec.factory(hardware, host)
        if backend is not None:
            built.append(backend)
    return built


def node_price_key(node: OpNode) -> tuple[Any, ...]:
    """What a price may depend on (module docstring); equal keys share one price.

    The input tensors enter through their total bytes and the first one's dtype, the output
    tensors through their shapes: with the op, its FLOPs and its attrs that pins the
    problem (a GEMM's k is its FLOPs over 2mn) at half the cost of every input shape.
    """
    attrs = node.attrs
    ins = node.inputs
    return (node.op, node.category, node.phase, node.flops, node.bytes_read,
            node.bytes_written, node.zero_cost, len(ins), ins[0].dtype if ins else None,
            tuple([t.shape for t in node.outputs]),
            tuple([kv for kv in attrs.items() if kv[0] not in IDENTITY_ATTRS]) if attrs else ())


def _price_one(node: OpNode, backends: Sequence[CostBackend]) -> NodeCost:
    for backend in backends:
        cost = backend.price(node)
        if cost is not None:
            return cost
    raise CostError(f"no cost backend priced node {node.id} ({node.op})",
                    "include the roofline backend, which prices every node")


def price_nodes(nodes: Iterable[OpNode], backends: Sequence[CostBackend]
                ) -> dict[int, NodeCost]:
    """Price each node with the first backend (in the given order) that covers it."""
    cache: dict[Any, NodeCost] = {}
    out: dict[int, NodeCost] = {}
    for node in nodes:
        out[node.id] = _cached_price(node, backends, cache)
    return out


def _cached_price(node: OpNode, backends: Sequence[CostBackend], cache: dict[Any, NodeCost]
                  ) -> NodeCost:
    key = node_price_key(node)
    try:
        cost = cache.get(key)
    except TypeError:  # an attr value that does not hash (a nested mapping): by its repr
        key = repr(key)
        cost = cache.get(key)
    if cost is None:
        # a single backend that caches by this key itself (the search's and serving's
        # shared price cache) takes the key instead of computing it again
        keyed = getattr(backends[0], "price_keyed", None) if len(backends) == 1 else None
        cost = keyed(node, key) if keyed is not None else None
        if cost is None:
            cost = _price_one(node, backends)
        cache[key] = cost
    return cost


def price_graph(graph: OpGraph, hardware: HardwareSpec, host: PluginHost | None, *,
                backends: Sequence[CostBackend] | None = None) -> CostedGraph:
    """Price every node of ``graph`` on ``hardware``.

    :param host: the plugin host whose ``zrt_cost_backends`` build the backends.
    :param backends: already built backends, asked in the given order (overrides ``host``).
    :raises CostError: no backend priced some node, or a collective lacks its attrs.
    """
    if backends is None:
        if host is None:
            raise CostError("price_graph needs a plugin host or a list of backends",
                            "pass zrt_core.plugins.get_plugin_manager()")
        backends = build_backends(hardware, host)
    # layer index -> (multiplicity, kind), looked up once per node
    layers = {i: (t.count, t.kind) for i, t in graph.templates.items()}
    cache: dict[Any, NodeCost] = {}
    costs: dict[int, NodeCost] = {}
    # (category, layer kind, backend, source) -> [time, executed ops]: one update per node
    sums: dict[tuple[str, str, str, str], list[float]] = {}
    identity = IDENTITY_ATTRS
    for node in graph.nodes:
        # node_price_key, inlined: this loop is the hot path of a 30k-node graph
        attrs = node.attrs
        ins = node.inputs
        key = (node.op, node.category, node.phase, node.flops, node.bytes_read,
               node.bytes_written, node.zero_cost, len(ins), ins[0].dtype if ins else None,
               tuple([t.shape for t in node.outputs]),
               tuple([kv for kv in attrs.items() if kv[0] not in identity]) if attrs else ())
        try:
            cost = cache.get(key)
        except TypeError:  # an attr value that does not hash (a nested mapping): by its repr
            key = repr(key)
            cost = cache.get(key)
        if cost is None:
            cost = cache[key] = _price_one(node, backends)
        costs[node.id] = cost
        index = node.layer_index
        if index is None:
            m, kind = 1, OUTSIDE_LAYERS
        else:
            m, kind = layers.get(index, (1, "layer"))
            kind = node.layer_kind or kind
        group = (node.category, kind, cost.backend, cost.source)
        acc = sums.get(group)
        if acc is None:
            sums[group] = [cost.time_s * m, m]
        else:
            acc[0] += cost.time_s * m
            acc[1] += m

    total = 0.0
    ops = 0
    by_category: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    by_backend: dict[str, float] = {}
    ops_by_source: dict[str, float] = dict.fromkeys(PriceSource.ALL, 0)
    time_by_source = dict.fromkeys(PriceSource.ALL, 0.0)
    for (category, kind, backend, source), (t, m) in sums.items():
        total += t
        ops += m
        by_category[category] = by_category.get(category, 0.0) + t
        by_kind[kind] = by_kind.get(kind, 0.0) + t
        by_backend[backend] = by_backend.get(backend, 0.0) + t
        ops_by_source[source] = ops_by_source.get(source, 0) + m
        time_by_source[source] = time_by_source.get(source, 0.0) + t
    coverage = Coverage(
        ops={s: (n / ops if ops else 0.0) for s, n in ops_by_source.items()},
        time={s: (t / total if total else 0.0) for s, t in time_by_source.items()},
    )
    return CostedGraph(graph=graph, hardware_id=hardware.id, costs=costs, total_time_s=total,
                       time_by_category=by_category, time_by_layer_kind=by_kind,
                       time_by_backend=by_backend, coverage=coverage,
                       backends=tuple(b.name for b in backends))
