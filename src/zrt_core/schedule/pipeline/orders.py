"""Operation orders, as the papers and reference code define them (GPipe, 1F1B, interleaved
1F1B, ZB-H1, ZB-V, DualPipe, DualPipeV).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from zrt_core.limits import check_schedule
from zrt_core.schedule.pipeline.values import BW, FBW, B, F, W

if TYPE_CHECKING:

    pass


# -- operation orders, as the papers and reference code define them ----------------------------
#
# A rank's order is an int array of rows (kind, stage, micro-batch, stage2, micro-batch2);
# stage2/micro-batch2 are -1 except for FBW, where they name the backward half. Every
# schedule here processes a stage's micro-batches first-in first-out per pass kind, so the
# regular schedules build kinds and stages and number the micro-batches afterwards.


def _fifo(keys: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same key (0, 1, 2, ...)."""
    if not len(keys):
        return keys
    # small non-negative keys sort as 16-bit integers: numpy's stable sort is a radix sort
    narrow = keys.astype(np.uint16) if 0 <= keys.min() and keys.max() < 1 << 16 else keys
    order = np.argsort(narrow, kind="stable")
    sorted_keys = keys[order]
    group_start = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    sizes = np.diff(np.concatenate((group_start, [len(keys)])))
    count = np.arange(len(keys)) - np.repeat(group_start, sizes)
    out = np.empty_like(count)
    out[order] = count
    return out


class _Seq:
    """Every rank's order as kind/stage sequences built from repeated patterns.

    ``put`` appends a pattern ``times`` times to the current rank; ``next_rank`` closes it.
    Micro-batches are numbered first-in first-out per rank, pass and stage: a stage's
    forwards (F and FBW's forward half) in order, its backwards (B, BW and FBW's backward
    half) in order, its W passes in order. ``put`` numbers its pattern from the rank's
    running counters (a key seen ``q`` times in the pattern advances ``q`` per repetition),
    so ``rows()`` only expands the patterns. A W given without a stage takes the
    micro-batch and stage of the oldest split B on its rank not yet followed by its W (the
    FIFO DualPipe's WeightGradStore keeps).
    """

    def __init__(self) -> None:
        # the patterns, one after another: kind, stage, stage2, base and step of the
        # micro-batch numbers of each half (rep t numbers base + t·step)
        self.columns: tuple[list[int], ...] = ([], [], [], [], [], [], [])
        self.seg_plen: list[int] = []
        self.seg_times: list[int] = []
        self.seg_rank: list[int] = []
        self.lengths: list[int] = []
        self._open = 0
        self._count: dict[tuple[int, int], int] = {}

    def put(self, kinds: Sequence[int], stages: Sequence[int], seconds: Sequence[int] | None
            = None, times: int = 1) -> None:
        if times <= 0:
            return
        kind = [int(k) for k in kinds]
        stage = [int(x) for x in stages]
        plen = len(kind)
        second = [int(x) for x in seconds] if seconds is not None else [-1] * plen
        base1, base2 = [-1] * plen, [-1] * plen
        step1, step2 = [0] * plen, [0] * plen
        stage2 = [-1] * plen
        count = self._count
        seen: dict[tuple[int, int], int] = {}
        numbered: list[tuple[int, int, tuple[int, int]]] = []  # (position, half, key)
        for p, k in enumerate(kind):
            if k != W or stage[p] >= 0:
                key = (0 if k in (F, FBW) else 1 if k in (B, BW) else 2, stage[p])
                numbered.append((p, 1, key))
            if k == FBW:  # the backward half is counted after the forward half
                stage2[p] = second[p]
                numbered.append((p, 2, (1, second[p])))
        for p, half, key in numbered:
            index = seen.get(key, 0)
            seen[key] = index + 1
            (base1 if half == 1 else base2)[p] = count.get(key, 0) + index
        for p, half, key in numbered:
            (step1 if half == 1 else step2)[p] = seen[key]
        for key, q in seen.items():
            count[key] = count.get(key, 0) + q * times
        for column, values in zip(self.columns, (kind, stage, stage2, base1, step1, base2,
                                                 step2), strict=True):
            column.extend(values)
        self.seg_plen.append(plen)
        self.seg_times.append(times)
        self.seg_rank.append(len(self.lengths))
        self._open += plen * times

    def next_rank(self) -> None:
        self.lengths.append(self._open)
        self._open = 0
        self._count = {}

    def rows(self) -> np.ndarray:
        plens = np.array(self.seg_plen)
        sizes = plens * np.array(self.seg_times)
        n = int(sizes.sum())
        out = np.empty((n, 5), dtype=np.int32)
        # row r of segment g is pattern row (r - start_g) mod plen_g, repetition (...) // plen_g
        seg = np.repeat(np.arange(len(plens), dtype=np.int32), sizes)
        within = np.arange(n, dtype=np.int32)
        within -= np.repeat((np.cumsum(sizes) - sizes).astype(np.int32), sizes)
        plen = plens.astype(np.int32)[seg]
        rep, pos = np.divmod(within, plen)
        src = pos
        src += (np.cumsum(plens) - plens).astype(np.int32)[seg]
        del seg, within, plen, pos

        def column(c: int) -> np.ndarray:
            return np.array(self.columns[c], dtype=np.int32)[src]

        kind = column(0)
        out[:, 0] = kind
        out[:, 1] = column(1)
        base, step = column(3), column(4)
        out[:, 2] = np.where(base >= 0, base + rep * step, -1)
        if FBW in self.columns[0]:
            out[:, 3] = column(2)
            base, step = column(5), column(6)
            out[:, 4] = np.where(base >= 0, base + rep * step, -1)
        else:
            out[:, 3:] = -1
        queued = np.flatnonzero((kind == W) & (out[:, 1] < 0))
        if len(queued):
            rank = np.repeat(np.array(self.seg_rank), sizes)
            split = np.flatnonzero(kind == B)
            first_split = np.searchsorted(rank[split], rank[queued])
            source = split[first_split + _fifo(rank[queued])]
            out[queued, 1] = out[source, 1]
            out[queued, 2] = out[source, 2]
        return out


