"""An aten graph as Inductor would fuse it: fused pointwise/reduction kernels, extern GEMMs.

What is modelled (a reimplementation of the rules, not Inductor's scheduler, which needs
real device codegen; rules from torch/_inductor/scheduler.py ``can_fuse`` /
``score_fusion`` and the Inductor design notes, torch 2.13):

- **Extern kernels** stay one node each: matmuls (``mm``/``addmm``/``bmm``/grouped GEMMs,
  cuBLAS calls in Inductor's default mode: no Triton templates, so no epilogue fusion),
  attention (SDPA/flash fallbacks and zrt's attention op), collectives, MoE dispatch and
  combine, SSM scans and every op outside ``aten`` (custom ops are fallbacks).
- **Views** cost nothing and do not break fusion (Inductor reinterprets them as index
  arithmetic); creation ops (``empty``, ``zeros``, ``full``...) stay as they are priced.
- **Pointwise and reduction ops fuse** along dataflow (vertical fusion: a consumer joins
  its producer's kernel) inside one decoder layer, with at most ``MAX_FUSION_SIZE`` ops per
  kernel (``config.max_fusion_size`` = 64) and at most one reduction per kernel unless
  the reductions read the same number of elements (Inductor fuses reductions only over the
  same iteration space; a norm's sum and its epilogue are one kernel, a norm's backward
  with two different reductions is two).
- **Bytes** of a fused kernel: every tensor it reads from outside (once) and every tensor
  it produces that a node outside it, or no node of this phase, reads (saved activations,
  outputs); intermediates stay in registers. FLOPs are the sum of the ops.

Not modelled: horizontal fusion of independent kernels, recomputation in backward by the
min-cut partitioner, CUDA graphs (launch overhead stays the cost backend's per-kernel
overhead), Triton code quality (a fused kernel is priced as the cost backend prices a
memory-bound op of its category and bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import frozen

from zrt_core.ir.graph import DTYPE_BYTES, Category, OpGraph, OpNode, TensorMeta

MAX_FUSION_SIZE = 64

#: categories Inductor runs as extern kernels (one node each, never fused)
EXTERN = frozenset({Category.MATMUL, Category.ATTENTION, Category.COLLECTIVE,
                    Category.MOE_DISPATCH, Category.MOE_COMBINE, Category.SSM,
                    Category.OPTIMIZER})
_REDUCING = frozenset({Category.REDUCTION, Category.NORM, Category.SOFTMAX, Category.LOSS})
_FREE = frozenset({Category.VIEW, Category.CREATION})


def _numel(t: TensorMeta) -> int:
    n = 1
    for s in t.shape:
        n *= int(s)
    return n


def _nbytes(t: TensorMeta) -> int:
    return int(_numel(t) * DTYPE_BYTES.get(t.dtype, 2))


def is_fusable(node: OpNode) -> bool:
    """Whether Inductor would generate this op inside a fused Triton kernel."""
    if node.category in EXTERN or node.category in _FREE or node.zero_cost:
        return False
    return node.op.startswith("aten.")


class _Group:
    def __init__(self, first: OpNode) -> None:
        self.nodes = [first]
        self.reduce_numel: int | None = _reduce_numel(first)


def _reduce_numel(node: OpNode) -> int | None:
    if node.category in _REDUCING and node.inputs:
        return _numel(node.inputs[0])
    return None


def fuse_graph(graph: OpGraph) -> OpGraph:
    """``graph`` with Inductor's fused kernels as nodes (see the module docstring)."""
    nodes = list(graph.nodes)
    # tensor id -> the real (non-view) node that produced it; views alias their source
    producer: dict[int, OpNode] = {}
    alias: dict[int, int] = {}
    consumers: dict[int, set[int]] = {}
    for n in nodes:
        for t in n.inputs:
            consumers.setdefault(_root(alias, t.tensor_id), set()).add(n.id)
        if n.zero_cost or n.category == Category.VIEW:
            src = n.inputs[0].tensor_id if n.inputs else None
            for t in n.outputs:
                if src is not None:
                    alias[t.tensor_id] = _root(alias, src)
                elif n.category == Category.CREATION:
                    producer[t.tensor_id] = n
            continue
        for t in n.outputs:
            producer[t.tensor_id] = n
    group_of: dict[int, _Group] = {}
    groups: list[_Group] = []
    for n in nodes:
        if not is_fusable(n):
            continue
        target = None
        for t in n.inputs:
            src = producer.get(_root(alias, t.tensor_id))
            if src is None or src.id not in group_of:
                continue
            g = group_of[src.id]
            if _can_join(g, n):
                target = g
                break
        if target is None:
            target = _Group(n)
            groups.append(target)
        else:
            target.nodes.append(n)
            target.reduce_numel = target.reduce_numel or _reduce_numel(n)
        group_of[n.id] = target
    out: list[OpNode] = []
    emitted: set[int] = set()
    for n in nodes:
        g = group_of.get(n.id)
        if g is None:
            out.append(n)
        elif id(g) not in emitted:
            emitted.add(id(g))
            out.append(n if len(g.nodes) == 1 else _fused_node(g, alias, consumers))
    return OpGraph(phase=graph.phase, nodes=out, edges=(), templates=graph.templates,
                   meta={**graph.meta, "inductor_fused": True})


