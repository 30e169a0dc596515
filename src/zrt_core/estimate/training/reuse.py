"""Per-layer work shared by the layouts of one search: ``estimate_training(..., reuse=r)``
takes its layer graphs, node prices and FLOP check from ``r`` when another layout made them.

Layouts that agree on tp, cp, ep, expert tp, sequence parallelism, micro-batch, recompute,
precision and the recipe's kernels run the same per-rank layer graphs: the parallel
transforms (TP/SP/CP/EP), the fusion rules, the precision recipe and recompute read
nothing else (``pp``, ``vp``, ``dp``, the schedule and ZeRO enter later: the stage split,
the ZeRO gathers, the gradient sync, the pipeline and the optimizer). A
:class:`TrainingReuse` keeps those graphs per such group and prices each distinct node once
per hardware; the rest of the estimate (gathers, gradient sync, stage schedules, pipeline,
optimizer, memory) runs per layout as before. Every entry is keyed on all the inputs of the
work it saves and holds the objects its key names by identity, so an estimate with reuse is
the same computation as one without: equal results, bit for bit (``tests/search/
test_reuse.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import define, field

#: Transformed graphs kept per layout family (``transform`` entries: also keyed on pp, dp
#: and the sharding); a search visits its candidates group by group, so a few dozen
#: suffice and memory stays bounded.
GROUPS_KEPT = 48
#: Per-layer graphs kept (the ``sharded`` and ``layer`` entries, keyed on the layer group
#: alone: the costliest to make). Kept apart from the per-layout entries, which outnumber
#: them and would evict them when a search comes back to a group (the two-tier search's
#: rounds do); Llama-3-70B on 1,024 H100 has 44 sharded and 132 layer groups.
LAYER_GROUPS_KEPT = 256
#: Priced graphs kept (graph → node costs).
PRICED_KEPT = 64


def _lru_get(store: dict[Any, Any], key: Any) -> Any:
    """``store[key]`` moved to the end (the most recently used), or None."""
    hit = store.pop(key, None)
    if hit is not None:
        store[key] = hit
    return hit


def _lru_put(store: dict[Any, Any], key: Any, value: Any, kept: int) -> Any:
    """Store ``value``, dropping the least recently used entries beyond ``kept``."""
    while len(store) >= kept:
        store.pop(next(iter(store)))
    store[key] = value
    return value


@define
class TrainingReuse:
    """What the training estimates of one search share (one per process; not thread-safe).

    ``shared(captured, key, notes, make)``: a group's graphs, made by ``make`` the first
    time.
    ``backends(hw, host)``: the hardware's backends behind one price cache. ``of_graphs(fwd,
    bwd, key, make)``: what a pair of graphs gives (saved activations, stage schedules). ``costs(graph,
    backends)``: a graph's node costs, priced once. ``flops_checked(captured, host)``:
    whether the capture's FLOPs were checked against the analytic count already.
    """

    groups: dict[Any, tuple[Any, Any, tuple[str, ...]]] = field(factory=dict)
    layer_groups: dict[Any, tuple[Any, Any, tuple[str, ...]]] = field(factory=dict)
    priced: dict[Any, tuple[Any, Any, dict[int, Any]]] = field(factory=dict)
    _backends: dict[Any, tuple[Any, Any, list[Any]]] = field(factory=dict)
    _checked: dict[tuple[int, int], tuple[Any, Any]] = field(factory=dict)
    _of_graphs: dict[Any, tuple[Any, Any, Any]] = field(factory=dict)
    _values: dict[Any, Any] = field(factory=dict)
    hits: int = 0
    misses: int = 0

    def shared(self, captured: Any, key: Any, notes: list[str],
               make: Callable[[list[str]], Any]) -> Any:
        """The value ``make(notes)`` gives for ``key`` of ``captured`` (held by identity: a
        capture does not hash), made once; the notes it appended are appended again on
        every reuse."""
        full = (id(captured), key)
        # estimator._transform's and _layer_graphs' layer-group keys
        per_layer = key[0] in ("sharded", "recipe", "layer")
        store = self.layer_groups if per_layer else self.groups
        hit = _lru_get(store, full)
        if hit is None or hit[0] is not captured:
            self.misses += 1
            made: list[str] = []
            value = make(made)
            hit = _lru_put(store, full, (captured, value, tuple(made)),
                           LAYER_GROUPS_KEPT if per_layer else GROUPS_KEPT)
        else:
            self.hits += 1
        notes.extend(hit[2])
        return hit[1]

    def backends(self, hw: Any, host: Any) -> list[Any]:
        """One backend list per (hardware spec, plugin host) behind the serving estimator's
        price cache (key: ``node_price_key``, never node ids; the first backend that prices
        a node gives its price, as ``price_nodes`` asks)."""
        from zrt_core.cost.pricing import build_backends
        from zrt_core.estimate.inference import _CachedBackends

        key = (id(hw), id(host))
        hit = self._backends.get(key)
        if hit is None or hit[0] is not hw or hit[1] is not host:
            hit = (hw, host, [_CachedBackends(hw, build_backends(hw, host))])
            self._backends[key] = hit
        return hit[2]

    def costs(self, graph: Any, backends: Sequence[Any]) -> dict[int, Any]:
        """``price_nodes(graph.nodes, backends)``, once per graph object (held, so its id
        cannot be taken by another graph while the entry lives)."""
        from zrt_core.cost.pricing import price_nodes

        key = (id(graph), id(backends))
        hit = _lru_get(self.priced, key)
        if hit is None or hit[0] is not graph or hit[1] is not backends:
            hit = _lru_put(self.priced, key, (graph, backends, price_nodes(graph.nodes,
                                                                           backends)),
                           PRICED_KEPT)
        return hit[2]

    def of_graphs(self, fwd: Any, bwd: Any, key: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per (forward graph, backward graph, ``key``), the graphs held by
        identity: what depends on nothing but them and ``key`` (saved activations, a
        stage-schedule memo)."""
        full = (id(fwd), id(bwd), key)
        hit = _lru_get(self._of_graphs, full)
        if hit is None or hit[0] is not fwd or hit[1] is not bwd:
            hit = _lru_put(self._of_graphs, full, (fwd, bwd, make()), PRICED_KEPT)
        return hit[2]

    def value(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()`` once per hashable ``key`` that names all its inputs (values, not
        objects held by identity)."""
        hit = _lru_get(self._values, key)
        if hit is None:
            hit = _lru_put(self._values, key, (make(),), PRICED_KEPT)
        return hit[0]

    def launch_tables(self, model: Any, fwd: Any, bwd: Any, costs: Any, hw: Any) -> Any:
        """:func:`zrt_core.estimate.host.launch_tables` of a stage pair, once per graphs,
        host model and hardware (``costs``: the pair's ``reuse.costs``, keyed by ``"fwd"``
        and ``"bwd"``)."""
        from zrt_core.estimate.host import launch_tables

        return self.of_graphs(fwd, bwd, ("host", model, hw), lambda: launch_tables(
            model, fwd, bwd, costs["fwd"], costs["bwd"]))

    def latest_graphs(self) -> tuple[Any, Any, Any] | None:
        """(forward graph, backward graph, parameter inventory) of the group the last
        estimate used (its transformed graphs are the most recently used entry): the
        search's screen reads a group's layer templates, host launches and per-device
        parameters from them. None before any."""
        for _, value, _ in reversed(self.groups.values()):
            if isinstance(value, tuple) and len(value) == 6:
                return value[0], value[1], value[3]
            return None
        return None

    def flops_checked(self, captured: Any, host: Any) -> bool:
        hit = self._checked.get((id(captured), id(host)))
        return hit is not None and hit[0] is captured and hit[1] is host

    def mark_flops_checked(self, captured: Any, host: Any) -> None:
        self._checked[(id(captured), id(host))] = (captured, host)
