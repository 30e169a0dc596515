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

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from attrs import field, frozen

from zrt_core.errors import LayoutError, UnknownNameError

if TYPE_CHECKING:
    from collections.abc import Callable

    from zrt_core.hardware import HardwareSpec, InterconnectTier
    from zrt_core.strategy import Parallel

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe", "dualpipev")

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
    """

    schedule: str
    pp: int
    vp: int
    microbatches: int
    total_s: float
    ranks: tuple[RankStats, ...]
    critical_rank: int
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


def virtual_stages(schedule: str, pp: int, vp: int = 1) -> int:
    """How many per-stage times a schedule takes (see the module docstring)."""
    _check_name(schedule)
    if schedule == "interleaved":
        return pp * vp
    if schedule in ("zb-v", "dualpipev"):
        return 2 * pp
    return pp


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


def _rows(kinds: Sequence[int] | np.ndarray, stages: Sequence[int] | np.ndarray | int
          ) -> np.ndarray:
    """Rows for a kind/stage sequence, micro-batches numbered FIFO per (pass, stage)."""
    kinds = np.asarray(kinds, dtype=np.int64)
    out = np.full((len(kinds), 5), -1, dtype=np.int64)
    out[:, 0] = kinds
    out[:, 1] = stages
    slot = np.where(kinds == BW, B, kinds)
    for s in np.unique(slot):
        for v in np.unique(out[slot == s, 1]):
            mask = (slot == s) & (out[:, 1] == v)
            out[mask, 2] = np.arange(int(mask.sum()))
    return out


def _interleave(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    out = np.empty(len(first) + len(second), dtype=np.int64)
    out[0::2], out[1::2] = first, second
    return out


def _gpipe(pp: int, m: int) -> list[np.ndarray]:
    return [_rows([F] * m + [BW] * m, r) for r in range(pp)]


def _one_f_one_b(pp: int, m: int) -> list[np.ndarray]:
    # PipeDream-flush, as Megatron's forward_backward_pipelining_without_interleaving: rank r
    # warms up with pp - r - 1 forwards, alternates F and B, then drains its backwards.
    orders = []
    for r in range(pp):
        warmup = min(pp - r - 1, m)
        steady = m - warmup
        orders.append(_rows([F] * warmup + [F, BW] * steady + [BW] * warmup, r))
    return orders


def _interleaved(pp: int, vp: int, m: int) -> list[np.ndarray]:
    # Megatron's forward_backward_pipelining_with_interleaving: virtual micro-batch k runs
    # model chunk (k mod pp·vp) // pp (reversed for backward) on micro-batch
    # (k // (pp·vp))·pp + k mod pp; rank r warms up with 2(pp - r - 1) + (vp - 1)·pp
    # virtual micro-batches, then alternates one forward and one backward.
    total = m * vp
    k = np.arange(total)
    fchunk = (k % (pp * vp)) // pp
    bchunk = vp - 1 - fchunk
    orders = []
    for r in range(pp):
        warmup = min(2 * (pp - r - 1) + (vp - 1) * pp, total)
        steady = total - warmup
        fwd, bwd = fchunk * pp + r, bchunk * pp + r
        stages = np.concatenate((fwd[:warmup], _interleave(fwd[warmup:], bwd[:steady]),
                                 bwd[steady:]))
        kinds = [F] * warmup + [F, BW] * steady + [BW] * warmup
        orders.append(_rows(kinds, stages))
    return orders


def _zb_h1(pp: int, m: int) -> list[np.ndarray]:
    # Qi et al. 2023, ZB-H1 (as PaddlePaddle's pipeline_scheduler_ZBH1 writes it): 1F1B's
    # order with backward split; rank r holds back r of its W passes, which then fill the
    # cool-down. Peak memory is pp micro-batches on every rank, 1F1B's first-rank peak.
    orders = []
    for r in range(pp):
        kinds = ([F] * (pp - r) + [B] + [F, B] * r + [W] + [F, B, W] * (m - pp)
                 + [B, W] * (pp - r - 1) + [W] * r)
        orders.append(_rows(kinds, r))
    return orders


class _Orders:
    """Per-rank orders built step by step, for the schedules whose W passes come from a FIFO
    of deferred B passes across both chunks of a rank (DualPipe, DualPipeV)."""

    def __init__(self, ranks: int) -> None:
        self.lists: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(ranks)]
        self._next: dict[tuple[int, int], int] = {}
        self._pending_w: list[list[tuple[int, int]]] = [[] for _ in range(ranks)]

    def _take(self, slot: int, stage: int) -> int:
        mb = self._next.get((slot, stage), 0)
        self._next[(slot, stage)] = mb + 1
        return mb

    def f(self, rank: int, stage: int) -> None:
        self.lists[rank].append((F, stage, self._take(F, stage), -1, -1))

    def b(self, rank: int, stage: int, *, split: bool) -> None:
        """A backward: ``split`` runs only B and queues its W; otherwise a whole BW."""
        mb = self._take(B, stage)
        if split:
            self.lists[rank].append((B, stage, mb, -1, -1))
            self._pending_w[rank].append((stage, mb))
        else:
            self.lists[rank].append((BW, stage, mb, -1, -1))

    def w(self, rank: int) -> None:
        stage, mb = self._pending_w[rank].pop(0)
        self.lists[rank].append((W, stage, mb, -1, -1))

    def fb(self, rank: int, f_stage: int, b_stage: int) -> None:
        self.lists[rank].append(
            (FBW, f_stage, self._take(F, f_stage), b_stage, self._take(B, b_stage)))

    def arrays(self) -> list[np.ndarray]:
        assert not any(self._pending_w)
        return [np.array(rows, dtype=np.int64).reshape(-1, 5) for rows in self.lists]


def _zb_v(pp: int, m: int) -> list[np.ndarray]:
    # The handcrafted ZB-V of Qi et al. (sail-sg/zero-bubble-pipeline-parallelism,
    # handcrafted_zb_v): two chunks per rank in a V, chunk 0 = stage r, chunk 1 = stage
    # 2pp-1-r. It is written for n = max(2pp - 1, m) micro-batches; those past m are dropped,
    # which keeps every remaining dependency in order.
    n = max(2 * pp - 1, m)
    orders = []
    for r in range(pp):
        s0, s1 = r, 2 * pp - 1 - r
        seq: list[tuple[int, int, int]] = []
        put = seq.append
        f0 = f1 = b0 = b1 = 0

        for _ in range(2 * (pp - r) - 1):
            put((F, s0, f0))
            f0 += 1
        for _ in range(r):
            put((F, s1, f1))
            f1 += 1
            put((F, s0, f0))
            f0 += 1
        for _ in range(pp - r):
            put((F, s1, f1))
            f1 += 1
            put((B, s1, b1))
            put((W, s1, b1))
            b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                put((F, s0, f0))
                f0 += 1
            put((B, s0, b0))
            put((W, s0, b0))
            b0 += 1
            put((F, s1, f1))
            f1 += 1
            put((B, s1, b1))
            put((W, s1, b1))
            b1 += 1
        w0, w1 = b0, b1
        for _ in range(r):
            put((B, s0, b0))
            b0 += 1
            put((B, s1, b1))
            b1 += 1
        for _ in range(pp - r):
            put((B, s0, b0))
            b0 += 1
            put((W, s0, w0))
            w0 += 1
        while w1 < b1:
            put((W, s1, w1))
            w1 += 1
        while w0 < b0:
            put((W, s0, w0))
            w0 += 1
        rows = np.full((len(seq), 5), -1, dtype=np.int64)
        rows[:, :3] = seq
        orders.append(rows[rows[:, 2] < m])
    return orders


def _dualpipe_like(pp: int, m: int, *, v_shape: bool) -> list[np.ndarray]:
    # deepseek-ai/DualPipe: dualpipe.py (DualPipe) and dualpipev.py (DualPipeV), its eight
    # steps verbatim. DualPipe: rank r holds stage r of the pipeline fed at rank 0 (virtual
    # stages 0..pp-1, "down") and stage pp-1-r of the one fed at rank pp-1 ("up", virtual
    # stage 2pp-1-r); half the micro-batches go each way. For the first half of the ranks
    # phase 0 is "down", for the second half "up". DualPipeV: one pipeline folded in a V,
    # rank r holds stages r (phase 0) and 2pp-1-r (phase 1).
    o = _Orders(pp)
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

        for _ in range((ranks - half - 1) * 2):                 # step 1: nF0
            o.f(rank, s0)
        for _ in range(half + 1):                               # step 2: nF0F1
            o.f(rank, s0)
            o.f(rank, s1)
        for _ in range(ranks - half - 1):                       # step 3: nB1W1F1
            o.b(rank, s1, split=True)
            o.w(rank)
            o.f(rank, s1)
        main = chunks - 2 * ranks + half + 1
        for i in range(main):                                   # step 4: nF0B1F1B0
            if i == 0 and middle:
                o.f(rank, s0)          # not overlapped, "to further reduce bubble size"
                o.b(rank, s1, split=False)
            else:
                o.fb(rank, s0, s1)
            o.fb(rank, s1, s0)
        for _ in range(ranks - half - 1):                       # step 5: nB1F1B0
            o.b(rank, s1, split=False)
            o.fb(rank, s1, s0)
        split = False
        for i in range(half + 1):                               # step 6: nB1B0
            if i == (half + 1) // 2 and half % 2 == 1:
                split = True
            o.b(rank, s1, split=split)
            if i == (half + 1) // 2 and half % 2 == 0:
                split = True
            o.b(rank, s0, split=split)
        for _ in range(ranks - half - 1):                       # step 7: nWB0
            o.w(rank)
            o.b(rank, s0, split=True)
        for _ in range(half + 1):                               # step 8: nW
            o.w(rank)
    return o.arrays()


def schedule_orders(schedule: str, pp: int, microbatches: int, vp: int = 1
                    ) -> list[np.ndarray]:
    """Each rank's operation order: rows of (kind, stage, micro-batch, stage2,
    micro-batch2), kinds indexing :data:`KIND_NAMES`. Micro-batches count per pipeline
    (DualPipe's "up" pipeline numbers its half from 0 too)."""
    check_schedule(schedule, pp, vp, microbatches)
    m = microbatches
    if schedule == "gpipe":
        return _gpipe(pp, m)
    if schedule == "1f1b":
        return _one_f_one_b(pp, m)
    if schedule == "interleaved":
        return _interleaved(pp, vp, m)
    if schedule == "zb-h1":
        return _zb_h1(pp, m)
    if schedule == "zb-v":
        return _zb_v(pp, m)
    return _dualpipe_like(pp, m, v_shape=schedule == "dualpipev")


# -- the simulation --------------------------------------------------------------------------


def _check_name(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise UnknownNameError(f"unknown pipeline schedule {schedule!r}",
                               f"use one of {', '.join(SCHEDULES)}")


def check_schedule(schedule: str, pp: int, vp: int, microbatches: int) -> None:
    """Raise :class:`LayoutError` naming the rule when a schedule cannot run this layout."""
    _check_name(schedule)
    if pp < 1 or vp < 1 or microbatches < 1:
        raise LayoutError(f"pp={pp}, vp={vp}, microbatches={microbatches} must all be ≥ 1",
                          "give positive degrees and at least one micro-batch")
    if schedule == "interleaved":
        if vp < 2 or pp < 2:
            raise LayoutError(
                f"interleaved 1F1B needs pp ≥ 2 and vp ≥ 2 (got pp={pp}, vp={vp})",
                "use 1f1b for vp=1, or set vp to the model chunks per rank")
        if microbatches % pp:
            raise LayoutError(
                f"interleaved 1F1B needs the micro-batches ({microbatches}) to be a multiple "
                f"of pp={pp} (Megatron's rule)", "adjust the global batch or micro-batch")
        return
    if schedule in ("zb-v", "dualpipev"):
        if vp not in (1, 2):
            raise LayoutError(
                f"{schedule} always runs two chunks per rank in a V; vp={vp} is not supported",
                "use vp=1 (or 2); the model is cut into 2 × pp virtual stages")
    elif vp != 1:
        raise LayoutError(f"{schedule} does not interleave model chunks; vp={vp} needs "
                          "the interleaved schedule",
                          "set vp=1 or use the interleaved schedule")
    if schedule == "zb-h1" and microbatches < pp:
        raise LayoutError(
            f"zb-h1 needs at least pp={pp} micro-batches (got {microbatches})",
            "raise the global batch or lower pp")
    if schedule == "dualpipe" and (pp % 2 or microbatches % 2):
        raise LayoutError(
            f"dualpipe needs an even pp and an even number of micro-batches "
            f"(got pp={pp}, microbatches={microbatches})",
            "half of the micro-batches enter at each end of the pipeline")
    if schedule in ("dualpipe", "dualpipev") and microbatches < 2 * pp:
        raise LayoutError(
            f"{schedule} needs at least 2 × pp = {2 * pp} micro-batches (got {microbatches})",
            "raise the global batch or lower pp")


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

    orders = schedule_orders(schedule, pp, microbatches, vp)
    lengths = [len(o) for o in orders]
    rows = np.concatenate(orders)
    kind, v, mb, v2, mb2 = rows.T
    pair = kind == FBW
    v2s = np.where(pair, v2, 0)  # a safe index where there is no second half

    # Operation ids: (slot, virtual stage, micro-batch) with slot 0 = F, 1 = B/BW, 2 = W.
    def op_id(slot: int | np.ndarray, stage: np.ndarray, micro: np.ndarray) -> np.ndarray:
        return (slot * num_v + stage) * per_chain + micro

    slot = np.select([kind == BW, kind == FBW], [B, F], kind)
    first_op = op_id(slot, v, mb)
    second_op = np.where(pair, op_id(B, v2s, mb2), -1)

    # What each operation waits for from another rank (or chunk), and the P2P lag: a forward
    # waits for the previous stage's forward of its micro-batch; a backward for the next
    # stage's backward (the last stage for its own forward); a W for its B.
    is_fwd = (kind == F) | pair
    is_bwd = (kind == B) | (kind == BW)
    prev_v = np.maximum(v - 1, 0)
    next_v = np.minimum(v + 1, num_v - 1)
    bwd_dep = np.where(chain_last[v], op_id(F, v, mb), op_id(B, next_v, mb))
    dep = np.select([is_fwd & ~chain_first[v], is_bwd, kind == W],
                    [op_id(F, prev_v, mb), bwd_dep, op_id(B, v, mb)], -1)
    lag = np.select([is_fwd, is_bwd], [f_lag[v], b_lag[v]], 0.0)
    next_v2 = np.minimum(v2s + 1, num_v - 1)
    dep2 = np.where(pair, np.where(chain_last[v2s], op_id(F, v2s, mb2),
                                   op_id(B, next_v2, mb2)), -1)
    lag2 = np.where(pair, b_lag[v2s], 0.0)

    serial = fwd[v] + whole[v2s]
    ideal = np.maximum(fwd[v] - f_comm[v] + whole[v2s] - b_comm[v2s], f_comm[v] + b_comm[v2s])
    duration = np.choose(kind, (fwd[v], whole[v] - wgt[v], wgt[v], whole[v],
                                serial - overlap_efficiency * (serial - ideal)))

    columns = zip(range(len(kind)), first_op.tolist(), second_op.tolist(), duration.tolist(),
                  dep.tolist(), lag.tolist(), dep2.tolist(), lag2.tolist(), strict=True)
    flat = list(columns)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    entries = [flat[offsets[r]:offsets[r + 1]] for r in range(pp)]
    start_of, p2p_wait = _run(entries, 3 * num_v * per_chain, len(flat))
    start = np.array(start_of)
    end = start + duration
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
    rank_col = np.repeat(np.arange(pp), lengths)

    ranks = []
    for r in range(pp):
        lo, hi = offsets[r], offsets[r + 1]
        k = kind[lo:hi]
        busy = float(duration[lo:hi].sum())
        not_fwd = np.flatnonzero(k != F)
        first_b = float(start[lo + not_fwd[0]]) if len(not_fwd) else total
        fwd_ends = end[lo:hi][is_fwd[lo:hi]]
        last_f = float(fwd_ends.max()) if len(fwd_ends) else 0.0

        def peak(alloc: np.ndarray, free: np.ndarray) -> float:
            held_before = np.cumsum(alloc - free) - (alloc - free)
            return float(np.max(held_before + alloc)) if len(alloc) else 0.0

        a, fr = allocs[lo:hi], frees[lo:hi]
        peak_bytes = (peak(a * nbytes[v[lo:hi]], fr * nbytes[freed_v[lo:hi]])
                      if nbytes is not None else None)
        idle = total - busy
        ranks.append(RankStats(
            rank=r, busy_s=busy, exposed_p2p_s=p2p_wait[r], bubble_s=idle - p2p_wait[r],
            warmup_s=first_b, cooldown_s=total - max(last_f, first_b),
            peak_inflight=round(peak(a, fr)), peak_activation_units=peak(a, fr) * unit,
            peak_activation_bytes=peak_bytes))
    critical = max(range(pp), key=lambda r: (ranks[r].busy_s, -r))
    table = _OpTable(rank=rank_col, kind=kind, stage=v, microbatch=global_mb,
                     stage2=np.where(pair, v2, -1), microbatch2=np.where(pair, global_mb2, -1),
                     start=start, duration=duration)
    return PipelineResult(schedule=schedule, pp=pp, vp=vp, microbatches=microbatches,
                          total_s=total, ranks=tuple(ranks), critical_rank=critical,
                          _table=table)


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


def _run(entries: list[list[tuple]], num_ops: int, num_rows: int
         ) -> tuple[list[float], list[float]]:
    """Run each rank's list in order against the cross-rank dependencies.

    An entry is (row, op, second op or -1, duration, dep, lag, second dep, second lag). A
    rank runs until its next operation waits on one not yet done and parks there (an
    operation has at most one waiter on another rank); the completion wakes it. Each
    operation is visited once, plus once per park, so the cost is linear in the number of
    operations. Returns each row's start and, per rank, the idle time spent waiting on a
    transfer in flight.
    """
    ranks = len(entries)
    end = [-1.0] * num_ops
    waiter = [-1] * num_ops
    free = [0.0] * ranks
    pos = [0] * ranks
    p2p_wait = [0.0] * ranks
    start_of = [0.0] * num_rows
    todo = list(range(ranks - 1, -1, -1))
    pop, push = todo.pop, todo.append
    while todo:
        r = pop()
        ops = entries[r]
        i, t, n = pos[r], free[r], len(ops)
        while i < n:
            row, a, b, dur, da, la, db, lb = ops[i]
            start = t
            lag = 0.0
            if da >= 0:
                e = end[da]
                if e < 0.0:
                    waiter[da] = r
                    break
                e += la
                if e > start:
                    start, lag = e, la
            if db >= 0:
                e = end[db]
                if e < 0.0:
                    waiter[db] = r
                    break
                e += lb
                if e > start:
                    start, lag = e, lb
            if lag and start > t:
                p2p_wait[r] += min(start - t, lag)
            t = start + dur
            start_of[row] = start
            end[a] = t
            if waiter[a] >= 0:
                push(waiter[a])
            if b >= 0:
                end[b] = t
                if waiter[b] >= 0:
                    push(waiter[b])
            i += 1
        pos[r], free[r] = i, t
    stuck = [r for r in range(ranks) if pos[r] < len(entries[r])]
    if stuck:  # an order that deadlocks is a bug in this module, not bad input
        raise RuntimeError(f"pipeline order deadlocks on ranks {stuck}")
    return start_of, p2p_wait
