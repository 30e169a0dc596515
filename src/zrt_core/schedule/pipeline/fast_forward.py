"""Steady-state fast-forward: a rank's order repeats a block whose micro-batches advance by a
fixed shift, so the simulation skips whole periods once their timing repeats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from attrs import frozen

from zrt_core.schedule.pipeline.engine import _Engine

if TYPE_CHECKING:
    from collections.abc import Callable



# Steady-state pattern of each schedule: a rank's order repeats a block of ``length`` rows
# whose micro-batches advance by ``shift`` (per stage), as in its 1F1B-style steady phase.
_STEADY: dict[str, Callable[[int, int], tuple[int, int]]] = {
    "gpipe": lambda pp, vp: (1, 1),
    "1f1b": lambda pp, vp: (2, 1),
    "zb-h1": lambda pp, vp: (3, 1),
    "interleaved": lambda pp, vp: (2 * pp * vp, pp),
    "zb-v": lambda pp, vp: (6, 1),
    "dualpipe": lambda pp, vp: (2, 1),
    "dualpipev": lambda pp, vp: (2, 1),
}

#: A steady phase shorter than this many blocks on some rank is simulated, not skipped.
_MIN_BLOCKS = 12


def _runs(mask: np.ndarray, minimum: int) -> list[tuple[int, int]]:
    """(start, length) of every run of True at least ``minimum`` long, in order."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b - a)) for a, b in zip(edges[0::2], edges[1::2], strict=True)
            if b - a >= minimum]


@frozen(eq=False)
class _Steady:
    """A schedule shape's steady phases, found from its order alone (:func:`_steady_phases`):
    per phase, each rank's first row and the phase's block offsets and reach."""

    length: int
    firsts: tuple[np.ndarray, ...]
    plans: tuple[_PhasePlan, ...]


