"""The vocabulary as the frameworks allocate it: padded, so its GEMMs keep aligned rows.

A model's ``vocab_size`` need not be a multiple of anything (GPT-2 and GPT-3: 50,257).
The frameworks pad the embedding and output-layer rows they allocate, and every logit
tensor with them:

* Megatron-Core (and NeMo / Megatron-Bridge on it) to a multiple of
  ``make_vocab_size_divisible_by × TP`` (default 128; ``_vocab_size_with_padding`` in
  ``megatron/training/tokenizer``), so each TP rank holds a multiple of 128 rows;
* vLLM and SGLang to a multiple of 64 (``DEFAULT_VOCAB_PADDING_SIZE`` in
  ``vocab_parallel_embedding.py``), then split over TP;
* TensorRT-LLM's PyTorch backend to a multiple of TP only (``LMHead``:
  ``ceil(vocab / tp)`` rows per rank), so an odd vocabulary stays odd at TP 1.

zrt captures the HF model, which allocates exactly ``vocab_size``: eager PyTorch (``zrt
measure`` / ``zrt diff``) runs that. The padding matters to the price because a GEMM
whose rows are not a multiple of 16 bytes runs at a fraction of the aligned rate on
Hopper (``matmul_unaligned_*``, docs/cost-model.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attrs import evolve

from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta
from zrt_core.transforms.parallel.engine import reprice

#: Megatron-Core's ``--make-vocab-size-divisible-by`` default
MEGATRON_VOCAB_DIVISIBLE_BY = 128
#: vLLM's (and SGLang's) ``DEFAULT_VOCAB_PADDING_SIZE``
VLLM_VOCAB_PADDING = 64


def padded_vocab(vocab: int, framework: str, tp: int = 1) -> int:
    """The rows ``framework`` allocates for a vocabulary of ``vocab`` at tensor parallelism
    ``tp`` (``megatron``, ``vllm`` or ``sglang``, ``trtllm``; anything else: ``vocab``)."""
    tp = max(1, tp)
    if framework == "megatron":
        multiple = MEGATRON_VOCAB_DIVISIBLE_BY * tp
    elif framework in ("vllm", "sglang"):
        multiple = math.lcm(VLLM_VOCAB_PADDING, tp)
    elif framework == "trtllm":
        multiple = tp
    else:
        return vocab
    return math.ceil(vocab / multiple) * multiple


def pad_vocabulary(graphs: Sequence[OpGraph], vocab: int, padded: int,
                   other_dims: Sequence[int] = (), registry: Any = None
                   ) -> tuple[tuple[OpGraph, ...], str | None]:
    """``graphs`` with every tensor dimension of size ``vocab`` made ``padded``, and the
    FLOPs and bytes of the nodes that touch one re-counted; and a note for the report.

    :param other_dims: the hidden size first, then the other sizes a dimension may have
        (tokens, sequence).

    Unchanged (note None) when ``padded == vocab``; unchanged, with a note saying so, when
    ``vocab`` is also the size of another dimension: one in ``other_dims`` (the hidden
    size, the tokens, the sequence) or any dimension of a weight that is not a vocabulary
    matrix (``[vocab, hidden]`` or its transpose; a tiny model whose FFN width equals its
    vocabulary): then a dimension of that size cannot be told to be the vocabulary's.
    """
    graphs = tuple(graphs)
    if padded == vocab or vocab <= 0:
        return graphs, None
    refused = (graphs, f"vocabulary {vocab} not padded to {padded}: another dimension has "
                       "the same size")
    if vocab in other_dims:
        return refused
    hidden = other_dims[0] if other_dims else None
    for graph in graphs:
        for node in graph.nodes:
            for t in node.inputs:
                if (t.param is not None and vocab in t.shape
                        and sorted(t.shape) != sorted((vocab, hidden))):
                    return refused
    out = []
    for graph in graphs:
        nodes = [_padded_node(n, vocab, padded, registry) for n in graph.nodes]
        changed = any(new is not old for new, old in zip(nodes, graph.nodes, strict=True))
        out.append(graph.with_nodes(nodes, graph.edges) if changed else graph)
    return tuple(out), (f"vocabulary padded from {vocab} to {padded} rows, as the framework "
                        "allocates it")


def _padded_node(node: OpNode, vocab: int, padded: int, registry: Any) -> OpNode:
    """``node`` with its tensors' ``vocab`` dimensions made ``padded`` and its counts
    re-evaluated (the node itself when none of its tensors has one)."""
    if not any(vocab in t.shape for t in (*node.inputs, *node.outputs)):
        return node

    def pad(t: TensorMeta) -> TensorMeta:
        if vocab not in t.shape:
            return t
        return evolve(t, shape=tuple(padded if d == vocab else d for d in t.shape))

    ins = tuple(pad(t) for t in node.inputs)
    outs = tuple(pad(t) for t in node.outputs)
    flops, read, written, formula = reprice(node, ins, outs, node.attrs, registry)
    return evolve(node, inputs=ins, outputs=outs, flops=flops, bytes_read=read,
                  bytes_written=written, formula=formula)
