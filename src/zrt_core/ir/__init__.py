"""The operator-graph IR (see :mod:`zrt_core.ir.graph`)."""

from zrt_core.ir.graph import (
    DTYPE_BYTES,
    SCHEMA,
    SCHEMA_VERSION,
    Category,
    GraphTotals,
    LayerTemplate,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    dtype_bytes,
)

__all__ = [
    "DTYPE_BYTES",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Category",
    "GraphTotals",
    "LayerTemplate",
    "OpGraph",
    "OpNode",
    "Phase",
    "TensorMeta",
    "dtype_bytes",
]
