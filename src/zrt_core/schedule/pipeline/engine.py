"""The simulation engine: each rank executes its order, an operation starting when the rank is
free and its input has arrived.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from zrt_core.errors import LayoutError
from zrt_core.schedule.pipeline.values import _float_tuple

if TYPE_CHECKING:

    pass


def _cross_rank(dep: np.ndarray, producer_rank: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """``dep`` with every input produced on the consumer's own rank replaced by -1 (a valid
    order runs it earlier on that rank: ``check_schedule``'s orders never deadlock)."""
    return np.where(producer_rank == rank, -1, dep)


def _p2p(p2p_s: float | Sequence[float], p2p_wrap_s: float | None, pp: int
         ) -> tuple[tuple[float, ...], float]:
    boundaries = _float_tuple(p2p_s) or (0.0,)
    if len(boundaries) == 1:
        boundaries = boundaries * max(pp - 1, 1)
    if len(boundaries) != max(pp - 1, 1):
        raise LayoutError(f"p2p_s has {len(boundaries)} entries for pp={pp}",
                          "give one number, or pp - 1 (one per boundary between ranks)")
    if min(boundaries) < 0 or (p2p_wrap_s is not None and p2p_wrap_s < 0):
        raise LayoutError("p2p times must be non-negative",
                          "give transfer times in seconds, ≥ 0")
    wrap = max(boundaries) if p2p_wrap_s is None else float(p2p_wrap_s)
    return boundaries, wrap


