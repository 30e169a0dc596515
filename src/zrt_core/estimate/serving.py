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
    if not cache_inputs(graph):
        return 0
    from zrt_core.estimate.memory import cached_tokens

    return cached_tokens(graph)


class Rescale:
    """The graph at another batch and, for decode, another number of cached tokens.

    :param batch: sequences per step (None: as captured).
    :param cache_len: cached tokens per sequence in decode (None: as captured). A cache
        shorter than the captured length (a sliding window) keeps its size; so do
        compressed caches (one entry per ``ratio`` tokens), whose entries stay as captured.
    """

    name = "rescale"

    def __init__(self, batch: int | None = None, cache_len: int | None = None) -> None:
        if batch is not None and batch < 1:
            raise LayoutError(f"batch must be at least 1, got {batch}")
        if cache_len is not None and cache_len < 1:
            raise LayoutError(f"cache length must be at least 1, got {cache_len}")
        self.batch = batch
        self.cache_len = cache_len

    def seeds(self, graph: OpGraph
              ) -> Callable[[TensorMeta, OpNode], dict[int, tuple[str, Fraction]] | None] | None:
        """``{axis: (group, factor)}`` for the tensors the graph does not produce: token
        ids and KV caches scale with the batch, caches also with their length. None when
        nothing changes (usable as :class:`ParallelTransform`'s ``extra_seeds``)."""
        old_batch = int(graph.meta.get("batch", 1))
        new_batch = self.batch or old_batch
        caches = cache_inputs(graph) if graph.phase == Phase.DECODE else {}
        old_cache = cache_length(graph) if caches else 0
        new_cache = self.cache_len if (self.cache_len and caches) else old_cache
        if new_batch == old_batch and new_cache == old_cache:
            return None
        fb = Fraction(new_batch, old_batch)
        fk = Fraction(new_cache, old_cache) if old_cache else Fraction(1)

        def seed(meta: TensorMeta, node: OpNode) -> dict[int, tuple[str, Fraction]] | None:
            if meta.param is not None or not meta.shape:
                return None
            factors: dict[int, tuple[str, Fraction]] = {}
            if meta.tensor_id in caches:
                if meta.shape[0] == old_batch and fb != 1:
                    factors[0] = ("batch", fb)
                axis = caches[meta.tensor_id]
                if meta.shape[axis] == old_cache and fk != 1:
                    factors[axis] = ("kv", fk)
            elif (meta.dtype.startswith(("int", "uint")) and len(meta.shape) == 2
                  and meta.shape[0] == old_batch and fb != 1):
                factors[0] = ("batch", fb)  # token ids
            return factors or None

        return seed

    def updated_meta(self, graph: OpGraph, out: OpGraph) -> OpGraph:
        """``out`` (the rescaled ``graph``) with ``meta`` batch and cache length updated."""
        meta = dict(out.meta)
        if self.batch:
            meta["batch"] = self.batch
        if self.cache_len and graph.phase == Phase.DECODE and cache_inputs(graph):
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
        return self.updated_meta(graph, propagate_shapes(graph, layout, registry))


class PagedKVCache:
    """Cache updates as serving engines run them (see the module docstring): a decode
    step writes one token's keys and values per sequence; nothing rereads the cache but
    attention. Prefill's cache write (``cat`` onto an empty cache) already costs that."""

    name = "paged_kv_cache"

    def apply(self, graph: OpGraph, ctx: TransformContext | None) -> OpGraph:
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
