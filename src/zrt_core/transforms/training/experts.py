"""MoE expert GEMMs as Megatron-Core trains them: TransformerEngine's ``GroupedLinear``, one
cuBLAS GEMM per local expert over TE's compute streams (docs/moe-training.md).

Megatron-Core's ``TEGroupedMLP`` (``--moe-grouped-gemm`` with the TransformerEngine spec,
what every Megatron-Bridge MoE recipe runs) calls TE ``GroupedLinear`` →
``general_grouped_gemm`` → ``nvte_multi_stream_cublas_gemm``
(``transformer_engine/common/gemm/cublaslt_gemm.cu``, ``multi_stream_cublas_gemm``): a host
loop issuing GEMM ``i`` on compute stream ``i % num_streams``, with
``num_streams = 4`` (``transformer_engine/common/util/multi_stream.cpp``,
``get_num_compute_streams``). The forward, input-gradient and weight-gradient GEMMs of
both expert projections go through it. The single-launch grouped kernels (cuBLAS grouped,
CUTLASS ptr-array) are opt-in (``NVTE_GROUPED_LINEAR_USE_FUSED_GROUPED_GEMM``,
``NVTE_NVFP4_CUTLASS_GROUPED_GEMM``; TE PRs 3134 and 3175 keep the default unchanged).

:func:`expert_gemm_loop` marks a training graph's grouped GEMMs, and the casts feeding
them, with ``attrs[EXPERT_STREAMS_ATTR] = 4``; the roofline then prices each as that loop
(:meth:`zrt_core.cost.roofline.RooflineBackend.gemm`, ``memory_bound``). Serving graphs are not marked: the
serving engines' fused MoE kernels are single launches. The experts' biases and a clamped GLU
are then priced as ``TEGroupedMLP`` runs them (:mod:`.expert_epilogue`).
"""

from __future__ import annotations

from attrs import evolve

from zrt_core.cost.opdims import (
    EXPERT_EAGER_ATTR,
    EXPERT_GROUPS_ATTR,
    EXPERT_STREAMS_ATTR,
    GROUPED_GEMM_OPS,
    gemm_dims,
    op_base,
)
from zrt_core.ir.graph import Category, OpGraph, OpNode
from zrt_core.transforms.training.expert_epilogue import megatron_expert_epilogue

#: TransformerEngine's compute streams for its multi-stream GEMM and cast loops
#: (``get_num_compute_streams`` returns the constant 4).
TE_COMPUTE_STREAMS = 4


def expert_gemm_loop(graph: OpGraph, streams: int = TE_COMPUTE_STREAMS, *,
                     eager: bool = True) -> OpGraph:
    """``graph`` with every grouped GEMM marked to run as a per-group GEMM loop over
    ``streams`` streams, and every precision cast feeding one marked as one cast per group
    over the same streams (``GroupedLinear`` quantises each expert's split of its input
    separately, ``tex.split_quantize`` → ``nvte_multi_tensor_quantize``, whose kernels TE
    issues round-robin over the same compute streams: ``transformer_engine/common/cast/
    cast.cu``); ``attrs[EXPERT_GROUPS_ATTR]`` holds the groups, ``attrs[EXPERT_EAGER_ATTR]``
    whether the host launches each kernel (``eager``; False: replayed from a CUDA graph).
    Biases and clamps around the experts follow
    :func:`~zrt_core.transforms.training.expert_epilogue.megatron_expert_epilogue`.
    Unchanged when it has no grouped GEMM."""
    groups = {n.id: _groups(n) for n in graph.nodes
              if n.category == Category.MATMUL and op_base(n.op) in GROUPED_GEMM_OPS}
    if not groups:
        return graph
    casts: dict[int, int] = {}
    quantize = {n.id for n in graph.nodes if n.op == "precision.quantize"}
    for e in graph.edges:
        if e[0] in quantize and groups.get(e[1]):
            casts[e[0]] = max(casts.get(e[0], 0), groups[e[1]])
    out = []
    for n in graph.nodes:
        g = groups.get(n.id) or casts.get(n.id)
        if g:
            n = evolve(n, attrs={**n.attrs, EXPERT_STREAMS_ATTR: streams,
                                 EXPERT_GROUPS_ATTR: g, EXPERT_EAGER_ATTR: eager})
        out.append(n)
    return megatron_expert_epilogue(graph.with_nodes(out, list(graph.edges)), groups,
                                    eager=eager)


def _groups(node: OpNode) -> int:
    """A grouped GEMM's groups: its routing histogram's length, else its weight's leading
    dimension (the experts of a ``[G, K, N]`` weight), else 0."""
    rows = node.attrs.get("group_rows")
    if rows:
        return len(rows)
    dims = gemm_dims(node)
    return dims.batch if dims is not None else 0
