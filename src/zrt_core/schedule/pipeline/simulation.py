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
from zrt_core.schedule.pipeline.engine import _Engine, _p2p
from zrt_core.schedule.pipeline.fast_forward import _fast_forward, _p2p_waits
from zrt_core.schedule.pipeline.plan import _peak, plan_of
from zrt_core.schedule.pipeline.values import (
    SPLIT_BACKWARD,
    PipelineResult,
    RankStats,
    StageTimes,
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
    plan = plan_of(schedule, pp, vp, microbatches)
    num_v, model_stage, rank_of = plan.num_v, plan.model_stage, plan.rank_of

    def link(ra: int, rb: int) -> float:
        if ra == rb:
            return 0.0
        if abs(ra - rb) == 1:
            return boundaries[min(ra, rb)]
        return wrap

    f_lag = np.array([0.0 if plan.chain_first[v] else link(rank_of[v - 1], rank_of[v])
                      for v in range(num_v)])
    b_lag = np.array([0.0 if plan.chain_last[v] else link(rank_of[v + 1], rank_of[v])
                      for v in range(num_v)])
    fwd = np.array(t.forward_s)[model_stage]
    whole = np.array(t.backward_s)[model_stage]
    wgt = np.array(t.weight_s)[model_stage] if t.weight_s else np.zeros(num_v)
    f_comm = np.array(t.forward_comm_s)[model_stage] if t.forward_comm_s else np.zeros(num_v)
    b_comm = np.array(t.backward_comm_s)[model_stage] if t.backward_comm_s else np.zeros(num_v)

    # Per (kind, stage) tables, then one gather per column (the plan's flat index).
    lag_table = np.stack((f_lag, b_lag, np.zeros(num_v), b_lag, f_lag))
    duration_table = np.stack((fwd, whole - wgt, wgt, whole, np.zeros(num_v)))
    kv, pair, v2s = plan.kv, plan.pair, plan.v2s
    lag = lag_table.ravel()[kv]
    duration = duration_table.ravel()[kv]
    if not plan.has_pairs:
        lag2 = np.zeros(plan.rows)
    else:
        lag2 = np.where(pair, b_lag[v2s], 0.0)
        pv, pv2 = plan.v[pair], v2s[pair]
        serial = fwd[pv] + whole[pv2]
        ideal = np.maximum(fwd[pv] - f_comm[pv] + whole[pv2] - b_comm[pv2],
                           f_comm[pv] + b_comm[pv2])
        duration[pair] = serial - overlap_efficiency * (serial - ideal)

    offsets, first_op, second_op = plan.offsets, plan.first_op, plan.second_op
    columns = (first_op, second_op, duration, plan.run_dep, lag, plan.run_dep2, lag2)
    num_ops = 3 * num_v * plan.per_chain
    engine = _Engine(offsets, num_ops, columns)
    fast = _fast_forward(engine, plan.steady, offsets, first_op, second_op)
    if fast is None:
        engine = _Engine(offsets, num_ops, columns)
        engine.run()
        engine.check_done()
        start, skipped = engine.starts().copy(), 0
    else:
        start, skipped = fast
    end = start + duration
    p2p_wait = _p2p_waits(start, end, duration, offsets, first_op, second_op, plan.dep, lag,
                          plan.dep2, lag2)
    total = float(end.max())

    firsts = offsets[:-1]
    n_rows = plan.rows
    busy = np.add.reduceat(duration, firsts)
    first_b_row = plan.first_b_row
    first_b = np.where(first_b_row < n_rows, start[np.minimum(first_b_row, n_rows - 1)], total)
    last_f = np.maximum.reduceat(np.where(plan.is_fwd, end, 0.0), firsts)
    rank_end = np.maximum.reduceat(end, firsts)
    last_bwd = (np.maximum.reduceat(start[plan.bwd_rows], plan.bwd_starts)
                if len(plan.bwd_rows) else np.zeros(0))

    peak_count = plan.peak_count
    nbytes = np.array(t.activation_bytes)[model_stage] if t.activation_bytes else None
    peak_bytes = (_peak(plan.allocs * nbytes[plan.v], plan.frees * nbytes[plan.freed_v],
                        firsts, plan.rank_col)
                  if nbytes is not None else None)
    unit = plan.unit
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
    table = _OpTable(rank=plan.rank_col, kind=plan.kind, stage=plan.v,
                     microbatch=plan.global_mb, stage2=plan.stage2,
                     microbatch2=plan.microbatch2, start=start, duration=duration)
    return PipelineResult(schedule=schedule, pp=pp, vp=vp, microbatches=microbatches,
                          total_s=total, ranks=tuple(ranks), critical_rank=critical,
                          simulated_ops=n_rows - skipped, _table=table,
                          rank_end_s=tuple(rank_end.tolist()),
                          last_backward_start_s=dict(zip(plan.bwd_stages, last_bwd.tolist(),
                                                         strict=True)))
