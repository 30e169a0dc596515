"""The rows every capture output shares: whole-model totals per phase and per layer kind, and
one row per op. Totals count every layer: a node inside a layer template runs
``template.count`` times.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from attrs import field, frozen

from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta

#: A gap to the analytic FLOPs above this fraction is flagged in every output.
GAP_THRESHOLD = 0.10

OP_COLUMNS = (
    "id", "op", "category", "layer_index", "layer_kind", "module_path", "module_class",
    "runs", "flops", "bytes_read", "bytes_written", "formula", "zero_cost",
    "input_shapes", "output_shapes", "dtypes",
)


@frozen
class PhaseSummary:
    """Whole-model counts of one captured phase, next to its analytic reference.

    :param analytic_flops: the analytic FLOPs of the phase, or None without a model.
    :param gap: ``(flops − analytic) / analytic``; None without an analytic count.
    :param capture_s: seconds the capture of this phase took, when known.
    """

    phase: str
    ops: int
    flops: int
    bytes: int
    missing_formulas: tuple[str, ...] = field(converter=tuple)
    analytic_flops: int | None = None
    capture_s: float | None = None

    @property
    def gap(self) -> float | None:
        if not self.analytic_flops:
            return None
        return (self.flops - self.analytic_flops) / self.analytic_flops

    @property
    def gap_flagged(self) -> bool:
        return self.gap is not None and abs(self.gap) > GAP_THRESHOLD

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops, "flops": self.flops, "bytes": self.bytes,
            "missing_formulas": list(self.missing_formulas),
            "analytic_flops": self.analytic_flops,
            "gap": None if self.gap is None else round(self.gap, 6),
            "gap_over_threshold": self.gap_flagged,
            "capture_s": None if self.capture_s is None else round(self.capture_s, 3),
        }


@frozen
class LayerKindRow:
    """Whole-model counts of one layer kind (or the ops outside the layers) in one phase."""

    phase: str
    kind: str
    layers: int
    ops: int
    flops: int
    bytes: int


def summarize(graphs: Mapping[str, OpGraph], *,
              analytic_flops: Mapping[str, int | None] | None = None,
              capture_s: Mapping[str, float] | None = None) -> list[PhaseSummary]:
    """A :class:`PhaseSummary` per phase, in the order of ``graphs``."""
    out = []
    for phase, graph in graphs.items():
        totals = graph.totals()
        out.append(PhaseSummary(
            phase=phase, ops=totals.ops, flops=totals.flops, bytes=totals.bytes,
            missing_formulas=graph.missing_formulas,
            analytic_flops=(analytic_flops or {}).get(phase),
            capture_s=(capture_s or {}).get(phase),
        ))
    return out


def layer_kind_rows(graph: OpGraph) -> list[LayerKindRow]:
    """Counts per layer kind; ops outside decoder layers are ``(before layers)`` or
    ``(after layers)`` by their position relative to the layer ops in execution order."""
    layer_positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
    first = layer_positions[0] if layer_positions else len(graph.nodes)
    layers_of: dict[str, int] = {}
    for template in graph.templates.values():
        layers_of[template.kind] = layers_of.get(template.kind, 0) + template.count
    acc: dict[str, list[int]] = {}
    for position, node in enumerate(graph.nodes):
        if node.layer_index is None:
            kind = "(before layers)" if position < first else "(after layers)"
        else:
            kind = _node_kind(graph, node)
        m = graph.multiplicity(node)
        row = acc.setdefault(kind, [0, 0, 0])
        row[0] += m
        row[1] += m * node.flops
        row[2] += m * node.bytes
    return [LayerKindRow(phase=graph.phase, kind=kind,
                         layers=layers_of.get(kind, 0) if not kind.startswith("(") else 0,
                         ops=v[0], flops=v[1], bytes=v[2])
            for kind, v in acc.items()]


def _node_kind(graph: OpGraph, node: OpNode) -> str:
    if node.layer_kind:
        return node.layer_kind
    template = graph.templates.get(node.layer_index)  # type: ignore[arg-type]
    return template.kind if template is not None else f"layer {node.layer_index}"


def op_row(graph: OpGraph, node: OpNode) -> list[Any]:
    """One op-table row, in :data:`OP_COLUMNS` order."""
    return [
        node.id, node.op, node.category, node.layer_index, node.layer_kind or "",
        node.module_path, node.module_class, graph.multiplicity(node), node.flops,
        node.bytes_read, node.bytes_written, node.formula or "", node.zero_cost,
        _shapes(node.inputs), _shapes(node.outputs),
        ";".join(sorted({t.dtype for t in (*node.inputs, *node.outputs)})),
    ]


def _shapes(tensors: Iterable[TensorMeta]) -> str:
    return ";".join("x".join(str(d) for d in t.shape) or "scalar" for t in tensors)
