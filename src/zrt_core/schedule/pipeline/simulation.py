"""``simulate``: one training step of a pipeline schedule, run event by event."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from zrt_core.errors import LayoutError
from zrt_core.limits import (
    check_schedule,
    virtual_stages,
)
from zrt_core.schedule.pipeline.engine import _cross_rank, _Engine, _p2p
from zrt_core.schedule.pipeline.fast_forward import _STEADY, _fast_forward, _p2p_waits
from zrt_core.schedule.pipeline.orders import _orders
from zrt_core.schedule.pipeline.ranks import stage_rank
from zrt_core.schedule.pipeline.values import (
    BW,
    FBW,
    SPLIT_BACKWARD,
    F,
    PipelineResult,
    RankStats,
    StageTimes,
    W,
    _OpTable,
)

if TYPE_CHECKING:

    pass


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
