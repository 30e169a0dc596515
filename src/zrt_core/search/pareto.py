"""Pareto fronts of two objectives over result rows (no point on the front is beaten on one
objective without losing on the other)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any


def pareto_front(rows: Sequence[Mapping[str, Any]], x: str, y: str, *,
                 x_max: bool = True, y_max: bool = True) -> list[int]:
    """Indices into ``rows`` of the non-dominated points of ``(row[x], row[y])``, ordered by
    ``x`` best first. A point is dominated when another is at least as good on both
    objectives and better on one; identical points are all kept. Rows missing either value
    are ignored. One sort and one sweep: O(n log n).
    """
    sx = 1.0 if x_max else -1.0
    sy = 1.0 if y_max else -1.0
    points = [(sx * float(r[x]), sy * float(r[y]), i) for i, r in enumerate(rows)
              if r.get(x) is not None and r.get(y) is not None]
    points.sort(key=lambda p: (-p[0], -p[1], p[2]))
    front: list[int] = []
    best_y = float("-inf")
    for _, group in groupby(points, key=lambda p: p[0]):
        same_x = list(group)
        top = same_x[0][1]  # the best y at this x (sorted best first)
        # a point with a larger x and a y at least as good dominates the whole group
        if top > best_y:
            front.extend(i for _, yy, i in same_x if yy == top)
            best_y = top
    return front