def _steady_phases(rows: np.ndarray, offsets: np.ndarray,
                   steady: Callable[[int, int], tuple[int, int]] | None, pp: int, vp: int,
                   first_op: np.ndarray, second_op: np.ndarray, dep: np.ndarray,
                   dep2: np.ndarray) -> _Steady | None:
    """The steady phases :func:`_fast_forward` may skip, None when it cannot: in each,
    every rank repeats a block of ``length`` rows whose micro-batches advance by ``shift``
    (the long runs only: a schedule's steady phase(s), not short repeats in warm-up), with
    the per-rank block offsets that keep every input behind a barrier."""
    if steady is None:
        return None
    length, shift = steady(pp, vp)
    ranks = len(offsets) - 1
    n_rows = len(rows)
    # The steady phases of each rank: runs where row i + length repeats row i shifted.
    a, b = rows[:-length], rows[length:]
    same = ((a[:, 0] == b[:, 0]) & (a[:, 1] == b[:, 1]) & (a[:, 3] == b[:, 3])
            & (b[:, 2] - a[:, 2] == shift) & ((a[:, 4] < 0) | (b[:, 4] - a[:, 4] == shift)))
    phases: list[list[tuple[int, int]]] = []
    for r in range(ranks):
        lo, hi = int(offsets[r]), int(offsets[r + 1])
        if hi - lo <= length:
            return None
        found_runs = _runs(same[lo:hi - length], max(_MIN_BLOCKS * length, (hi - lo) // 4))
        phases.append([(lo + s, (n + length) // length) for s, n in found_runs])
    if not phases[0] or any(len(p) != len(phases[0]) for p in phases):
        return None
    row_of_op = np.full(int(max(first_op.max(), second_op.max())) + 1, -1, dtype=np.int64)
    row_of_op[first_op] = np.arange(n_rows)
    paired = np.flatnonzero(second_op >= 0)
    row_of_op[second_op[paired]] = paired
    rank_of_row = np.repeat(np.arange(ranks), np.diff(offsets))
    firsts: list[np.ndarray] = []
    plans: list[_PhasePlan] = []
    for phase in range(len(phases[0])):
        first_arr = np.array([phases[r][phase][0] for r in range(ranks)])
        blocks_arr = np.array([phases[r][phase][1] for r in range(ranks)])
        plan = _phase_plan(first_arr, blocks_arr, length, offsets, rank_of_row, row_of_op,
                           dep, dep2)
        if plan is None:
            return None
        firsts.append(first_arr)
        plans.append(plan)
    return _Steady(length, tuple(firsts), tuple(plans))


def _fast_forward(engine: _Engine, steady: _Steady | None, offsets: np.ndarray,
                  first_op: np.ndarray, second_op: np.ndarray
                  ) -> tuple[np.ndarray, int] | None:
    """Run ``engine`` skipping the periodic part of each steady phase of ``steady``: every
    row's start and how many rows were skipped; None when it cannot.

    In a steady phase every rank repeats a block of operations with micro-batches shifted.
    Ranks run block by block behind a barrier (per-rank block offsets keep every
    dependency behind it). Once the last ``window`` blocks of each rank ``r`` — all that
    later blocks depend on — equal its ``window`` blocks ``c`` earlier shifted by ``Δ_r``,
    and no rank takes inputs from one drifting later than itself (``Δ_giver ≤ Δ_taker``, so
    an input that does not bind never will), every later block is computed from inputs so
    shifted: it is the block ``c`` earlier shifted by ``Δ_r``. The skipped blocks get their
    starts that way, the window before the jump seeds the engine, and the rest runs
    normally. Exact up to floating-point rounding (``tests/schedule`` compares it with the
    plain run). Whenever a step does not hold (no pattern, a barrier that deadlocks, an
    input outside the window) the caller simulates everything.
    """
    if steady is None:
        return None
    skipped_rows: list[np.ndarray] = []
    skipped_starts: list[np.ndarray] = []
    seeded = [0]
    duration = engine.columns[2]

    def run_to(limits: list[int]) -> bool:
        """Run to the barrier; if a rank waits on a skipped operation beyond the seeded
        window (a later phase reaching back), record every skipped one and go on."""
        engine.set_limits(limits)
        engine.run()
        if engine.pos == limits:
            return True
        if seeded[0] == len(skipped_rows):
            return False
        for idx, values in zip(skipped_rows[seeded[0]:], skipped_starts[seeded[0]:],
                               strict=True):
            engine.seed(first_op[idx], second_op[idx], values + duration[idx])
        seeded[0] = len(skipped_rows)
        engine.set_limits(limits)
        engine.run()
        return engine.pos == limits

    for first_arr, plan in zip(steady.firsts, steady.plans, strict=True):
        if not _skip_phase(engine, plan, first_arr, steady.length, offsets, first_op,
                           second_op, skipped_rows, skipped_starts, run_to):
            return None
    if not run_to(list(engine.lengths)):
        return None
    start = engine.starts().copy()
    for idx, values in zip(skipped_rows, skipped_starts, strict=True):
        start[idx] = values
    return start, sum(len(idx) for idx in skipped_rows)


@frozen
class _PhasePlan:
    offsets: tuple[int, ...]   # per-rank block offsets
    window: int                # blocks later blocks depend on
    last: int                  # the last global block every rank has
    needs: tuple[tuple[int, int], ...]  # (rank, rank it takes inputs from), ranks differ


def _phase_plan(first_arr: np.ndarray, blocks_arr: np.ndarray, length: int,
                offsets: np.ndarray, rank_of_row: np.ndarray, row_of_op: np.ndarray,
                dep: np.ndarray, dep2: np.ndarray) -> _PhasePlan | None:
    """Per-rank block offsets (difference constraints o_r' ≥ o_r + δ for an input δ blocks
    ahead on rank r', solved by longest paths) and how deep inputs reach, read off two
    blocks in the middle of the phase."""
    ranks = len(first_arr)
    middle = int(blocks_arr.min()) // 2
    src = (first_arr[:, None] + middle * length + np.arange(2 * length)[None, :]).reshape(-1)
    constraints: dict[tuple[int, int], int] = {}
    pairs: list[tuple[int, int, int]] = []
    for d in (dep, dep2):
        has = d[src] >= 0
        s = src[has]
        t = row_of_op[d[s]]
        r1, r2 = rank_of_row[s], rank_of_row[t]
        local_t = t - first_arr[r2]
        if (local_t >= blocks_arr[r2] * length).any():
            return None  # an input past the phase: no barrier inside it can hold
        inside = local_t >= 0  # inputs before the phase run before any barrier in it
        s, r1, r2, local_t = s[inside], r1[inside], r2[inside], local_t[inside]
        delta = local_t // length - (s - first_arr[r1]) // length
        for x, y, dl in set(zip(r1.tolist(), r2.tolist(), delta.tolist(), strict=True)):
            constraints[(x, y)] = max(constraints.get((x, y), dl), dl)
            pairs.append((x, y, dl))
    offs = [0] * ranks
    for _ in range(ranks + 1):
        changed = False
        for (x, y), dl in constraints.items():
            if offs[y] < offs[x] + dl:
                offs[y] = offs[x] + dl
                changed = True
        if not changed:
            break
    else:
        return None
    low = min(offs)
    offs = [o - low for o in offs]
    reach = max([offs[y] - offs[x] - dl for x, y, dl in pairs] + [0])
    last = min(int(blocks_arr[r]) - offs[r] for r in range(ranks))
    needs = tuple(sorted({(x, y) for x, y, _ in pairs if x != y}))
    return _PhasePlan(tuple(offs), reach + 1, last, needs)


def _skip_phase(engine: _Engine, plan: _PhasePlan, first_arr: np.ndarray, length: int,
                offsets: np.ndarray, first_op: np.ndarray, second_op: np.ndarray,
                skipped_rows: list[np.ndarray], skipped_starts: list[np.ndarray],
                run_to: Callable[[list[int]], bool]) -> bool:
    """Barrier, detect the period, jump (see :func:`_fast_forward`). False: give up."""
    ranks = len(first_arr)
    offs = np.array(plan.offsets)
    window, last, needs = plan.window, plan.last, plan.needs
    local_first = first_arr - np.asarray(offsets[:-1])

    def limits_at(j: int) -> list[int]:
        return (local_first + (j + offs) * length).tolist()

    def rows_of(j0: int, j1: int) -> np.ndarray:
        """Rows (ranks × blocks × length) of global blocks [j0, j1)."""
        blk = np.arange(j0, j1)
        return (first_arr[:, None, None] + (blk[None, :, None] + offs[:, None, None]) * length
                + np.arange(length)[None, None, :])

    max_cycle = 2 * ranks + 4
    stride = max(1, min(ranks // 4, last // 16))
    j = window + 1
    found = None
    while j + 1 < last:
        if not run_to(limits_at(j)):
            return False
        found = _find_period(engine.starts(), rows_of, j, window, max_cycle, needs)
        if found is not None:
            break
        j += stride
    if found is None:
        return True  # no period found: the phase simply runs
    c, delta, last_period = found
    periods = (last - j) // c
    if periods <= 0:
        return True
    target = j + periods * c
    # blocks j .. target-1: block j + k·c + i repeats block j - c + i shifted (k + 1)·Δ
    skipped = rows_of(j, target)
    k = np.arange(target - j) // c + 1
    i = np.arange(target - j) % c
    starts = last_period[:, i, :] + delta[:, None, None] * k[None, :, None]
    skipped_rows.append(skipped.reshape(-1))
    skipped_starts.append(starts.reshape(-1))
    # seed the engine with the window before ``target`` as if it had run it
    duration = engine.columns[2]
    seed_local = np.arange(target - window, target) - j
    seed = skipped[:, seed_local, :].reshape(-1)
    engine.seed(first_op[seed], second_op[seed],
                starts[:, seed_local, :].reshape(-1) + duration[seed])
    last_row = skipped[:, -1, -1]
    last_end = starts[:, -1, -1] + duration[last_row]
    resume = limits_at(target)
    for r in range(ranks):
        engine.jump(r, resume[r], float(last_end[r]))
    return True


def _find_period(starts: np.ndarray, rows_of: Callable[[int, int], np.ndarray], j: int,
                 window: int, max_cycle: int, needs: tuple[tuple[int, int], ...]
                 ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The smallest cycle ``c`` such that, on every rank, the last ``window`` blocks before
    global block ``j`` equal the ``window`` blocks ``c`` earlier shifted by one step
    ``Δ_r > 0`` (to ``1e-9`` of the latest start), with no rank taking inputs from one
    that drifts later (``Δ_giver ≤ Δ_taker``): ``(c, Δ per rank, the last c blocks)``.

    Candidates are screened on the last block alone (a cycle whose last block does not
    repeat cannot hold over the window), then the first that passes is checked in full.
    """
    cycles = min(max_cycle, j - window)
    if cycles < 1:
        return None
    # the last block and the ``cycles`` blocks before it: ranks × (cycles + 1) × length
    tail = rows_of(j - 1 - cycles, j)
    tail_t = starts[tail]
    last = tail_t[:, -1:, :]
    diff = last - tail_t[:, -2::-1, :]                  # ranks × C × length, c = 1..C
    spread = diff.max(axis=2) - diff.min(axis=2)
    tolerance = 1e-9 * max(float(np.abs(last).max()), 1e-30)
    screened = np.flatnonzero((spread <= tolerance).all(axis=0))
    if not len(screened):
        return None
    hist = starts[rows_of(j - window - cycles, j)]        # ranks × (window + C) × length
    for index in screened.tolist():
        c = index + 1
        recent = hist[:, -window:, :]
        earlier = hist[:, cycles - c:cycles - c + window, :]
        d = recent - earlier                             # ranks × window × length
        step = d[:, 0, 0]
        tol = 1e-9 * max(float(np.abs(recent).max()), 1e-30)
        if ((d.max(axis=(1, 2)) - d.min(axis=(1, 2))) > tol).any() or (step <= 0).any():
            continue
        # a rank may run ahead of one it takes inputs from only if those inputs never bind:
        # the giver must not drift later (step of the giver ≤ step of the taker)
        if any(step[giver] > step[taker] + tol for taker, giver in needs):
            continue
        return c, step, hist[:, -c:, :]
    return None


def _p2p_waits(start: np.ndarray, end: np.ndarray, duration: np.ndarray, offsets: np.ndarray,
               first_op: np.ndarray, second_op: np.ndarray, dep: np.ndarray, lag: np.ndarray,
               dep2: np.ndarray, lag2: np.ndarray) -> list[float]:
    """Per rank, idle time spent waiting on a transfer in flight.

    An operation that starts after its rank frees up waited on the input that arrived last;
    of that wait, the part inside the input's transfer (at most its lag) is exposed P2P,
    the rest is the bubble. Ties go as in the engine: the rank's own free time first, then
    the first input. Only operations that started late are looked at.
    """
    n = len(start)
    free = np.empty(n)
    free[0] = 0.0
    free[1:] = end[:-1]
    firsts = offsets[:-1]
    free[firsts[firsts < n]] = 0.0
    late = np.flatnonzero(start > free)
    if not len(late):
        return [0.0] * (len(offsets) - 1)
    end_of_op = np.zeros(int(max(first_op.max(), second_op.max())) + 1)
    end_of_op[first_op] = end
    paired = second_op >= 0
    end_of_op[second_op[paired]] = end[paired]
    free_l, start_l = free[late], start[late]
    d, d2 = dep[late], dep2[late]
    ready_a = np.where(d >= 0, end_of_op[np.maximum(d, 0)] + lag[late], -np.inf)
    ready_b = np.where(d2 >= 0, end_of_op[np.maximum(d2, 0)] + lag2[late], -np.inf)
    take_a = ready_a > free_l
    first = np.where(take_a, ready_a, free_l)
    binding = np.where(ready_b > first, lag2[late], np.where(take_a, lag[late], 0.0))
    wait = np.where(binding > 0, np.minimum(start_l - free_l, binding), 0.0)
    rank = np.searchsorted(firsts, late, side="right") - 1
    return np.bincount(rank, weights=wait, minlength=len(firsts)).tolist()
