"""Memory per device for serving: weights, KV cache per token, activations, and what is left
for the cache — read from the per-rank graphs, so TP/EP/PP sharding and quantisation are
already in the numbers.

- Weights: every parameter tensor the phase graphs read, once, at its per-rank shape and
  dtype (block scales of quantised formats included), times the layers its template stands
  for.
- KV cache: the state a decode graph carries in from prefill, at its per-rank shape and
  dtype, per layer kind: bytes that grow with every token (K/V, MLA's latent row, DSA's
  indexer keys), with every ``ratio`` tokens (compressed entries), or not at all (sliding
  windows, SSM and convolution states): :func:`cache_states`, :func:`kv_cache_size`. No
  per-family formula: MLA, DSA, DeepSeek-V4, sliding-window, Mamba and GQA models all read
  their caches from the graph.
- Activations: the peak of live intermediate tensors while one forward runs (tensors freed
  after their last reader), as the engine's warm-up profiling reserves it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from attrs import field, frozen

from zrt_core.ir.graph import OpGraph, TensorMeta
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


#: How a state tensor a decode step reads from earlier steps grows with the sequence.
TOKENS = "tokens"      # one row per token (K/V, MLA latent, DSA indexer keys)
ENTRIES = "entries"    # one row per ``ratio`` tokens (compressed entries: DeepSeek-V4)
FIXED = "fixed"        # a size set by the model, not the sequence (sliding windows, SSM states)


_INTEGER = re.compile(r"u?int|bool")


@frozen
class CacheState:
    """One state tensor a decode step carries over from earlier steps, and how it grows.

    :param kind: :data:`TOKENS`, :data:`ENTRIES` or :data:`FIXED`.
    :param axis: the axis that grows; for a :data:`FIXED` cache a window caps, the axis a
        ``cat`` extends; None for other fixed state (recurrent, convolution states).
    :param tokens_per_row: tokens one row stands for: 1, or the compression ratio.
    :param cap_rows: rows a :data:`TOKENS` cache stops at (a sliding window longer than the
        captured context: its rows grow until the window is full); 0: unbounded.
    """

    kind: str
    axis: int | None = None
    tokens_per_row: int = 1
    cap_rows: int = 0


def cached_tokens(decode: OpGraph) -> int:
    """Tokens already cached when a decode graph's step runs: ``meta["cache_len"]`` (a
    rescaled graph), ``meta["kv_len"]`` (a captured one), else the longest cache a ``cat``
    extends."""
    for key in ("cache_len", "kv_len"):
        value = decode.meta.get(key)
        if value:
            return int(value)
    caches = cache_inputs(decode)
    return max((t.shape[caches[t.tensor_id]] for n in decode.nodes for t in n.inputs
                if t.tensor_id in caches), default=0)


def _consumers(graph: OpGraph) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for t in n.inputs:
            if t.tensor_id is not None:
                out.setdefault(t.tensor_id, []).append(i)
    return out


def _reader_attr(graph: OpGraph, consumers: Mapping[int, list[int]], tensor_id: int,
                 attr: str, depth: int = 4) -> int:
    """The first positive ``attrs[attr]`` of a node reading ``tensor_id`` within ``depth``
    dataflow steps (views, ``cat`` with the new token, then the attention kernel); 0."""
    frontier, seen = [tensor_id], {tensor_id}
    for _ in range(depth):
        nxt: list[int] = []
        for tid in frontier:
            for i in consumers.get(tid, ()):
                n = graph.nodes[i]
                value = n.attrs.get(attr)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
                for t in n.outputs:
                    if t.tensor_id is not None and t.tensor_id not in seen:
                        seen.add(t.tensor_id)
                        nxt.append(t.tensor_id)
        frontier = nxt
    return 0


def _computed_on(graph: OpGraph, consumers: Mapping[int, list[int]], tensor_id: int | None
                 ) -> bool:
    """Whether a node that computes (not a view or metadata op) reads the tensor or a view
    of it."""
    frontier, seen = [tensor_id], {tensor_id}
    while frontier:
        tid = frontier.pop()
        for i in consumers.get(tid, ()) if tid is not None else ():
            n = graph.nodes[i]
            if not n.zero_cost:
                return True
            for t in n.outputs:
                if t.tensor_id is not None and t.tensor_id not in seen:
                    seen.add(t.tensor_id)
                    frontier.append(t.tensor_id)
    return False


def cache_states(decode: OpGraph, prefill: OpGraph | None = None) -> dict[int, CacheState]:
    """The state a captured decode step reads from earlier steps, ``{tensor id: state}``.

    State is what the decode graph reads before writing and does not compute: a tensor the
    prefill graph produced (tensor ids are shared across one capture's phases) or a cache a
    ``cat`` extends; for a decode graph alone, every non-integer tensor of two or more axes
    with the batch leading that it reads before writing. With ``L`` the cached tokens
    (:func:`cached_tokens`), a tensor grows with the sequence when:

    - a ``cat`` extends it along an axis of length ``L``: one row per token (:data:`TOKENS`);
      capped at a reader's ``attrs["window"]`` (or ``["chunk"]``, Llama 4) − 1 rows when
      that is longer than ``L`` (the rows a sliding-window cache keeps besides the new
      token);
    - a reader carries ``attrs["ratio"] = r`` and an axis (after the batch) has ``L // r``
      rows: one entry per ``r`` tokens (:data:`ENTRIES`).

    Everything else is :data:`FIXED` per sequence: caches a window already caps (a ``cat``
    axis shorter than ``L`` read by a node with ``attrs["window"]`` or ``["chunk"]``),
    recurrent and
    convolution states, compressor buffers. Parameters, tensors without the batch leading,
    and caches extended by a ``cat`` whose result nothing reads (bookkeeping copies) are
    left out.
    """
    from_prefill = ({t.tensor_id for n in prefill.nodes for t in n.outputs
                     if t.tensor_id is not None} if prefill is not None else set())
    batch = int(decode.meta.get("batch", 1)) or 1
    extended = cache_inputs(decode)
    written: set[int] = set()
    metas: dict[int, TensorMeta] = {}
    for n in decode.nodes:
        for t in n.inputs:
            tid = t.tensor_id
            if (tid is None or t.param is not None or tid in written or tid in metas
                    or not t.shape or t.shape[0] != batch):
                continue
            if tid in extended or tid in from_prefill or (
                    prefill is None and len(t.shape) >= 2 and not _INTEGER.match(t.dtype)):
                # alone, a decode graph's state is what it reads before writing: caches
                # and recurrent states, never token ids (integers)
                metas[tid] = t
        for t in n.outputs:
            if t.tensor_id is not None:
                written.add(t.tensor_id)
    length = cached_tokens(decode)
    consumers = _consumers(decode)
    # a cat that extends a state its step also writes back in place (a convolution
    # state) extends it too, though cache_inputs leaves it out as produced in the graph
    cat_axis: dict[int, int] = {}
    dead: set[int] = set()
    for n in decode.nodes:
        if n.op.rsplit(".", 1)[0] == "aten.cat" and n.outputs:
            nd = len(n.outputs[0].shape)
            dim = int(n.attrs.get("dim", 0)) % max(nd, 1)
            for t in n.inputs:
                if t.tensor_id in metas and len(t.shape) == nd:
                    cat_axis.setdefault(t.tensor_id, dim)
                    if not _computed_on(decode, consumers, n.outputs[0].tensor_id):
                        dead.add(t.tensor_id)
    out: dict[int, CacheState] = {}
    for tid, t in metas.items():
        axis = cat_axis.get(tid)
        if axis is not None:
            if tid in dead:  # extended and never read (transformers' V = K copy of V4)
                continue
            rows = t.shape[axis]
            window = (_reader_attr(decode, consumers, tid, "window")
                      or _reader_attr(decode, consumers, tid, "chunk"))
            if rows == length:
                cap = window - 1 if window - 1 > length else 0
                out[tid] = CacheState(TOKENS, axis, 1, cap)
            else:  # a window caps it already (or a convolution state): fixed rows
                out[tid] = CacheState(FIXED, axis if window else None)
            continue
        ratio = _reader_attr(decode, consumers, tid, "ratio")
        entries = length // ratio if ratio > 0 else 0
        axis = next((a for a in range(1, len(t.shape)) if entries and t.shape[a] == entries),
                    None)
        out[tid] = (CacheState(ENTRIES, axis, ratio) if axis is not None
                    else CacheState(FIXED))
    return out


@frozen
class KVCacheSize:
    """KV-cache bytes per device of one sequence.

    :param per_token: bytes every token of the sequence adds (rows of :data:`TOKENS` caches,
        entries of :data:`ENTRIES` caches spread over their tokens).
    :param per_sequence_fixed: bytes a sequence holds whatever its length (:data:`FIXED`).
    :param window: the longest capped cache, in rows (0: none).
    :param windowed: ``(bytes per token, rows)`` of caches that grow until a window of
        ``rows`` fills, one entry per window length.
    :param by_kind: layer kind → ``(per_token, per_sequence_fixed)`` of its layers (all its
        layers together; ``outside_layers`` for state outside them).
    :param recurrent_fixed: the part of ``per_sequence_fixed`` that is no attention window:
        SSM and convolution states, compressor buffers.
    :param window_row_bytes: bytes per token the window-capped caches would add without
        their windows (what a heuristic that ignores windows counts per token).
    """

    per_token: float
    per_sequence_fixed: float = 0.0
    window: int = 0
    windowed: tuple[tuple[float, int], ...] = ()
    by_kind: Mapping[str, tuple[float, float]] = field(factory=dict)
    recurrent_fixed: float = 0.0
    window_row_bytes: float = 0.0

    @property
    def recurrent(self) -> bool:
        """Whether the model carries recurrent state (an SSM or convolution state)."""
        return self.recurrent_fixed > 0

    def for_sequence(self, tokens: int) -> float:
        """Bytes one sequence of ``tokens`` tokens holds."""
        capped = sum(b * min(tokens, rows) for b, rows in self.windowed)
        return self.per_token * tokens + self.per_sequence_fixed + capped


def kv_cache_size(decode: OpGraph, layers: set[int] | None = None, *,
                  caches: Mapping[int, CacheState] | None = None,
                  factors: Mapping[int, float] | None = None) -> KVCacheSize:
    """KV-cache bytes of one sequence per device, from a (transformed) decode graph.

    :param caches: the state found on the captured graphs (:func:`cache_states`), when
        transforms have since changed the decode graph (fusion folds the cache updates into
        kernels; tensor ids are kept); default: found on ``decode`` itself.
    :param layers: count only these layer indices (a pipeline stage).
    :param factors: tensor id → how many times to count that cache (default once): the
        ranks holding it, for a whole-model total.
    """
    if caches is None:
        caches = cache_states(decode)
    batch = int(decode.meta.get("batch", 1)) or 1
    metas: dict[int, tuple[TensorMeta, int | None]] = {}
    for n in decode.nodes:
        for t in n.inputs:
            if t.tensor_id in caches and t.tensor_id not in metas:
                metas[t.tensor_id] = (t, n.layer_index)
    kinds = {i: tpl.kind for tpl in decode.templates.values() for i in tpl.indices}
    per_token = fixed = recurrent = window_rows = 0.0
    window = 0
    windowed: dict[int, float] = {}
    by_kind: dict[str, list[float]] = {}
    for tid, (t, layer) in metas.items():
        state = caches[tid]
        count = _count(decode, layer, layers)
        if not count:
            continue
        size = t.nbytes * count / batch * (factors.get(tid, 1.0) if factors else 1.0)
        name = kinds.get(layer, "outside_layers") if layer is not None else "outside_layers"
        kind = by_kind.setdefault(name, [0.0, 0.0])
        rows = t.shape[state.axis] if state.axis is not None else 0
        if state.kind == FIXED:
            fixed += size
            kind[1] += size
            if state.axis is None:
                recurrent += size
            elif rows:  # a cache its window caps
                window = max(window, rows)
                window_rows += size / rows
            continue
        if not rows:  # no entry closed yet in the capture: nothing to size a row by
            continue
        row = size / rows / state.tokens_per_row
        kind[0] += row
        if state.cap_rows:
            windowed[state.cap_rows] = windowed.get(state.cap_rows, 0.0) + row
            window = max(window, state.cap_rows)
            window_rows += row
        else:
            per_token += row
    return KVCacheSize(per_token, fixed, window,
                       tuple((b, rows) for rows, b in sorted(windowed.items())),
                       {k: (v[0], v[1]) for k, v in by_kind.items()}, recurrent, window_rows)


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
