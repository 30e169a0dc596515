"""The ``Fusion`` transform and :func:`fuse`: a platform's packs, then the generic ones, rule
after rule, over one graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attrs import field, frozen

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.fusion.engine import _Engine
from zrt_core.transforms.fusion.rules import FusionRulePack, packs_for_platform

if TYPE_CHECKING:
    from zrt_core.transforms.base import TransformContext


# -- the transform ----------------------------------------------------------------------


@frozen
class Fusion:
    """The fusion transform: applies the rule packs of the hardware's platform.

    :param packs: the packs to choose from; None takes every pack the context's plugin
        host collected (``host.fusion_rules``).
    :param platform: overrides ``ctx.platform`` (``cuda``, ``ascend``, ``generic``).
    """

    packs: tuple[FusionRulePack, ...] | None = field(
        default=None, converter=lambda v: None if v is None else tuple(v))
    platform: str | None = None
    name: str = "fusion"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        platform = self.platform or ctx.platform
        packs = self.packs if self.packs is not None else tuple(ctx.host.fusion_rules)
        return fuse(graph, packs_for_platform(platform, packs))


def fuse(graph: OpGraph, packs: Sequence[FusionRulePack]) -> OpGraph:
    """Apply ``packs`` in order (see :func:`packs_for_platform`) to one graph.

    Returns ``graph`` itself when nothing matches. Otherwise a new graph whose fused nodes
    have fresh ids (above every id in the graph, ``fused_from`` included), in an order
    that keeps every edge pointing forward; ``meta["fusion"]`` counts the fused nodes per
    rule and records the packs applied.
    """
    engine = _Engine(graph)
    engine.plan_replicas()
    for pack in packs:
        for rule in pack.rules:
            if graph.phase in rule.phases:
                engine.apply_rule(pack, rule)
    engine.replicate()
    return engine.result([p.name for p in packs])
