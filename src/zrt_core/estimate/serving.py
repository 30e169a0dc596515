"""Serving-side graph transforms: a captured phase at another batch or KV length, and the
paged KV cache that serving engines write in place.

:class:`Rescale` carries a new batch (and, for decode, a new cache length) through the
dataflow with the same engine the parallel transforms use, and re-prices every node by its
formula: exact for everything the formulas count, attention included, so one capture at
batch 1 serves every batch and context length.

:class:`PagedKVCache` replaces HF's cache update (``cat`` of the whole cache with the new
token, read and rewritten every step) by what vLLM and TensorRT-LLM do: write the new keys
and values into their cache blocks; attention reads the cache where it is.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.errors import LayoutError
from zrt_core.estimate.memory import cache_states, cached_tokens
from zrt_core.ir.graph import Category, OpGraph, OpNode, Phase, TensorMeta
from zrt_core.transforms.parallel import (
    Layout,
    cache_inputs,
    op_base,
    propagate_shapes,
    replace_graph,
    replace_node,
    scaled_layout,
)

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


def cache_length(graph: OpGraph) -> int:
    """Cached tokens a decode graph attends to besides the new one (0 for prefill): the
    tokens of the capture or the last rescale (``meta``), so a model whose every layer has
    a sliding window (DeepSeek-V4) does not read its window as the context."""
    if graph.phase != Phase.DECODE or not cache_states(graph):
        return 0
    return cached_tokens(graph)


class Rescale:
    """The graph at another batch and, for decode, another number of cached tokens.

    :param batch: sequences per step (None: as captured).
    :param cache_len: cached tokens per sequence in decode (None: as captured).

    What a decode step carries in from earlier steps (:func:`~zrt_core.estimate.memory.
    cache_states`) follows the new length by how it grows: a cache of one row per token
    takes ``cache_len`` rows (at most its window's, for a window longer than the capture's
    context), a cache a window already caps keeps its rows (fewer when ``cache_len`` is
    shorter), compressed entries (one per ``ratio`` tokens, DeepSeek-V4) take ``cache_len //
    ratio``, recurrent state its size. Every state, the token ids and what the model makes
    from nothing with the batch leading (OPT's mask, a Mamba mixer's initial convolution
    state) take the batch; an axis of ``cached + 1`` entries made from nothing (the
    positions of the keys: BLOOM's ALiBi, OPT's mask) the new length. Kernels' ``start_pos``
    (tokens before the step's query) moves to the new length.
    """

    name = "rescale"

    def __init__(self, batch: int | None = None, cache_len: int | None = None) -> None:
        if batch is not None and batch < 1:
            raise LayoutError(f"batch must be at least 1, got {batch}")
        if cache_len is not None and cache_len < 1:
            raise LayoutError(f"cache length must be at least 1, got {cache_len}")
        self.batch = batch
        self.cache_len = cache_len

    def _lengths(self, graph: OpGraph) -> tuple[int, int, int, int]:
        """``(old batch, new batch, old cached tokens, new cached tokens)``."""
        old_batch = int(graph.meta.get("batch", 1))
        new_batch = self.batch or old_batch
        old_cache = cache_length(graph) if graph.phase == Phase.DECODE else 0
        new_cache = self.cache_len if (self.cache_len and old_cache) else old_cache
        return old_batch, new_batch, old_cache, new_cache

    def seeds(self, graph: OpGraph
              ) -> Callable[[TensorMeta, OpNode], dict[int, tuple[str, Fraction]] | None] | None:
        """``{axis: (group, factor)}`` for the tensors the graph does not produce (token ids,
        caches, states) and those it makes from nothing. None when nothing changes (usable
        as :class:`ParallelTransform`'s ``extra_seeds``)."""
        old_batch, new_batch, old_cache, new_cache = self._lengths(graph)
        if new_batch == old_batch and new_cache == old_cache:
            return None
        fb = Fraction(new_batch, old_batch)
        grow = _state_rows(graph, old_cache, new_cache) if new_cache != old_cache else {}
        states = set(cache_states(graph)) if graph.phase == Phase.DECODE else set()
        # caches a cat extends but nothing reads (transformers' second copy of V4's K = V,
        # MLA's empty values) are no state, but keep their shapes coherent
        for tid, axis in (cache_inputs(graph) if states else {}).items():
            if tid not in states:
                states.add(tid)
                rows = next((t.shape[axis] for n in graph.nodes for t in n.inputs
                             if t.tensor_id == tid), 0)
                if rows == old_cache and new_cache != old_cache:
                    grow[tid] = (axis, Fraction(new_cache, old_cache))

        def seed(meta: TensorMeta, node: OpNode) -> dict[int, tuple[str, Fraction]] | None:
            if meta.param is not None or not meta.shape:
                return None
            factors: dict[int, tuple[str, Fraction]] = {}
            tid = meta.tensor_id
            made = node.category == Category.CREATION and not any(
                t.tensor_id is not None for t in node.inputs)
            if made:  # a tensor the model makes from nothing
                if fb != 1 and len(meta.shape) >= 2 and meta.shape[0] == old_batch:
                    factors[0] = ("batch", fb)
                if new_cache != old_cache:
                    for axis, size in enumerate(meta.shape):
                        if size == old_cache + 1 and axis not in factors:
                            factors[axis] = ("kv", Fraction(new_cache + 1, old_cache + 1))
                            break
            elif tid in states:
                if fb != 1:
                    factors[0] = ("batch", fb)
                if tid in grow:
                    axis, f = grow[tid]
                    factors[axis] = ("kv", f)
            elif (meta.dtype.startswith(("int", "uint")) and len(meta.shape) == 2
                  and meta.shape[0] == old_batch and fb != 1):
                factors[0] = ("batch", fb)  # token ids
            return factors or None

        return seed

    def attrs(self, graph: OpGraph) -> dict[str, dict[int, int]] | None:
        """Node attrs a new cache length moves: ``start_pos`` (tokens cached before the
        step's query), from the captured length to the new one (usable as
        :class:`ParallelTransform`'s ``extra_attrs``)."""
        _, _, old_cache, new_cache = self._lengths(graph)
        if new_cache == old_cache:
            return None
        return {"start_pos": {old_cache: new_cache}}

    def updated_meta(self, graph: OpGraph, out: OpGraph) -> OpGraph:
        """``out`` (the rescaled ``graph``) with ``meta`` batch and cache length updated."""
        meta = dict(out.meta)
        if self.batch:
            meta["batch"] = self.batch
        if self.cache_len and graph.phase == Phase.DECODE and cache_length(graph):
            meta["kv_len"] = self.cache_len + 1
            meta["cache_len"] = self.cache_len
        return replace_graph(out, meta=meta)

    def apply(self, graph: OpGraph, ctx: TransformContext | None) -> OpGraph:
        seeds = self.seeds(graph)
        if seeds is None:
            return graph

        def layout(meta: TensorMeta, node: OpNode) -> Layout | None:
            factors = seeds(meta, node)
            return scaled_layout(meta, factors) if factors else None

        registry = ctx.host.formulas if ctx is not None and ctx.host is not None else None
        return self.updated_meta(graph, propagate_shapes(graph, layout, registry,
                                                         attrs=self.attrs(graph)))


def _state_rows(graph: OpGraph, old_cache: int, new_cache: int
                ) -> dict[int, tuple[int, Fraction]]:
    """State tensor id → ``(axis, factor)`` of the rows it holds at ``new_cache`` cached
    tokens instead of ``old_cache`` (see :class:`Rescale`)."""
    from zrt_core.estimate.memory import ENTRIES, FIXED, TOKENS

    states = cache_states(graph)
    shapes = {t.tensor_id: t.shape for n in graph.nodes for t in n.inputs
              if t.tensor_id in states}
    out: dict[int, tuple[int, Fraction]] = {}
    for tid, st in states.items():
        if st.axis is None or tid not in shapes:
            continue
        rows = shapes[tid][st.axis]
        if st.kind == TOKENS:
            new = min(new_cache, st.cap_rows) if st.cap_rows else new_cache
        elif st.kind == ENTRIES:
            new = new_cache // st.tokens_per_row
        elif st.kind == FIXED:  # a window caps it: fewer rows only below the window
            new = min(rows, new_cache)
        else:
            continue
        if rows > 0 and new != rows:
            out[tid] = (st.axis, Fraction(new, rows))
    return out


class PagedKVCache:
    """Cache updates as serving engines run them (see the module docstring): a decode
    step writes one token's keys and values per sequence; nothing rereads the cache but
    attention. Prefill's cache write (``cat`` onto an empty cache) already costs that."""

    name = "paged_kv_cache"

    def apply(self, graph: OpGraph, ctx: TransformContext | None) -> OpGraph:
        graph = _fused_cache_writes(graph)
        caches = cache_inputs(graph)
        if not caches:
            return graph
        nodes = []
        for n in graph.nodes:
            if op_base(n.op) != "cat" or not any(t.tensor_id in caches for t in n.inputs):
                nodes.append(n)
                continue
            new = [t for t in n.inputs if t.tensor_id not in caches]
            written = sum(_bytes_in(t, n.outputs[0].dtype) for t in new)
            nodes.append(replace_node(n, op="zrt.kv_cache_write", category=Category.COPY,
                                      bytes_read=sum(t.nbytes for t in new),
                                      bytes_written=written, formula="zrt.kv_cache_write",
                                      attrs={**n.attrs, "paged": True}))
        return replace_graph(graph, nodes=nodes)


def _bytes_in(meta: TensorMeta, dtype: str) -> int:
    return evolve(meta, dtype=dtype).nbytes


def _fused_cache_writes(graph: OpGraph) -> OpGraph:
    """A fused kernel (FlashAttention with the cache append) whose region ends in a cache
    ``cat`` that leaves the graph as the next step's cache — transformers' chunked and
    sliding caches keep a slice of the concatenation (Llama 4's chunked-attention layers)
    — writes only the new token's rows into its paged blocks, not the whole concatenation
    again: its ``bytes_written`` loses the cached rows. Prefill (an empty cache) is
    unchanged."""
    if graph.phase != Phase.DECODE:
        return graph
    produced = {t.tensor_id for n in graph.nodes for t in n.outputs if t.tensor_id is not None}
    read_outside = {t.tensor_id for n in graph.nodes for t in n.inputs
                    if t.tensor_id is not None}
    nodes = []
    changed = False
    for n in graph.nodes:
        out_ids = {t.tensor_id for t in n.outputs if t.tensor_id is not None}
        saved = 0
        inside = {t.tensor_id for m in n.fused_from or () for t in m.outputs}
        for m in n.fused_from or ():
            if op_base(m.op) != "cat" or not m.outputs:
                continue
            out = m.outputs[0]
            if out.tensor_id not in out_ids or out.tensor_id in read_outside:
                continue  # the concatenation is not written out as the cache
            nd = len(out.shape)
            cached = [t for t in m.inputs if t.tensor_id is not None and t.param is None
                      and t.tensor_id not in produced and t.tensor_id not in inside
                      and len(t.shape) == nd and nd >= 3]
            if not cached:
                continue
            new = sum(_bytes_in(t, out.dtype) for t in m.inputs if t not in cached)
            saved += max(0, out.nbytes - new)
        if saved:
            changed = True
            n = replace_node(n, bytes_written=max(0, n.bytes_written - saved),
                             attrs={**n.attrs, "paged": True})
        nodes.append(n)
    return replace_graph(graph, nodes=nodes) if changed else graph
