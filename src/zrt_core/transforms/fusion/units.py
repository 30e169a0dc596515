"""What the fusion engine matches over: groups of nodes in one scope and the units (a node with
its views) a pattern token consumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.ir.graph import Category, OpNode
from zrt_core.transforms.fusion.rules import FusionRule, FusionRulePack

if TYPE_CHECKING:
    pass


# -- the engine -------------------------------------------------------------------------


class _Group:
    """A region fused by one rule (positions of its members in the input graph)."""

    __slots__ = ("alive", "anchor", "cls", "members", "op", "pack", "path", "rule")

    def __init__(self, pack: FusionRulePack, rule: FusionRule, members: list[int], path: str,
                 cls: str, op: str, anchor: int | None) -> None:
        self.pack = pack
        self.rule = rule
        self.members = members
        self.path = path
        self.cls = cls
        self.op = op
        self.anchor = anchor
        self.alive = True


class _Unit:
    """What a pattern token sees: one unfused node, or one earlier fused group."""

    __slots__ = ("category", "fused", "group", "op", "positions")

    def __init__(self, op: str, category: str, positions: list[int], group: int,
                 fused: bool) -> None:
        self.op = op
        self.category = category
        self.positions = positions
        self.group = group
        self.fused = fused


def _is_alias(node: OpNode) -> bool:
    """A zero-cost view: its output is its first input's memory."""
    return node.zero_cost and node.category == Category.VIEW
