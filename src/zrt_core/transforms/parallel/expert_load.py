"""The EP pass's view of :class:`~zrt_core.moe_load.ExpertLoad`: experts held per rank (EPLB
redundant experts included) and the busiest rank's routed rows, as layout factors."""

from __future__ import annotations

from fractions import Fraction

from zrt_core.moe_load import ExpertLoad


def expert_share(experts: int, ep: int, load: ExpertLoad | None) -> Fraction:
    """The share of a ``[experts, ...]`` expert weight one EP rank holds: ``1/ep``, or with
    ``R`` EPLB redundant experts ``(experts + R) / (experts · ep)`` (each rank holds
    ``(experts + R)/ep`` physical experts)."""
    redundant = load.redundant if load is not None and experts > 0 else 0
    return Fraction(experts + redundant, experts * ep) if redundant else Fraction(1, ep)


def rank_load_factor(load: ExpertLoad | None, experts: int, ep: int,
                     assignments: int) -> Fraction:
    """The busiest rank's routed rows over the balanced ``assignments/ep``
    (:meth:`ExpertLoad.rank_load`), as an exact-enough fraction for layout arithmetic."""
    if load is None or ep <= 1 or experts <= 1:
        return Fraction(1)
    return Fraction(load.rank_load(experts, ep, assignments)).limit_denominator(1 << 20)
