"""Platform kernel selection for DeepSeek sparse attention (DSA).

Capture is platform-neutral: a DSA layer records ``deepseek.lightning_indexer`` and a sparse
``deepseek.mla_attention`` (CUDA: DeepGEMM's ``fp8_mqa_logits`` + a top-k kernel, FlashMLA's
sparse kernels). On Ascend the same math runs as two different kernels — torch_npu's
``npu_lightning_indexer`` (scores and top-k fused: the ``[S, T]`` logits never reach HBM)
and ``npu_sparse_flash_attention`` (SFA; vLLM-Ascend's and MindIE's DeepSeek-V3.2 path).
:class:`PlatformKernels` is a transform (the core's ``Transform`` protocol) that renames
those nodes for the platform of the hardware being priced and re-evaluates their formulas,
so bytes follow the kernel that runs; FLOPs are the same by construction.

Dense MLA decode (V2/V3, no indices) keeps its name on every platform.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from zrt_deepseek.ops import NAMESPACE, NPU_NAMES

if TYPE_CHECKING:
    from zrt_core.plugin import FormulaRegistry, OpGraph, OpNode

#: platform → {CUDA op packet: that platform's op packet}
PLATFORM_OPS: dict[str, dict[str, str]] = {
    "ascend": {f"{NAMESPACE}.{cuda}": f"{NAMESPACE}.{npu}" for cuda, npu in NPU_NAMES.items()},
}

_SPARSE_ONLY = {f"{NAMESPACE}.mla_attention", f"{NAMESPACE}.mla_attention_backward"}
_INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})


def _is_sparse(node: OpNode) -> bool:
    return any(t.dtype in _INT_DTYPES and len(t.shape) == 3 for t in node.inputs)


def _packet(op: str) -> tuple[str, str]:
    """``("deepseek.mla_attention", "default")`` of ``deepseek.mla_attention.default``."""
    packet, _, overload = op.rpartition(".")
    return packet, overload


def select_kernels(graph: OpGraph, platform: str, registry: FormulaRegistry) -> OpGraph:
    """``graph`` with DSA nodes renamed to ``platform``'s kernels (unchanged when the platform
    has none), their FLOPs and bytes re-evaluated from ``registry``."""
    from zrt_core.plugin import OpCall

    table = PLATFORM_OPS.get(platform)
    if not table:
        return graph
    nodes: list[Any] = []
    changed = False
    for node in graph.nodes:
        packet, overload = _packet(node.op)
        target = table.get(packet)
        if target is None or (packet in _SPARSE_ONLY and not _is_sparse(node)):
            nodes.append(node)
            continue
        op = f"{target}.{overload}"
        attrs = {**node.attrs, "platform": platform, "kernel_of": node.op}
        flops, read, written, name = registry.evaluate(
            OpCall(op=op, inputs=node.inputs, outputs=node.outputs, attrs=node.attrs))
        nodes.append(evolve(node, op=op, flops=flops, bytes_read=read, bytes_written=written,
                            formula=name, attrs=attrs))
        changed = True
    return graph.with_nodes(nodes) if changed else graph


@frozen
class PlatformKernels:
    """A transform: DSA kernels of the hardware's platform (``ctx.platform``)."""

    name: str = "deepseek.platform_kernels"

    def apply(self, graph: OpGraph, ctx: Any) -> OpGraph:
        return select_kernels(graph, ctx.platform, ctx.host.formulas)
