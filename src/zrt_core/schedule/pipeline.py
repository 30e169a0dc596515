"""Pipeline schedules: an event-level simulation of one training step over pipeline ranks.

Each schedule is written down as the per-rank order of operations its paper or reference
code defines (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1, ZB-V, DualPipe, DualPipeV;
see ``docs/pipeline-schedules.md``). The simulation then runs those orders against the
dependencies between them: a rank executes its list in order, each operation starting when
the rank is free and its input has arrived (the producing operation's end plus the P2P
time of the boundary between the two ranks). Nothing is closed-form; the closed forms of the
papers are what the tests check the simulation against.

Times are per *virtual stage*: ``pp`` stages for GPipe/1F1B/ZB-H1/DualPipe, ``pp × vp`` for
interleaved, ``2 × pp`` for the V-shaped schedules (ZB-V, DualPipeV). Virtual stage ``v``
holds the ``v``-th contiguous group of layers in model order: the first has the embedding,
the last the head and loss, so uneven stages are just uneven times.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from attrs import field, frozen

from zrt_core.errors import LayoutError
from zrt_core.limits import (  # noqa: F401  (SCHEDULES and _check_name: re-exported)
    SCHEDULES,
    _check_name,
    check_schedule,
    virtual_stages,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from zrt_core.hardware import HardwareSpec, InterconnectTier
    from zrt_core.strategy import Parallel


#: Schedules that split backward into B (input gradient) and W (weight gradient).
SPLIT_BACKWARD = frozenset({"zb-h1", "zb-v", "dualpipe", "dualpipev"})

# Operation kinds. BW is a whole backward (input and weight gradients in one pass); FBW is
# DualPipe's overlapped pair, a forward of one chunk with a whole backward of another.
F, B, W, BW, FBW = 0, 1, 2, 3, 4
KIND_NAMES = ("F", "B", "W", "BW", "F+BW")


def _float_tuple(value: float | Sequence[float] | None) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return (float(value),)
    return tuple(float(v) for v in value)


def _required_floats(value: float | Sequence[float]) -> tuple[float, ...]:
    out = _float_tuple(value)
    assert out is not None
    return out


@frozen
class StageTimes:
    """Per-virtual-stage times of one micro-batch (a single number applies to every stage).

    :param forward_s: forward of one micro-batch through the stage.
    :param backward_s: its whole backward, input and weight gradients together.
    :param weight_s: the weight-gradient part of ``backward_s`` (W); the rest is B. The
        zero-bubble schedules and DualPipe need it; the others run backward whole.
    :param forward_comm_s: the part of ``forward_s`` that is communication (EP all-to-all,
        TP collectives) a concurrently running backward chunk can hide (DualPipe's overlap).
    :param backward_comm_s: the same for ``backward_s``.
    :param activation_bytes: activations one micro-batch leaves on the stage until its
        backward frees them (None: report activation only in units).
    """

    forward_s: tuple[float, ...] = field(converter=_required_floats)
    backward_s: tuple[float, ...] = field(converter=_required_floats)
    weight_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    forward_comm_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    backward_comm_s: tuple[float, ...] | None = field(default=None, converter=_float_tuple)
    activation_bytes: tuple[float, ...] | None = field(default=None, converter=_float_tuple)

    def expanded(self, stages: int) -> StageTimes:
        """Every field broadcast to ``stages`` entries; a wrong length is a LayoutError."""
        def fit(name: str, value: tuple[float, ...] | None) -> tuple[float, ...] | None:
            if value is None or len(value) == stages:
                return value
            if len(value) == 1:
                return value * stages
            raise LayoutError(
                f"{name} has {len(value)} entries but the schedule has {stages} virtual stages",
                "give one time per virtual stage (see virtual_stages()) or a single number",
            )

        out = StageTimes(
            forward_s=fit("forward_s", self.forward_s),  # type: ignore[arg-type]
            backward_s=fit("backward_s", self.backward_s),  # type: ignore[arg-type]
            weight_s=fit("weight_s", self.weight_s),
            forward_comm_s=fit("forward_comm_s", self.forward_comm_s),
            backward_comm_s=fit("backward_comm_s", self.backward_comm_s),
            activation_bytes=fit("activation_bytes", self.activation_bytes),
        )
        for name in ("forward_s", "backward_s", "weight_s", "forward_comm_s",
                     "backward_comm_s", "activation_bytes"):
            value = getattr(out, name)
            if value is not None and min(value) < 0:
                raise LayoutError(f"{name} has a negative entry {min(value)}",
                                  "stage times and sizes are non-negative")
        if out.weight_s is not None:
            for v, (b, w) in enumerate(zip(out.backward_s, out.weight_s, strict=True)):
                if w > b:
                    raise LayoutError(
                        f"virtual stage {v}: weight_s {w} exceeds backward_s {b}",
                        "backward_s is the whole backward; weight_s is the part of it "
                        "that computes weight gradients",
                    )
        for comm, whole in (("forward_comm_s", out.forward_s), ("backward_comm_s",
                                                                 out.backward_s)):
            value = getattr(out, comm)
            if value is not None and any(c > t for c, t in zip(value, whole, strict=True)):
                raise LayoutError(f"{comm} exceeds the stage time it is part of",
                                  f"{comm} is the communication inside the stage time")
        return out


@frozen
class PipelineOp:
    """One executed operation: ``kind`` is F, B, W, BW (whole backward) or F+BW (DualPipe's
    overlapped pair, whose ``microbatch``/``stage`` are the forward's and ``other_*`` the
    backward's)."""

    rank: int
    kind: str
    stage: int
    microbatch: int
    start_s: float
    end_s: float
    other_stage: int | None = None
    other_microbatch: int | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@frozen
class RankStats:
    """One pipeline rank over the step. ``busy_s + exposed_p2p_s + bubble_s == total``.

    :param busy_s: time computing its operations.
    :param exposed_p2p_s: idle time spent waiting on an activation or gradient in flight.
    :param bubble_s: the rest of the idle time (waiting for another rank to compute).
    :param warmup_s: from the step start to the start of its first backward.
    :param cooldown_s: from the end of its last forward to its last operation's end.
    :param peak_inflight: most micro-batch activations held at once (one per micro-batch
        per virtual stage on this rank).
    :param peak_activation_units: the same weighted by stage size, in units of one
        micro-batch's activations for ``layers / pp`` layers (1F1B's first rank: ``pp``).
    :param peak_activation_bytes: the same in bytes, when stage activation sizes were given.
    """

    rank: int
    busy_s: float
    exposed_p2p_s: float
    bubble_s: float
    warmup_s: float
    cooldown_s: float
    peak_inflight: int
    peak_activation_units: float
    peak_activation_bytes: float | None = None

    @property
    def steady_s(self) -> float:
        return self.busy_s + self.exposed_p2p_s + self.bubble_s - self.warmup_s - self.cooldown_s


@frozen(eq=False)
class PipelineResult:
    """The simulated step.

    ``total_s`` is the makespan. ``bubble_s``/``exposed_p2p_s``/``busy_s`` are those of the
    critical rank (the busiest one, which has the least idle time), so that
    ``total_s == busy_s + exposed_p2p_s + bubble_s``; per-rank values are in ``ranks``.
    ``bubble_fraction`` is ``bubble_s / total_s``. The operations themselves are kept as
    arrays and become :class:`PipelineOp` values only when asked for (``iter_ops``).
    ``simulated_ops`` of ``num_ops`` went through the event loop; the others are periodic
    steady-state blocks whose times follow exactly from the ones before (see
    ``docs/pipeline-schedules.md``).
    """

    schedule: str
    pp: int
    vp: int
    microbatches: int
    total_s: float
    ranks: tuple[RankStats, ...]
    critical_rank: int
    simulated_ops: int
    _table: _OpTable = field(repr=False, alias="_table")

    @property
    def busy_s(self) -> float:
        return self.ranks[self.critical_rank].busy_s

    @property
    def exposed_p2p_s(self) -> float:
        return self.ranks[self.critical_rank].exposed_p2p_s

    @property
    def bubble_s(self) -> float:
        return self.ranks[self.critical_rank].bubble_s

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.total_s if self.total_s else 0.0

    @property
    def num_ops(self) -> int:
        return len(self._table.kind)

    def iter_ops(self) -> Iterator[PipelineOp]:
        """Every executed operation, rank by rank in execution order."""
        t = self._table
        columns = (t.rank.tolist(), t.kind.tolist(), t.stage.tolist(), t.microbatch.tolist(),
                   t.start.tolist(), t.duration.tolist(), t.stage2.tolist(),
                   t.microbatch2.tolist())
        for rank, kind, v, mb, start, dur, v2, mb2 in zip(*columns, strict=True):
            yield PipelineOp(
                rank=rank, kind=KIND_NAMES[kind], stage=v, microbatch=mb, start_s=start,
                end_s=start + dur, other_stage=v2 if v2 >= 0 else None,
                other_microbatch=mb2 if v2 >= 0 else None)

    @property
    def ops(self) -> tuple[PipelineOp, ...]:
        return tuple(self.iter_ops())


@frozen(eq=False)
class _OpTable:
    """Executed operations as parallel arrays (one row per operation, rank-major)."""

    rank: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    stage2: np.ndarray
    microbatch2: np.ndarray
    start: np.ndarray
    duration: np.ndarray


# -- layout of virtual stages on ranks --------------------------------------------------------


def stage_rank(schedule: str, pp: int, vp: int, stage: int) -> int:
    """The pipeline rank that runs virtual stage ``stage``."""
    if schedule == "interleaved":
        return stage % pp
    if schedule in ("zb-v", "dualpipev"):
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage


def boundary_tiers(hardware: HardwareSpec, parallel: Parallel) -> tuple[InterconnectTier, ...]:
    """The interconnect tier each pipeline boundary crosses, rank ``i`` to ``i + 1`` for
    ``i < pp - 1``, then the wrap-around ``pp - 1`` to 0 (used by interleaved 1F1B).

    Pipeline ranks are ``tp × cp × dp`` global ranks apart (Megatron order, PP outermost).
    All members of a stage send at once, so a boundary takes the outermost tier any of its
    rank pairs needs: a pair shares a tier's domain when both ranks fall in the same
    aligned block of ``tier.devices`` ranks.
    """
    stride = parallel.tp * parallel.cp * parallel.dp
    pp = parallel.pp

    def tier_of(a_stage: int, b_stage: int) -> InterconnectTier:
        worst = 0
        for x in range(stride):
            a, b = a_stage * stride + x, b_stage * stride + x
            for level, tier in enumerate(hardware.interconnect):
                if tier.devices is None or a // tier.devices == b // tier.devices:
                    worst = max(worst, level)
                    break
        return hardware.interconnect[worst]

    tiers = [tier_of(i, i + 1) for i in range(pp - 1)]
    tiers.append(tier_of(pp - 1, 0))
    return tuple(tiers)


def p2p_times_s(
    hardware: HardwareSpec,
    parallel: Parallel,
    message_bytes: float,
    price: Callable[[InterconnectTier, float], float] | None = None,
) -> tuple[tuple[float, ...], float]:
    """P2P time of each boundary and of the wrap-around, for ``simulate(p2p_s=...,
    p2p_wrap_s=...)``.

    :param message_bytes: the activation (= activation-gradient) one rank sends per
        micro-batch.
    :param price: ``(tier, bytes) -> seconds``; the default is the α-β model of the tier:
        ``latency + bytes / (bandwidth × efficiency)``.
    """
    if price is None:
        def price(tier: InterconnectTier, nbytes: float) -> float:
            return tier.latency_us * 1e-6 + nbytes / (
                tier.bandwidth_gb_per_s * 1e9 * tier.efficiency)
    tiers = boundary_tiers(hardware, parallel)
    times = tuple(price(t, message_bytes) for t in tiers)
    return times[:-1], times[-1]


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


# -- the simulation --------------------------------------------------------------------------


def simulate(
    schedule: str,
    times: StageTimes,
    *,
    pp: int,
    microbatches: int,
    vp: int = 1,
    p2p_s: float | Sequence[float] = 0.0,
    p2p_wrap_s: float | None = None,
    overlap_efficiency: float = 1.0,
) -> PipelineResult:
    """Simulate one step of ``schedule``.

    :param times: per virtual stage (``virtual_stages(schedule, pp, vp)`` entries, or one).
    :param p2p_s: time to move one micro-batch's activation (or its gradient) between rank
        ``i`` and ``i + 1``: one number, or ``pp - 1`` numbers (see :func:`p2p_times_s`).
        Transfers are asynchronous (Megatron and DualPipe post them as isend/irecv): they
        delay the receiver, never the sender, so they are hidden in the steady state and
        exposed only where a rank waits on them.
    :param p2p_wrap_s: rank ``pp - 1`` to rank 0 (interleaved's chunk wrap); default the
        slowest boundary.
    :param overlap_efficiency: DualPipe/DualPipeV's overlapped forward+backward pair. Its
        ideal time hides each chunk's communication under the other's computation,
        ``max(f - f_comm + b - b_comm, f_comm + b_comm)``; the pair takes
        ``f + b - overlap_efficiency × (f + b - ideal)``. 0 runs the pair serially.
    :raises LayoutError: when the schedule cannot run the layout (the rule is named).
    """
    check_schedule(schedule, pp, vp, microbatches)
    if not 0.0 <= overlap_efficiency <= 1.0:
        raise LayoutError(f"overlap_efficiency={overlap_efficiency} is outside [0, 1]",
                          "1 hides all communication the pair can hide, 0 none")
    model_stages = virtual_stages(schedule, pp, vp)
    t = times.expanded(model_stages)
    if schedule in SPLIT_BACKWARD and t.weight_s is None:
        raise LayoutError(
            f"{schedule} splits backward into input and weight gradients but no weight_s "
            "was given", "pass StageTimes(weight_s=...) (the weight-gradient part of backward)")
    boundaries, wrap = _p2p(p2p_s, p2p_wrap_s, pp)

    # DualPipe runs two pipelines of pp stages: "down" (virtual stages 0..pp-1) and "up"
    # (pp..2pp-1, rank 2pp-1-v), each with half the micro-batches; the up pipeline's stage v
    # is model stage v - pp.
    if schedule == "dualpipe":
        num_v, per_chain = 2 * pp, microbatches // 2
        model_stage = np.concatenate((np.arange(pp), np.arange(pp)))
        chain_first = np.isin(np.arange(num_v), (0, pp))
        chain_last = np.isin(np.arange(num_v), (pp - 1, 2 * pp - 1))
        rank_of = np.where(np.arange(num_v) < pp, np.arange(num_v),
                           2 * pp - 1 - np.arange(num_v))
    else:
        num_v, per_chain = model_stages, microbatches
        model_stage = np.arange(num_v)
        chain_first = np.arange(num_v) == 0
        chain_last = np.arange(num_v) == num_v - 1
        rank_of = np.array([stage_rank(schedule, pp, vp, v) for v in range(num_v)])

    def link(ra: int, rb: int) -> float:
        if ra == rb:
            return 0.0
        if abs(ra - rb) == 1:
            return boundaries[min(ra, rb)]
        return wrap

    f_lag = np.array([0.0 if chain_first[v] else link(rank_of[v - 1], rank_of[v])
                      for v in range(num_v)])
    b_lag = np.array([0.0 if chain_last[v] else link(rank_of[v + 1], rank_of[v])
                      for v in range(num_v)])
    fwd = np.array(t.forward_s)[model_stage]
    whole = np.array(t.backward_s)[model_stage]
    wgt = np.array(t.weight_s)[model_stage] if t.weight_s else np.zeros(num_v)
    f_comm = np.array(t.forward_comm_s)[model_stage] if t.forward_comm_s else np.zeros(num_v)
    b_comm = np.array(t.backward_comm_s)[model_stage] if t.backward_comm_s else np.zeros(num_v)

    rows, lengths = _orders(schedule, pp, microbatches, vp)
    kind, v, mb, v2, mb2 = (np.ascontiguousarray(c) for c in rows.T)
    pair = kind == FBW
    has_pairs = bool(pair.any())
    v2s = np.where(pair, v2, 0) if has_pairs else np.zeros_like(v)  # a safe index

    # Per (kind, stage) tables, then one gather per column. Operation ids are
    # (slot · num_v + stage) · per_chain + micro-batch, slot 0 = F, 1 = B/BW, 2 = W.
    # Inputs: a forward waits for the previous stage's forward of its micro-batch; a
    # backward for the next stage's backward (the last stage for its own forward); a W for
    # its B; FBW for both its halves' inputs.
    stage_ids = np.arange(num_v)
    slot_of = np.array([0, 1, 2, 1, 0])
    fwd_input = np.where(chain_first, -1, stage_ids - 1)                       # slot 0
    bwd_input = np.where(chain_last, stage_ids, num_v + np.minimum(stage_ids + 1, num_v - 1))
    input_key = np.stack((fwd_input, bwd_input, num_v + stage_ids, bwd_input, fwd_input))
    lag_table = np.stack((f_lag, b_lag, np.zeros(num_v), b_lag, f_lag))
    duration_table = np.stack((fwd, whole - wgt, wgt, whole, np.zeros(num_v)))

    kv = kind * np.int32(num_v) + v                     # one flat index into the tables
    first_op = slot_of.astype(np.int32)[kind] * np.int32(num_v) + v
    first_op *= np.int32(per_chain)
    first_op += mb
    key = input_key.astype(np.int32).ravel()[kv]
    dep = np.where(key >= 0, key * np.int32(per_chain) + mb, np.int32(-1))
    lag = lag_table.ravel()[kv]
    duration = duration_table.ravel()[kv]
    if not has_pairs:
        second_op = dep2 = np.full(len(kind), -1, dtype=np.int32)
        lag2 = np.zeros(len(kind))
    else:
        second_op = np.where(pair, (num_v + v2s) * per_chain + mb2, -1)
        dep2 = np.where(pair, bwd_input[v2s] * per_chain + mb2, -1)
        lag2 = np.where(pair, b_lag[v2s], 0.0)
    if has_pairs:
        pv, pv2 = v[pair], v2s[pair]
        serial = fwd[pv] + whole[pv2]
        ideal = np.maximum(fwd[pv] - f_comm[pv] + whole[pv2] - b_comm[pv2],
                           f_comm[pv] + b_comm[pv2])
        duration[pair] = serial - overlap_efficiency * (serial - ideal)
    is_fwd = (kind == F) | pair

    offsets = np.concatenate(([0], np.cumsum(lengths)))
    # An input made earlier on the consumer's own rank (a W's B, the turn of a V, the last
    # stage's backward after its forward) has ended before the rank is free: it never
    # binds, so the event loop drops it, and the periodic shortcut need not look back to it.
    rank_col = np.repeat(np.arange(pp, dtype=np.int32), lengths)
    # the rank each input key's stage runs on (-1: no input)
    key_rank = np.where(input_key >= 0, rank_of[input_key % num_v], -1).astype(np.int32)
    run_dep = _cross_rank(dep, key_rank.ravel()[kv], rank_col)
    run_dep2 = dep2 if not has_pairs else _cross_rank(
        dep2, np.where(pair, rank_of[bwd_input[v2s] % num_v], -1), rank_col)
    columns = (first_op, second_op, duration, run_dep, lag, run_dep2, lag2)
    engine = _Engine(offsets, 3 * num_v * per_chain, columns)
    fast = _fast_forward(engine, rows, offsets, _STEADY.get(schedule), pp, vp,
                         first_op, second_op, run_dep, run_dep2)
    if fast is None:
        engine = _Engine(offsets, 3 * num_v * per_chain, columns)
        engine.run()
        engine.check_done()
        start, skipped = engine.starts().copy(), 0
    else:
        start, skipped = fast
    end = start + duration
    p2p_wait = _p2p_waits(start, end, duration, offsets, first_op, second_op, dep, lag, dep2,
                          lag2)
    total = float(end.max())

    # Activation memory follows the order alone: a forward allocates a micro-batch's
    # activations on its stage, the pass that completes its backward (BW, or W after a
    # split B) frees them; an overlapped F+BW holds both while it runs.
    unit = 1.0 / vp if schedule == "interleaved" else 0.5 if model_stages == 2 * pp else 1.0
    freed_v = np.where(pair, v2s, v)
    allocs = is_fwd.astype(float)
    frees = ((kind == BW) | (kind == W) | pair).astype(float)
    nbytes = np.array(t.activation_bytes)[model_stage] if t.activation_bytes else None

    if schedule == "dualpipe":
        global_mb = np.where(v < pp, mb, per_chain + mb)
        global_mb2 = np.where(pair & (v2s >= pp), per_chain + mb2, mb2)
    else:
        global_mb, global_mb2 = mb, mb2

    firsts = offsets[:-1]
    n_rows = len(kind)
    busy = np.add.reduceat(duration, firsts)
    first_b_row = np.minimum.reduceat(np.where(kind != F, np.arange(n_rows), n_rows), firsts)
    first_b = np.where(first_b_row < n_rows, start[np.minimum(first_b_row, n_rows - 1)], total)
    last_f = np.maximum.reduceat(np.where(is_fwd, end, 0.0), firsts)

    def peak(alloc: np.ndarray, free: np.ndarray) -> np.ndarray:
        """Per rank, the most held at once: held before a row plus what it allocates."""
        delta = alloc - free
        held = np.cumsum(delta)
        held_before = held - delta
        held_before -= held_before[firsts][rank_col]
        return np.maximum.reduceat(held_before + alloc, firsts)

    peak_count = peak(allocs, frees)
    peak_bytes = (peak(allocs * nbytes[v], frees * nbytes[freed_v])
                  if nbytes is not None else None)
    # idle time below rounding (a rank busy the whole step) is no bubble
    bubble = [max(total - float(busy[r]) - p2p_wait[r], 0.0) for r in range(pp)]
    ranks = [
        RankStats(
            rank=r, busy_s=float(busy[r]), exposed_p2p_s=p2p_wait[r],
            bubble_s=bubble[r], warmup_s=float(first_b[r]),
            cooldown_s=total - max(float(last_f[r]), float(first_b[r])),
            peak_inflight=round(float(peak_count[r])),
            peak_activation_units=float(peak_count[r]) * unit,
            peak_activation_bytes=float(peak_bytes[r]) if peak_bytes is not None else None)
        for r in range(pp)]
    critical = max(range(pp), key=lambda r: (ranks[r].busy_s, -r))
    table = _OpTable(rank=rank_col, kind=kind, stage=v, microbatch=global_mb,
                     stage2=np.where(pair, v2, -1), microbatch2=np.where(pair, global_mb2, -1),
                     start=start, duration=duration)
    return PipelineResult(schedule=schedule, pp=pp, vp=vp, microbatches=microbatches,
                          total_s=total, ranks=tuple(ranks), critical_rank=critical,
                          simulated_ops=len(kind) - skipped, _table=table)


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


def _fast_forward(engine: _Engine, rows: np.ndarray, offsets: np.ndarray,
                  steady: Callable[[int, int], tuple[int, int]] | None, pp: int, vp: int,
                  first_op: np.ndarray, second_op: np.ndarray, dep: np.ndarray,
                  dep2: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Run ``engine`` skipping the periodic part of each steady phase: every row's start
    and how many rows were skipped; None when it cannot.

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
        # the long runs only: a schedule's steady phase(s), not short repeats in warm-up
        found_runs = _runs(same[lo:hi - length], max(_MIN_BLOCKS * length, (hi - lo) // 4))
        phases.append([(lo + s, (n + length) // length) for s, n in found_runs])
    if not phases[0] or any(len(p) != len(phases[0]) for p in phases):
        return None
    row_of_op = np.full(int(max(first_op.max(), second_op.max())) + 1, -1, dtype=np.int64)
    row_of_op[first_op] = np.arange(n_rows)
    paired = np.flatnonzero(second_op >= 0)
    row_of_op[second_op[paired]] = paired
    rank_of_row = np.repeat(np.arange(ranks), np.diff(offsets))

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

    for phase in range(len(phases[0])):
        first_arr = np.array([phases[r][phase][0] for r in range(ranks)])
        blocks_arr = np.array([phases[r][phase][1] for r in range(ranks)])
        plan = _phase_plan(first_arr, blocks_arr, length, offsets, rank_of_row, row_of_op,
                           dep, dep2)
        if plan is None:
            return None
        if not _skip_phase(engine, plan, first_arr, length, offsets, first_op, second_op,
                           skipped_rows, skipped_starts, run_to):
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
