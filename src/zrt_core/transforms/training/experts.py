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

:func:`expert_gemm_loop` marks a training graph's grouped GEMMs with
``attrs[EXPERT_STREAMS_ATTR] = 4``; the roofline then prices each as that loop
(:meth:`zrt_core.cost.roofline.RooflineBackend.gemm`). Serving graphs are not marked: the
serving engines' fused MoE kernels are single launches.
"""

from __future__ import annotations

from attrs import evolve

from zrt_core.cost.opdims import EXPERT_STREAMS_ATTR, GROUPED_GEMM_OPS, op_base
from zrt_core.ir.graph import Category, OpGraph

#: TransformerEngine's compute streams for its multi-stream GEMM and cast loops
#: (``get_num_compute_streams`` returns the constant 4).
TE_COMPUTE_STREAMS = 4


def expert_gemm_loop(graph: OpGraph, streams: int = TE_COMPUTE_STREAMS) -> OpGraph:
    """``graph`` with every grouped GEMM marked to run as a per-group GEMM loop over
    ``streams`` streams (unchanged when it has none)."""
    changed = False
    out = []
    for n in graph.nodes:
        if n.category == Category.MATMUL and op_base(n.op) in GROUPED_GEMM_OPS \
                and n.attrs.get(EXPERT_STREAMS_ATTR) != streams:
            n = evolve(n, attrs={**n.attrs, EXPERT_STREAMS_ATTR: streams})
            changed = True
        out.append(n)
    return graph.with_nodes(out, list(graph.edges)) if changed else graph
