"""Turn recorded calls into :class:`OpGraph` values: formulas, categories, edges, templates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zrt_core.capture.recorder import RawOp, fallback_category
from zrt_core.formulas.registry import FormulaRegistry, OpCall, OpFormula
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode

_INTERNAL_ATTRS = ("annotated",)


def build_graph(phase: str, raws: Sequence[RawOp], registry: FormulaRegistry,
                templates: Sequence[LayerTemplate], meta: Mapping[str, Any],
                warnings: list[str]) -> OpGraph:
    """One phase's graph. A formula that raises is a warning and leaves the node unpriced."""
    kind_of: dict[int, str] = {}
    for t in templates:
        for i in t.indices:
            kind_of[i] = t.kind
    lookups: dict[str, OpFormula | None] = {}
    nodes = []
    edges = []
    for raw in raws:
        formula = lookups.get(raw.op, ...)
        if formula is ...:
            formula = lookups[raw.op] = registry.lookup(raw.op)
        attrs = {k: v for k, v in raw.attrs.items() if k not in _INTERNAL_ATTRS}
        flops = read = written = 0
        name = None
        if not raw.zero_cost and formula is not None:
            call = OpCall(op=raw.op, inputs=raw.inputs, outputs=raw.outputs, attrs=attrs)
            try:
                flops, read, written, name = registry.evaluate(call)
            except Exception as exc:  # a formula that does not fit this call
                warnings.append(f"{phase}: formula {formula.op!r} failed on {raw.op} "
                                f"{[t.shape for t in raw.inputs]}: {type(exc).__name__}: {exc}")
                flops = read = written = 0
                name = None
        elif not raw.zero_cost:
            call = OpCall(op=raw.op, inputs=raw.inputs, outputs=raw.outputs, attrs=attrs)
            _, read, written, _ = registry.evaluate(call)
        if formula is not None and formula.category is not None:
            category = formula.category
        else:
            category = fallback_category(raw.op, raw)
        layer = raw.layer_index
        nodes.append(OpNode(
            id=raw.local_id, op=raw.op, category=category, phase=phase, inputs=raw.inputs,
            outputs=raw.outputs, module_path=raw.module_path, module_class=raw.module_class,
            layer_index=layer, layer_kind=kind_of.get(layer) if layer is not None else None,
            flops=flops, bytes_read=read, bytes_written=written, formula=name,
            zero_cost=raw.zero_cost, attrs=attrs,
        ))
        edges.extend((p, raw.local_id) for p in raw.producers)
    return OpGraph(phase=phase, nodes=nodes, edges=edges, templates=templates, meta=meta)
