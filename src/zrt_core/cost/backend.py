"""The cost-backend contract: price one graph node on one hardware spec.

Backends are contributed through the ``zrt_cost_backends`` hook as
:class:`CostBackendSpec` values. For a given hardware the spec's factory builds a backend
(or returns None when it does not serve that hardware). Selection is per node: backends
are asked in descending priority and the first :class:`NodeCost` wins; the built-in
roofline has the lowest priority and prices everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from attrs import field, frozen

from zrt_core.ir.graph import _frozen_mapping

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.ir.graph import OpNode
    from zrt_core.plugins import PluginHost


class PriceSource:
    """Where a node's time came from."""

    MEASURED = "measured"          # an exact row of a measured table
    INTERPOLATED = "interpolated"  # neighbouring rows of a measured table
    ROOFLINE = "roofline"          # the analytic roofline model
    FREE = "free"                  # a view or metadata op: zero by definition

    ALL = (MEASURED, INTERPOLATED, ROOFLINE, FREE)


@frozen
class NodeCost:
    """The price of one execution of one node on one device.

    :param time_s: wall time of the kernel (or collective), overhead included.
    :param compute_s: FLOPs over achievable compute.
    :param memory_s: bytes over achievable bandwidth (HBM, or the link for a collective).
    :param overhead_s: fixed launch or latency cost.
    :param backend: the backend that priced it.
    :param rule: the rule inside that backend ("gemm", "flash_attention", "ring_all_reduce").
    :param source: one of :class:`PriceSource`.
    :param bound: "compute", "memory", "network", "latency" or "free".
    :param detail: numbers the rule used (efficiency, tier...), for "where did this come from".
    """

    time_s: float
    backend: str
    rule: str
    source: str
    compute_s: float = 0.0
    memory_s: float = 0.0
    overhead_s: float = 0.0
    bound: str = "compute"
    detail: Mapping[str, Any] = field(factory=dict, converter=_frozen_mapping)


class CostBackend(Protocol):
    """Prices nodes; returns None for a node it does not cover."""

    name: str

    def price(self, node: OpNode) -> NodeCost | None: ...


@frozen
class CostBackendSpec:
    """A contributed backend.

    :param factory: ``(hardware, host) -> backend | None``; None when the backend has
        nothing for that hardware (a measured table for another GPU, say).
    :param priority: higher is asked first; the roofline is ``-1000``.
    """

    name: str
    factory: Callable[[HardwareSpec, PluginHost], CostBackend | None]
    priority: int = 0
    description: str = ""
