"""Memory per device for serving: weights, KV cache per token, activations, and what is left
for the cache — read from the per-rank graphs, so TP/EP/PP sharding and quantisation are
already in the numbers.

- Weights: every parameter tensor the phase graphs read, once, at its per-rank shape and
  dtype (block scales of quantised formats included), times the layers its template stands
  for.
- KV cache per token: the cache tensors a decode graph carries in from prefill, at their
  per-rank shape and dtype, divided by the cached tokens (caches capped by a sliding window
  count per sequence instead).
- Activations: the peak of live intermediate tensors while one forward runs (tensors freed
  after their last reader), as the engine's warm-up profiling reserves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from attrs import frozen

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.parallel import cache_inputs
from zrt_core.transforms.quant import weight_bytes

GIB = 1024**3


def weights_bytes(graphs: Iterable[OpGraph], layers: set[int] | None = None) -> int:
    """Bytes of the parameters the graphs read, per device (each parameter once).

    :param layers: count only these layer indices (a pipeline stage) plus, when None is
        not excluded, the parameters outside layers read by the graphs given.
    """
    seen: dict[str, int] = {}
    for g in graphs:
        for n in g.nodes:
            for t in n.inputs:
                name = t.param
                if name is None or name in seen:
                    continue
                count = _count(g, n.layer_index, layers)
                seen[name] = weight_bytes(t) * count
    return sum(seen.values())


def _count(graph: OpGraph, layer_index: int | None, layers: set[int] | None) -> int:
    if layer_index is None:
        return 1
    t = graph.templates.get(layer_index)
    if t is None:
        return 1 if layers is None or layer_index in layers else 0
    return t.count if layers is None else t.count_in(sorted(layers))


@frozen
class KVCacheSize:
    """KV-cache bytes per device: ``per_token`` for every cached token of a sequence, and
    ``per_sequence_fixed`` for caches a sliding window caps."""

    per_token: float
    per_sequence_fixed: float = 0.0
    window: int = 0

    def for_sequence(self, tokens: int) -> float:
        return self.per_token * tokens + self.per_sequence_fixed


def kv_cache_size(decode: OpGraph, layers: set[int] | None = None, *,
                  caches: Mapping[int, int] | None = None) -> KVCacheSize:
    """KV bytes per cached token per device, from a (transformed) decode graph.

    :param caches: ``{tensor id: sequence axis}`` of the cache tensors, found on the
        captured graph (:func:`cache_inputs`) when fusion has since folded the cache
        updates into the attention kernels; default: found on ``decode`` itself.
    """
    if caches is None:
        caches = cache_inputs(decode)
    if not caches:
        return KVCacheSize(0.0)
    batch = int(decode.meta.get("batch", 1)) or 1
    metas = {}
    for n in decode.nodes:
        for t in n.inputs:
            if t.tensor_id in caches and t.tensor_id not in metas:
                metas[t.tensor_id] = (t, n.layer_index)
    longest = max(t.shape[caches[tid]] for tid, (t, _) in metas.items())
    per_token = fixed = 0.0
    window = 0
    for tid, (t, layer) in metas.items():
        count = _count(decode, layer, layers)
        length = t.shape[caches[tid]]
        size = t.nbytes * count / batch
        if length == longest and length > 0:
            per_token += size / length
        else:  # a window-capped cache: its size does not grow with the sequence
            fixed += size
            window = max(window, length)
    return KVCacheSize(per_token, fixed, window)


def activation_peak_bytes(graph: OpGraph) -> int:
    """Peak bytes of intermediate tensors alive at once while the graph runs in order.

    Parameters, graph inputs (caches, token ids) and views (they alias) allocate nothing;
    a tensor is freed after its last reader. A layer template runs its layers one after
    another, so one copy of its transients is what is live.
    """
    last_use: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for t in n.inputs:
            if t.tensor_id is not None:
                last_use[t.tensor_id] = i
    live = 0
    peak = 0
    alive: dict[int, int] = {}
    for i, n in enumerate(graph.nodes):
        for t in n.outputs:
            if t.tensor_id is None or t.is_view or n.zero_cost:
                continue
            size = t.nbytes
            alive[t.tensor_id] = size
            live += size
        peak = max(peak, live)
        for t in n.inputs:
            tid = t.tensor_id
            if tid is not None and last_use.get(tid) == i and tid in alive:
                live -= alive.pop(tid)
        for t in n.outputs:  # written and never read: freed at once
            tid = t.tensor_id
            if tid is not None and tid not in last_use and tid in alive:
                live -= alive.pop(tid)
    return peak