def _gpipe(pp: int, m: int) -> _Seq:
    seq = _Seq()
    for r in range(pp):
        seq.put([F], [r], times=m)
        seq.put([BW], [r], times=m)
        seq.next_rank()
    return seq


def _one_f_one_b(pp: int, m: int) -> _Seq:
    # PipeDream-flush, as Megatron's forward_backward_pipelining_without_interleaving: rank r
    # warms up with pp - r - 1 forwards, alternates F and B, then drains its backwards.
    seq = _Seq()
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        seq.put([F], [r], times=warmup)
        seq.put([F, BW], [r, r], times=m - warmup)
        seq.put([BW], [r], times=warmup)
        seq.next_rank()
    return seq


def _interleaved(pp: int, vp: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    # Megatron's forward_backward_pipelining_with_interleaving: virtual micro-batch k runs
    # model chunk (k mod pp·vp) // pp (reversed for backward) on micro-batch
    # (k // (pp·vp))·pp + k mod pp; rank r warms up with 2(pp - r - 1) + (vp - 1)·pp
    # virtual micro-batches, then alternates one forward and one backward. That micro-batch
    # is also each stage's first-in first-out count, so the rows are built at once.
    total = m * vp
    ranks = np.arange(pp)
    warmup = np.minimum(2 * (pp - ranks - 1) + (vp - 1) * pp, total)[:, None]
    steady = total - warmup
    p = np.arange(2 * total)[None, :]                       # position in the rank's order
    in_steady = (p >= warmup) & (p < warmup + 2 * steady)
    idx = p - warmup
    forward = (p < warmup) | (in_steady & (idx % 2 == 0))
    k = np.where(p < warmup, p,
                 np.where(in_steady, np.where(forward, warmup + idx // 2, idx // 2),
                          p - warmup - steady))             # the cool-down's backwards
    chunk = (k % (pp * vp)) // pp
    chunk = np.where(forward, chunk, vp - 1 - chunk)
    rows = np.full((pp, 2 * total, 5), -1, dtype=np.int32)
    rows[:, :, 0] = np.where(forward, F, BW)
    rows[:, :, 1] = chunk * pp + ranks[:, None]
    rows[:, :, 2] = (k // (pp * vp)) * pp + k % pp
    return rows.reshape(-1, 5), np.full(pp, 2 * total)


def _zb_h1(pp: int, m: int) -> _Seq:
    # Qi et al. 2023, ZB-H1 (as PaddlePaddle's pipeline_scheduler_ZBH1 writes it): 1F1B's
    # order with backward split; rank r holds back r of its W passes, which then fill the
    # cool-down. Peak memory is pp micro-batches on every rank, 1F1B's first-rank peak.
    seq = _Seq()
    for r in range(pp):
        seq.put([F], [r], times=pp - r)
        seq.put([B], [r])
        seq.put([F, B], [r, r], times=r)
        seq.put([W], [r])
        seq.put([F, B, W], [r, r, r], times=m - pp)
        seq.put([B, W], [r, r], times=pp - r - 1)
        seq.put([W], [r], times=r)
        seq.next_rank()
    return seq


def _zb_v(pp: int, m: int) -> _Seq:
    # The handcrafted ZB-V of Qi et al. (sail-sg/zero-bubble-pipeline-parallelism,
    # handcrafted_zb_v): two chunks per rank in a V, chunk 0 = stage r, chunk 1 = stage
    # 2pp-1-r. Warm-up F0 × (2(pp-r) - 1), (F1 F0) × r, (F1 B1 W1) × (pp - r); steady
    # F0 B0 W0 F1 B1 W1 while F0 remains, then B0 W0 F1 B1 W1 until F1 catches up; cool-down
    # (B0 B1) × r, (B0 W0) × (pp - r), the r W1 and r W0 left. It is written for
    # n = max(2pp - 1, m) micro-batches; simulate() drops those past m, which keeps every
    # remaining dependency in order.
    n = max(2 * pp - 1, m)
    seq = _Seq()
    for r in range(pp):
        s0, s1 = r, 2 * pp - 1 - r
        seq.put([F], [s0], times=2 * (pp - r) - 1)
        seq.put([F, F], [s1, s0], times=r)
        seq.put([F, B, W], [s1, s1, s1], times=pp - r)
        seq.put([F, B, W, F, B, W], [s0, s0, s0, s1, s1, s1], times=n - (2 * pp - r - 1))
        seq.put([B, W, F, B, W], [s0, s0, s1, s1, s1], times=pp - r - 1)
        seq.put([B, B], [s0, s1], times=r)
        seq.put([B, W], [s0, s0], times=pp - r)
        seq.put([W], [s1], times=r)
        seq.put([W], [s0], times=r)
        seq.next_rank()
    return seq


def _dualpipe_like(pp: int, m: int, *, v_shape: bool) -> _Seq:
    # deepseek-ai/DualPipe: dualpipe.py (DualPipe) and dualpipev.py (DualPipeV), its eight
    # steps verbatim. DualPipe: rank r holds stage r of the pipeline fed at rank 0 (virtual
    # stages 0..pp-1, "down") and stage pp-1-r of the one fed at rank pp-1 ("up", virtual
    # stage 2pp-1-r); half the micro-batches go each way. For the first half of the ranks
    # phase 0 is "down", for the second half "up". DualPipeV: one pipeline folded in a V,
    # rank r holds stages r (phase 0) and 2pp-1-r (phase 1). A split backward queues its W;
    # each W step runs the oldest queued one.
    seq = _Seq()
    for rank in range(pp):
        if v_shape:
            ranks, half, chunks = pp, rank, m
            s0, s1 = rank, 2 * pp - 1 - rank
            middle = rank == pp - 1
        else:
            ranks, half, chunks = pp // 2, min(rank, pp - 1 - rank), m // 2
            down, up = rank, 2 * pp - 1 - rank
            s0, s1 = (down, up) if rank < pp // 2 else (up, down)
            middle = rank in (pp // 2 - 1, pp // 2)
        seq.put([F], [s0], times=(ranks - half - 1) * 2)              # step 1: nF0
        seq.put([F, F], [s0, s1], times=half + 1)                     # step 2: nF0F1
        seq.put([B, W, F], [s1, -1, s1], times=ranks - half - 1)      # step 3: nB1W1F1
        main = chunks - 2 * ranks + half + 1                          # step 4: nF0B1F1B0
        if middle:  # the first pair is not overlapped, "to further reduce bubble size"
            seq.put([F, BW, FBW], [s0, s1, s1], [-1, -1, s0])
            main -= 1
        else:
            seq.put([FBW, FBW], [s0, s1], [s1, s0])
            main -= 1
        seq.put([FBW, FBW], [s0, s1], [s1, s0], times=main)
        seq.put([BW, FBW], [s1, s1], [-1, s0], times=ranks - half - 1)  # step 5: nB1F1B0
        # step 6: nB1B0 — from the middle on, these backwards are split (zero bubble)
        i = np.arange(half + 1)
        mid = (half + 1) // 2
        split1 = (i > mid) | ((i == mid) & (half % 2 == 1))
        split0 = i >= mid
        step6 = np.empty(2 * (half + 1), dtype=np.int64)
        step6[0::2] = np.where(split1, B, BW)
        step6[1::2] = np.where(split0, B, BW)
        seq.put(step6, [s1, s0] * (half + 1))
        seq.put([W, B], [-1, s0], times=ranks - half - 1)             # step 7: nWB0
        seq.put([W], [-1], times=half + 1)                            # step 8: nW
        seq.next_rank()
    return seq


def _orders(schedule: str, pp: int, m: int, vp: int) -> tuple[np.ndarray, np.ndarray]:
    """All ranks' rows (rank-major) and each rank's row count."""
    if schedule == "gpipe":
        seq = _gpipe(pp, m)
    elif schedule == "1f1b":
        seq = _one_f_one_b(pp, m)
    elif schedule == "interleaved":
        return _interleaved(pp, vp, m)
    elif schedule == "zb-h1":
        seq = _zb_h1(pp, m)
    elif schedule == "zb-v":
        seq = _zb_v(pp, m)
    else:
        seq = _dualpipe_like(pp, m, v_shape=schedule == "dualpipev")
    rows = seq.rows()
    lengths = np.array(seq.lengths)
    if schedule == "zb-v" and m < 2 * pp - 1:
        keep = rows[:, 2] < m
        lengths = np.bincount(np.repeat(np.arange(pp), lengths)[keep], minlength=pp)
        rows = rows[keep]
    return rows, lengths


def schedule_orders(schedule: str, pp: int, microbatches: int, vp: int = 1
                    ) -> list[np.ndarray]:
    """Each rank's operation order: rows of (kind, stage, micro-batch, stage2,
    micro-batch2), kinds indexing :data:`KIND_NAMES`. Micro-batches count per pipeline
    (DualPipe's "up" pipeline numbers its half from 0 too)."""
    check_schedule(schedule, pp, vp, microbatches)
    rows, lengths = _orders(schedule, pp, microbatches, vp)
    return np.split(rows, np.cumsum(lengths)[:-1])
