"""Turn recorded calls into :class:`OpGraph` values: formulas, categories, edges, templates.

Categories come from the op's formula (or the capture's table for ops without one), with one
exception: what an MoE router computes besides its gate GEMM — scores (softmax, sigmoid),
top-k, normalisation, DeepSeek's group-limited selection, and their backward — is
``moe_router``. A node belongs to the router when its module's class is a router
(:data:`ROUTER_CLASSES`: transformers' ``*Router``/``*TopKRouter`` modules, older remote
code's ``*MoEGate``/``*TopKGating``) or a model patch recorded it inside
``annotate(moe_router=True)`` (a patch that routes outside the router module: Llama 4's).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from zrt_core.capture.recorder import RawOp, fallback_category
from zrt_core.formulas.registry import FormulaRegistry, OpCall, OpFormula
from zrt_core.ir.graph import Category, LayerTemplate, OpGraph, OpNode

_INTERNAL_ATTRS = ("annotated",)

#: Module classes whose ops (the gate GEMM aside) are an MoE router's.
ROUTER_CLASSES = ("*Router", "*TopKGating", "*TopkGating", "*MoEGate", "*MoeGate")

#: Categories a router's op keeps: its GEMM is priced as a GEMM; views cost nothing.
_NOT_ROUTING = frozenset({Category.MATMUL, Category.VIEW, Category.COLLECTIVE})


@lru_cache(maxsize=512)
def is_router_class(module_class: str) -> bool:
    """Whether a module class is an MoE router (:data:`ROUTER_CLASSES`)."""
    return any(fnmatch.fnmatchcase(module_class, p) for p in ROUTER_CLASSES)


def router_category(raw: RawOp, category: str) -> str:
    """``moe_router`` for a router's op that is not its GEMM or a view; else ``category``."""
    if raw.zero_cost or category in _NOT_ROUTING:
        return category
    if raw.attrs.get("moe_router") or is_router_class(raw.module_class):
        return Category.MOE_ROUTER
    return category


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
        category = router_category(raw, category)
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
