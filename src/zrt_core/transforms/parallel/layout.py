"""The layout algebra: a tensor's per-rank shape as its global shape split by named groups
(``Layout``: per-axis factors, pending partial sums).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from zrt_core.ir.graph import TensorMeta

if TYPE_CHECKING:
    pass


#: Groups a parallel layout splits tensors over. ``sp`` marks token axes split over the TP
#: ranks (sequence parallelism); its collectives run on the ``tp`` group.
PARALLEL_GROUPS = frozenset({"tp", "sp", "cp", "ep", "etp"})
#: Groups whose split axis is a token axis: a view that splits a merged axis gives them to
#: the innermost (sequence) part that divides; the others take the outermost (heads).
_TOKEN_GROUPS = frozenset({"sp", "cp", "seq", "kv"})

Factors = tuple[tuple[str, Fraction], ...]


# -- layouts ------------------------------------------------------------------------------


class Layout:
    """A tensor's per-rank shape and how it got there.

    ``axes[i]`` lists the ``(group, factor)`` pairs applied to axis ``i`` (new size = old
    size × the product of factors); ``partial`` the groups over which the tensor is a
    partial sum still to be reduced.
    """

    __slots__ = ("axes", "partial", "shape")

    def __init__(self, shape: tuple[int, ...], axes: tuple[Factors, ...],
                 partial: frozenset[str] = frozenset()) -> None:
        self.shape = shape
        self.axes = axes
        self.partial = partial

    @classmethod
    def plain(cls, meta: TensorMeta) -> Layout:
        return cls(meta.shape, ((),) * len(meta.shape))

    def groups(self, axis: int) -> set[str]:
        return {g for g, _ in self.axes[axis]}

    @property
    def changed(self) -> bool:
        return any(self.axes) or bool(self.partial)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Layout({self.shape}, {self.axes}, partial={set(self.partial)})"


def _scaled(old: int, factors: Factors) -> int:
    if old <= 0 or not factors:
        return old
    # in integers (a Fraction per multiplication is the slow part): old × Π num / Π den
    num, den = old, 1
    for _, f in factors:
        num *= f.numerator
        den *= f.denominator
    q, r = divmod(num, den)
    if r == 0:
        return max(q, 1)
    return max(round(Fraction(num, den)), 1)


def _layout(old: tuple[int, ...], axes: Sequence[Factors], partial: Iterable[str] = (),
            sizes: Mapping[int, int] | None = None) -> Layout:
    shape = tuple(sizes[i] if sizes and i in sizes else _scaled(d, axes[i])
                  for i, d in enumerate(old))
    return Layout(shape, tuple(axes), frozenset(partial))


def _merge_factors(a: Factors, b: Factors) -> Factors:
    seen = {g for g, _ in a}
    return a + tuple(p for p in b if p[0] not in seen)


def _product(factors: Factors) -> Fraction:
    v = Fraction(1)
    for _, f in factors:
        v *= f
    return v


def _without(factors: Factors, group: str) -> Factors:
    return tuple(p for p in factors if p[0] != group)
