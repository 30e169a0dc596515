"""What a pipeline step's simulation needs from its order alone: the per-operation columns,
the inputs, the steady phases the fast-forward may skip and the activation count's peaks.

They depend on the schedule, ``pp``, ``vp`` and the micro-batch count only, never on the
stage times, so one plan serves every simulation of that shape: a search simulates many
layouts of one shape with different stage times (Llama-3-70B on 1,024 H100: its 132
anchors are pp 8 × vp 5 at seven micro-batch counts). The arrays are read-only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
from attrs import frozen

from zrt_core.limits import virtual_stages
from zrt_core.schedule.pipeline.engine import _cross_rank
from zrt_core.schedule.pipeline.fast_forward import _STEADY, _Steady, _steady_phases
from zrt_core.schedule.pipeline.orders import _orders
from zrt_core.schedule.pipeline.ranks import stage_rank
from zrt_core.schedule.pipeline.values import BW, FBW, F, W

#: plans kept (least recently used dropped), and the most rows they hold together: a plan
#: keeps about 20 arrays of its rows (pp 16 × vp 5 × 1,024 micro-batches: 163,840 rows,
#: ~20 MB), so the cache stays within ~100 MB whatever the search
PLANS_KEPT = 64
PLAN_ROWS_KEPT = 600_000


@frozen(eq=False)
class _Plan:
    """One schedule shape's order and inputs as arrays (rank-major rows).

    Operation ids are ``(slot · num_v + stage) · per_chain + micro-batch``, slot 0 = F,
    1 = B/BW, 2 = W. Inputs: a forward waits for the previous stage's forward of its
    micro-batch; a backward for the next stage's backward (the last stage for its own
    forward); a W for its B; FBW for both its halves' inputs."""

    num_v: int
    per_chain: int
    model_stage: np.ndarray      # per virtual stage: the model stage it runs
    rank_of: np.ndarray          # per virtual stage: its rank
    chain_first: np.ndarray      # per virtual stage: first of its chain (no forward input)
    chain_last: np.ndarray       # ... last of its chain (its backward follows its forward)
    kind: np.ndarray
    v: np.ndarray
    v2s: np.ndarray              # FBW's backward stage (0 elsewhere: a safe index)
    pair: np.ndarray
    has_pairs: bool
    kv: np.ndarray               # kind · num_v + stage: one flat index into (kind, stage)
    first_op: np.ndarray
    second_op: np.ndarray
    dep: np.ndarray
    dep2: np.ndarray
    run_dep: np.ndarray          # the inputs made on another rank (the event loop's)
    run_dep2: np.ndarray
    offsets: np.ndarray
    rank_col: np.ndarray
    is_fwd: np.ndarray
    steady: _Steady | None       # the steady phases to skip; None: simulate every row
    # what the per-rank statistics read
    first_b_row: np.ndarray      # per rank: its first row that is not a forward (n if none)
    peak_count: np.ndarray       # per rank: most micro-batch activations held at once
    allocs: np.ndarray
    frees: np.ndarray
    freed_v: np.ndarray
    unit: float
    global_mb: np.ndarray
    stage2: np.ndarray
    microbatch2: np.ndarray
    # each virtual stage's backwards, grouped: rows ordered by stage and where each starts
    bwd_rows: np.ndarray
    bwd_starts: np.ndarray
    bwd_stages: tuple[int, ...]

    @property
    def rows(self) -> int:
        return len(self.kind)


_PLANS: OrderedDict[tuple[str, int, int, int], _Plan] = OrderedDict()
_LOCK = threading.Lock()  # the cache is shared by a process's threads


def plan_of(schedule: str, pp: int, vp: int, microbatches: int) -> _Plan:
    """The plan of a checked schedule shape (``check_schedule`` first), cached."""
    key = (schedule, pp, vp, microbatches)
    with _LOCK:
        hit = _PLANS.get(key)
        if hit is not None:
            _PLANS.move_to_end(key)
            return hit
    plan = _build(schedule, pp, vp, microbatches)  # outside the lock: a plan is pure
    if plan.rows <= PLAN_ROWS_KEPT:
        with _LOCK:
            _PLANS[key] = plan
            held = sum(p.rows for p in _PLANS.values())
            while len(_PLANS) > PLANS_KEPT or held > PLAN_ROWS_KEPT:
                held -= _PLANS.popitem(last=False)[1].rows
    return plan


