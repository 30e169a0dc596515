"""Fusion: patterns of ops inside one module scope become one fused op."""

from __future__ import annotations

from typing import Any

from attrs import field, frozen


@frozen
class FusionRulePack:
    """A named set of fusion rules for one platform (``cuda``, ``ascend``, ``generic``)."""

    name: str
    platform: str
    rules: tuple[Any, ...] = field(default=(), converter=tuple)
    source: str = ""