def _root(alias: dict[int, int], tid: int) -> int:
    while tid in alias:
        tid = alias[tid]
    return tid


def _can_join(group: _Group, node: OpNode) -> bool:
    first = group.nodes[0]
    if first.layer_index != node.layer_index or first.phase != node.phase:
        return False  # one kernel runs once per layer: keep multiplicities apart
    if len(group.nodes) >= MAX_FUSION_SIZE:
        return False
    numel = _reduce_numel(node)
    return numel is None or group.reduce_numel is None or numel == group.reduce_numel


def _fused_node(group: _Group, alias: dict[int, int], consumers: dict[int, set[int]]
                ) -> OpNode:
    members = {n.id for n in group.nodes}
    produced: dict[int, TensorMeta] = {}
    for n in group.nodes:
        for t in n.outputs:
            produced[t.tensor_id] = t
    read: dict[int, TensorMeta] = {}
    for n in group.nodes:
        for t in n.inputs:
            root = _root(alias, t.tensor_id)
            if root not in produced and t.tensor_id not in produced:
                read.setdefault(root, t)
    written = [t for tid, t in produced.items()
               if not consumers.get(tid) or consumers[tid] - members]
    first = group.nodes[0]
    categories = {n.category for n in group.nodes}
    category = next((c for c in (Category.NORM, Category.SOFTMAX, Category.LOSS,
                                 Category.REDUCTION) if c in categories), first.category)
    return OpNode(
        id=first.id, op="inductor.fused", category=category, phase=first.phase,
        inputs=tuple(read.values()), outputs=tuple(written), module_path=first.module_path,
        module_class=first.module_class, layer_index=first.layer_index,
        layer_kind=first.layer_kind, flops=sum(n.flops for n in group.nodes),
        bytes_read=sum(_nbytes(t) for t in read.values()),
        bytes_written=sum(_nbytes(t) for t in written), formula="inductor fused kernel",
        zero_cost=False, attrs={"fused_ops": [n.op for n in group.nodes],
                                "fused_node_ids": sorted(members)},
    )


def kernel_count(graph: OpGraph) -> int:
    """Kernels one execution of the whole model launches (layers times their count)."""
    return sum(graph.multiplicity(n) for n in graph.nodes
               if not n.zero_cost and n.category not in _FREE)


def fusion_summary(eager: OpGraph, fused: OpGraph) -> dict[str, Any]:
    """Kernels and bytes before and after fusion, whole model."""
    def total_bytes(g: OpGraph) -> int:
        return sum((n.bytes_read + n.bytes_written) * g.multiplicity(n) for n in g.nodes)

    return {"kernels_eager": kernel_count(eager), "kernels_inductor": kernel_count(fused),
            "bytes_eager": total_bytes(eager), "bytes_inductor": total_bytes(fused)}


@frozen
class CompileGain:
    """One phase priced as PyTorch eager runs it (one kernel per aten op) and as Inductor
    fuses it, on one device, whole model, ops back to back (no overlap)."""

    phase: str
    eager_s: float
    inductor_s: float
    kernels_eager: int
    kernels_inductor: int
    bytes_eager: int
    bytes_inductor: int

    @property
    def speedup(self) -> float:
        """eager time over Inductor time (1.25 = 25% faster compiled)."""
        return self.eager_s / self.inductor_s if self.inductor_s > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "eager_s": self.eager_s, "inductor_s": self.inductor_s,
                "speedup": self.speedup, "kernels_eager": self.kernels_eager,
                "kernels_inductor": self.kernels_inductor, "bytes_eager": self.bytes_eager,
                "bytes_inductor": self.bytes_inductor}


def compare_compile(graphs: Sequence[OpGraph], hardware: Any, host: Any) -> list[CompileGain]:
    """Each phase's graph priced unfused and Inductor-fused with the same cost backends."""
    from zrt_core.cost.pricing import build_backends, price_graph

    backends = build_backends(hardware, host)
    gains = []
    for graph in graphs:
        fused = fuse_graph(graph)
        eager_s = price_graph(graph, hardware, host, backends=backends).total_time_s
        inductor_s = price_graph(fused, hardware, host, backends=backends).total_time_s
        summary = fusion_summary(graph, fused)
        gains.append(CompileGain(phase=graph.phase, eager_s=eager_s, inductor_s=inductor_s,
                                 **summary))
    return gains
