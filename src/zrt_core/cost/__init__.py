"""Cost backends: price graph nodes on a hardware spec (docs/cost-model.md)."""

from zrt_core.cost.backend import CostBackend, CostBackendSpec, NodeCost, PriceSource
from zrt_core.cost.collectives import collective_cost
from zrt_core.cost.errors import CostError
from zrt_core.cost.measured import MeasuredBackend, MeasuredTable, load_csv
from zrt_core.cost.pricing import CostedGraph, Coverage, build_backends, price_graph
from zrt_core.cost.roofline import RooflineBackend

__all__ = [
    "CostBackend",
    "CostBackendSpec",
    "CostError",
    "CostedGraph",
    "Coverage",
    "MeasuredBackend",
    "MeasuredTable",
    "NodeCost",
    "PriceSource",
    "RooflineBackend",
    "build_backends",
    "collective_cost",
    "load_csv",
    "price_graph",
]