def _peak(alloc: np.ndarray, free: np.ndarray, firsts: np.ndarray, rank_col: np.ndarray
          ) -> np.ndarray:
    """Per rank, the most held at once: held before a row plus what it allocates."""
    delta = alloc - free
    held = np.cumsum(delta)
    held_before = held - delta
    held_before -= held_before[firsts][rank_col]
    return np.maximum.reduceat(held_before + alloc, firsts)


def _build(schedule: str, pp: int, vp: int, microbatches: int) -> _Plan:
    model_stages = virtual_stages(schedule, pp, vp)
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

    rows, lengths = _orders(schedule, pp, microbatches, vp)
    kind, v, mb, v2, mb2 = (np.ascontiguousarray(c) for c in rows.T)
    pair = kind == FBW
    has_pairs = bool(pair.any())
    v2s = np.where(pair, v2, 0) if has_pairs else np.zeros_like(v)  # a safe index

    stage_ids = np.arange(num_v)
    slot_of = np.array([0, 1, 2, 1, 0])
    fwd_input = np.where(chain_first, -1, stage_ids - 1)                       # slot 0
    bwd_input = np.where(chain_last, stage_ids, num_v + np.minimum(stage_ids + 1, num_v - 1))
    input_key = np.stack((fwd_input, bwd_input, num_v + stage_ids, bwd_input, fwd_input))

    kv = kind * np.int32(num_v) + v
    first_op = slot_of.astype(np.int32)[kind] * np.int32(num_v) + v
    first_op *= np.int32(per_chain)
    first_op += mb
    key = input_key.astype(np.int32).ravel()[kv]
    dep = np.where(key >= 0, key * np.int32(per_chain) + mb, np.int32(-1))
    if not has_pairs:
        second_op = dep2 = np.full(len(kind), -1, dtype=np.int32)
    else:
        second_op = np.where(pair, (num_v + v2s) * per_chain + mb2, -1)
        dep2 = np.where(pair, bwd_input[v2s] * per_chain + mb2, -1)
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
    steady = _steady_phases(rows, offsets, _STEADY.get(schedule), pp, vp, first_op,
                            second_op, run_dep, run_dep2)

    # Activation memory follows the order alone: a forward allocates a micro-batch's
    # activations on its stage, the pass that completes its backward (BW, or W after a
    # split B) frees them; an overlapped F+BW holds both while it runs.
    unit = 1.0 / vp if schedule == "interleaved" else 0.5 if model_stages == 2 * pp else 1.0
    freed_v = np.where(pair, v2s, v)
    allocs = is_fwd.astype(float)
    frees = ((kind == BW) | (kind == W) | pair).astype(float)
    if schedule == "dualpipe":
        global_mb = np.where(v < pp, mb, per_chain + mb)
        global_mb2 = np.where(pair & (v2s >= pp), per_chain + mb2, mb2)
    else:
        global_mb, global_mb2 = mb, mb2
    firsts = offsets[:-1]
    n_rows = len(kind)
    first_b_row = np.minimum.reduceat(np.where(kind != F, np.arange(n_rows), n_rows), firsts)

    is_bwd = kind != F  # B, BW and FBW's backward half (a W is not a backward start)
    is_bwd &= kind != W
    bwd_stage = np.where(pair, v2, v)
    rows_b = np.flatnonzero(is_bwd)
    order = rows_b[np.argsort(bwd_stage[rows_b], kind="stable")]
    stages_sorted = bwd_stage[order]
    cut = np.flatnonzero(np.diff(stages_sorted)) + 1 if len(order) else np.array([], int)
    bwd_starts = np.concatenate(([0], cut)) if len(order) else np.array([], int)

    plan = _Plan(
        num_v=num_v, per_chain=per_chain, model_stage=model_stage, rank_of=rank_of,
        chain_first=chain_first, chain_last=chain_last, kind=kind, v=v,
        v2s=v2s, pair=pair, has_pairs=has_pairs, kv=kv, first_op=first_op,
        second_op=second_op, dep=dep, dep2=dep2, run_dep=run_dep, run_dep2=run_dep2,
        offsets=offsets, rank_col=rank_col, is_fwd=is_fwd, steady=steady,
        first_b_row=first_b_row, peak_count=_peak(allocs, frees, firsts, rank_col),
        allocs=allocs, frees=frees, freed_v=freed_v, unit=unit, global_mb=global_mb,
        stage2=np.where(pair, v2, -1), microbatch2=np.where(pair, global_mb2, -1),
        bwd_rows=order, bwd_starts=bwd_starts,
        bwd_stages=tuple(stages_sorted[bwd_starts].tolist()) if len(order) else ())
    for field in _Plan.__attrs_attrs__:
        value = getattr(plan, field.name)
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return plan