class _Engine:
    """Runs each rank's list in order against the cross-rank dependencies.

    Operation ``i`` of a rank has an op id, a second op id (FBW's backward half) or -1, a
    duration, and up to two inputs (op id or -1) with their P2P lags. A rank runs until its
    next operation waits on one not yet done and parks there (an operation has at most one
    waiter on another rank), or until its ``limit``; the completion wakes the parked rank.
    Each operation is visited once, plus once per park: the cost is linear in the
    operations run. The columns become Python lists per rank only for the rows that run.
    Only start times are recorded; waits are read off them afterwards.
    """

    def __init__(self, offsets: np.ndarray, num_ops: int,
                 columns: tuple[np.ndarray, ...]) -> None:
        self.offsets = offsets.tolist()
        ranks = len(self.offsets) - 1
        self.columns = columns
        self.lengths = [self.offsets[r + 1] - self.offsets[r] for r in range(ranks)]
        self.rank_columns: list[list[list]] = [[[] for _ in columns] for _ in range(ranks)]
        self.column_base = [0] * ranks   # the rank's row the column lists start at
        self.built = [0] * ranks         # ... and end at
        self.end = [-1.0] * num_ops
        self.waiter = [-1] * num_ops
        self.free = [0.0] * ranks
        self.pos = [0] * ranks
        # a flat double buffer: stored to from the loop, read by numpy without a copy
        self.start_of = array("d", bytes(8 * self.offsets[-1]))
        self.limit = list(self.lengths)
        self.todo = list(range(ranks - 1, -1, -1))
        # one op id and one input per operation: the lighter loop, and no columns for the rest
        self.single = not (columns[1] >= 0).any() and not (columns[5] >= 0).any()
        self._used = (0, 2, 3, 4) if self.single else tuple(range(len(columns)))

    def _build(self, rank: int, upto: int) -> None:
        lo, base = self.built[rank], self.offsets[rank]
        targets, columns = self.rank_columns[rank], self.columns
        for c in self._used:
            targets[c].extend(columns[c][base + lo:base + upto].tolist())
        self.built[rank] = upto

    def jump(self, rank: int, position: int, free: float) -> None:
        """Continue ``rank`` from ``position`` (rows before it done elsewhere)."""
        self.pos[rank] = self.column_base[rank] = self.built[rank] = position
        self.rank_columns[rank] = [[] for _ in self.columns]
        self.free[rank] = free

    def set_limits(self, limits: list[int]) -> None:
        """Move the barrier; every rank with work below it is tried again (a parked rank
        just parks again)."""
        self.limit = list(limits)
        self.todo[:] = [r for r in range(len(limits) - 1, -1, -1) if self.pos[r] < limits[r]]

    def seed(self, ops: np.ndarray, second: np.ndarray, ends: np.ndarray) -> None:
        """Record operations as done at ``ends`` without running them."""
        end = self.end
        finish = ends.tolist()
        for op, e in zip(ops.tolist(), finish, strict=True):
            end[op] = e
        for op, e in zip(second.tolist(), finish, strict=True):
            if op >= 0:
                end[op] = e

    def run(self) -> None:
        if self.single:
            self._run_single()
            return
        end, waiter, free, pos = self.end, self.waiter, self.free, self.pos
        start_of, limit, offsets = self.start_of, self.limit, self.offsets
        todo = self.todo
        pop, push = todo.pop, todo.append
        while todo:
            r = pop()
            if self.built[r] < limit[r]:
                self._build(r, limit[r])
            ops, second, durations, deps, lags, deps2, lags2 = self.rank_columns[r]
            cb = self.column_base[r]
            i, t, n, base = pos[r] - cb, free[r], limit[r] - cb, offsets[r] + cb
            while i < n:
                start = t
                d = deps[i]
                if d >= 0:
                    e = end[d]
                    if e < 0.0:
                        waiter[d] = r
                        break
                    e += lags[i]
                    if e > start:
                        start = e
                d = deps2[i]
                if d >= 0:
                    e = end[d]
                    if e < 0.0:
                        waiter[d] = r
                        break
                    e += lags2[i]
                    if e > start:
                        start = e
                t = start + durations[i]
                start_of[base + i] = start
                a = ops[i]
                end[a] = t
                if waiter[a] >= 0:
                    push(waiter[a])
                b = second[i]
                if b >= 0:
                    end[b] = t
                    if waiter[b] >= 0:
                        push(waiter[b])
                i += 1
            pos[r], free[r] = i + cb, t

    def _run_single(self) -> None:
        """:meth:`run` for orders whose operations have one input and one op id each
        (every schedule but DualPipe's paired chunks): the same loop, less per step."""
        end, waiter, free, pos = self.end, self.waiter, self.free, self.pos
        start_of, limit, offsets = self.start_of, self.limit, self.offsets
        todo = self.todo
        pop, push = todo.pop, todo.append
        while todo:
            r = pop()
            if self.built[r] < limit[r]:
                self._build(r, limit[r])
            ops, _second, durations, deps, lags, _deps2, _lags2 = self.rank_columns[r]
            cb = self.column_base[r]
            i, t, n, base = pos[r] - cb, free[r], limit[r] - cb, offsets[r] + cb
            while i < n:
                d = deps[i]
                if d >= 0:
                    e = end[d]
                    if e < 0.0:
                        waiter[d] = r
                        break
                    e += lags[i]
                    if e > t:
                        start_of[base + i] = e
                        t = e + durations[i]
                    else:
                        start_of[base + i] = t
                        t += durations[i]
                else:
                    start_of[base + i] = t
                    t += durations[i]
                a = ops[i]
                end[a] = t
                w = waiter[a]
                if w >= 0:
                    push(w)
                i += 1
            pos[r], free[r] = i + cb, t

    def starts(self) -> np.ndarray:
        """Every row's start so far (a view of the loop's buffer)."""
        return np.frombuffer(self.start_of, dtype=np.float64)

    def done(self) -> bool:
        return self.pos == self.lengths

    def check_done(self) -> None:
        stuck = [r for r, (p, n) in enumerate(zip(self.pos, self.lengths, strict=True))
                 if p < n]
        if stuck:  # an order that deadlocks is a bug in this module, not bad input
            raise RuntimeError(f"pipeline order deadlocks on ranks {stuck}")
