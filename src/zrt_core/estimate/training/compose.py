"""Composing the step: pipeline, optimizer and exposed communication into the report's
identities, the model FLOPs and memory per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zrt_core.errors import ModelError
from zrt_core.estimate.training.capture import TrainingCapture
from zrt_core.estimate.training.optimizer import _OptimizerStep
from zrt_core.estimate.training.pipeline import _PipelineSummary, _rank_stages
from zrt_core.estimate.training.spec import _GROUP_ORDER, USABLE_MEMORY_FRACTION
from zrt_core.estimate.training.stages import comm_overlap_share, scale_up_groups
from zrt_core.ir.graph import (
    OpGraph,
    Phase,
    _thaw,
)
from zrt_core.reports.training import StageReport, TrainingMemory, TrainingReport
from zrt_core.schedule.pipeline import StageTimes
from zrt_core.schedule.timeline import Timeline
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.training import (
    ParamInventory,
    PrecisionPlan,
)

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost


# -- composing the step -------------------------------------------------------------------------


def _compose(*, captured: TrainingCapture, hw: HardwareSpec, parallel: Parallel, train: TrainSpec,
             schedule: str, microbatches: int, stage_reports: Sequence[StageReport],
             summary: _PipelineSummary, dp_tails: Sequence[tuple[float, float]],
             optimizer: _OptimizerStep, inventory: ParamInventory, plan: PrecisionPlan,
             p2p: Sequence[float], wrap: float, notes: list[str], applied: Sequence[str],
             timelines: Mapping[str, Timeline], stage_times: StageTimes, fwd: OpGraph,
             bwd: OpGraph, dims: ModelDims, host: PluginHost | None,
             start_delay_s: float = 0.0, start_gathers_s: Sequence[float] = ()
             ) -> TrainingReport:
    """The report; ``start_delay_s``: the step starts this much later (the first forward's
    parameter gathers FSDP keeps for the whole step, :mod:`.fsdp`), exposed ``dp``;
    ``start_gathers_s``: those gathers per virtual stage, the rest of them hidden."""
    pp = parallel.pp
    vp = parallel.vp if schedule == "interleaved" else 1
    m = microbatches
    per_rank = _rank_stages(schedule, pp, vp, m, len(stage_reports))
    r_star = summary.critical_rank

    # the critical rank's busy time, split into compute and in-stage exposed communication
    fwd_c = bwd_c = rec_c = 0.0
    exposed: dict[str, float] = {}
    hidden: dict[str, float] = {}
    by_category: dict[str, float] = {}
    by_kind: dict[str, float] = {}
    for v, count in per_rank[r_star]:
        s = stage_reports[v]
        fwd_c += count * s.forward_compute_s
        bwd_c += count * s.backward_compute_s
        rec_c += count * s.recompute_s
        for table, source in ((by_category, s.compute_by_category_s),
                              (by_kind, s.compute_by_layer_kind_s)):
            for k, val in source.items():
                table[k] = table.get(k, 0.0) + count * val
        for k, val in s.exposed_comm_s.items():
            exposed[k] = exposed.get(k, 0.0) + count * val
        for k, val in s.hidden_comm_s.items():
            hidden[k] = hidden.get(k, 0.0) + count * val
    compute = fwd_c + bwd_c + rec_c
    busy = summary.busy_s[r_star]
    serial = compute + sum(exposed.values())
    saving = serial - busy  # DualPipe's overlapped pairs hide communication; ~0 otherwise
    if abs(saving) > 1e-9 * max(busy, 1.0) and sum(exposed.values()) > 0:
        scale = max(0.0, 1.0 - saving / sum(exposed.values()))
        for k in list(exposed):
            moved = exposed[k] * (1.0 - scale)
            exposed[k] -= moved
            hidden[k] = hidden.get(k, 0.0) + moved
    elif abs(saving) > 1e-9 * max(busy, 1.0):
        compute = busy - sum(exposed.values())
    # DualPipe's paired chunks overlap kernels of two micro-batches; the parts keep their
    # shares of the overlapped compute time
    for table in (by_category, by_kind):
        kernels = sum(table.values())
        if kernels > 0 and compute != kernels:
            for k in table:
                table[k] *= compute / kernels
    p2p_exposed = summary.p2p_exposed_s[r_star]
    if p2p_exposed:
        exposed["pp"] = exposed.get("pp", 0.0) + p2p_exposed
    if pp > 1:
        receives = sum(2 * count for _, count in per_rank[r_star])
        p2p_total = receives * (max(p2p) if p2p else 0.0)
        hidden["pp"] = hidden.get("pp", 0.0) + max(0.0, p2p_total - p2p_exposed)
    bubble = summary.bubble_s[r_star]
    pipeline = summary.total_s + start_delay_s
    if start_delay_s > 0:
        exposed["dp"] = exposed.get("dp", 0.0) + start_delay_s
    gathers = sum(start_gathers_s[v] for v, _ in per_rank[r_star]) if start_gathers_s else 0.0
    if gathers > start_delay_s:
        hidden["dp"] = hidden.get("dp", 0.0) + gathers - start_delay_s
    # force the identity to hold exactly: pipeline = compute + exposed + bubble
    bubble = pipeline - compute - sum(exposed.values())

    # the gradient reduction's tail after each rank's last backward
    step_end = pipeline
    dp_busy_total = 0.0
    for rank in range(pp):
        end = pipeline - summary.end_before_total_s[rank]
        finish = end
        serial_start = None
        busy_sum = 0.0
        for v, _ in per_rank[rank]:
            tail, dp_busy = dp_tails[v]
            start = pipeline - summary.last_backward_before_total_s.get(v, 0.0)
            finish = max(finish, start + stage_reports[v].backward_s + tail)
            serial_start = start if serial_start is None else min(serial_start, start)
            busy_sum += dp_busy
        if serial_start is not None:
            finish = max(finish, serial_start + busy_sum)
        if rank == r_star:
            dp_busy_total = busy_sum
        step_end = max(step_end, finish)
    grad_tail = step_end - pipeline
    optimizer_comm_exposed = grad_tail + optimizer.comm_exposed_s
    all_exposed = dict(exposed)
    all_hidden = dict(hidden)
    if grad_tail > 0:
        all_exposed["dp"] = all_exposed.get("dp", 0.0) + grad_tail
    if dp_busy_total > grad_tail:
        all_hidden["dp"] = all_hidden.get("dp", 0.0) + dp_busy_total - grad_tail
    if optimizer.comm_exposed_s:
        all_exposed["dp"] = all_exposed.get("dp", 0.0) + optimizer.comm_exposed_s
    elif optimizer.comm_s:
        all_hidden["dp"] = all_hidden.get("dp", 0.0) + optimizer.comm_s
    # the gradient reduction hidden under the last backwards, the next step's parameter
    # gathers and FSDP's hidden gathers hold SMs beside the compute they overlap
    share = comm_overlap_share(hw)
    tail_hidden = all_hidden.get("dp", 0.0) - hidden.get("dp", 0.0) + \
        (gathers - start_delay_s if gathers > start_delay_s else 0.0)
    slow = share * max(0.0, tail_hidden) \
        if share and "dp" in scale_up_groups(parallel, hw) else 0.0
    if slow > 0:
        all_exposed["overlap"] = all_exposed.get("overlap", 0.0) + slow
        optimizer_comm_exposed += slow
    step = pipeline + optimizer.compute_s + optimizer_comm_exposed

    # throughput and utilisation
    world = parallel.world_size
    tokens = train.global_batch * train.seq_len
    peak = hw.compute.fp16_tflops if train.precision == "fp16" else hw.compute.bf16_tflops
    model_flops = _model_flops(captured, train, notes, host)
    # every virtual stage runs each micro-batch on the world / pp devices of its stage
    hardware_flops = sum((s.forward_flops + s.backward_flops) * m for s in stage_reports) \
        * (world // pp)
    mfu = model_flops / (step * world * peak * 1e12) if step else 0.0
    hfu = hardware_flops / (step * world * peak * 1e12) if step else 0.0

    memory = _memory(hw, stage_reports, summary, optimizer, per_rank, pp)
    if not memory.feasible:
        notes.append(
            f"does not fit: rank {memory.rank} needs {memory.peak_bytes / 2**30:.1f} GiB of "
            f"{memory.usable_bytes / 2**30:.1f} GiB usable "
            f"({hw.memory.capacity_gb:g} GB × {USABLE_MEMORY_FRACTION})")
    if applied:
        notes.append("graph transforms: " + ", ".join(applied))
    return TrainingReport(
        model=captured.model, hardware_id=hw.id, parallel=parallel, train=train,
        num_gpus=world, schedule=schedule, microbatches=m, step_time_s=step,
        pipeline_s=pipeline, optimizer_s=optimizer.compute_s,
        optimizer_comm_exposed_s=optimizer_comm_exposed, compute_s=compute, forward_s=fwd_c,
        backward_s=bwd_c, recompute_s=rec_c, bubble_s=bubble,
        compute_by_category_s=by_category, compute_by_layer_kind_s=by_kind,
        pipeline_exposed_comm_s=_ordered(exposed), exposed_comm_s=_ordered(all_exposed),
        hidden_comm_s=_ordered(all_hidden), tokens_per_s_per_gpu=tokens / (step * world),
        mfu=mfu, hfu=hfu, model_flops=model_flops, hardware_flops=hardware_flops,
        peak_tflops=peak, memory=memory, stages=tuple(stage_reports), critical_rank=r_star,
        precision=plan.recipe, notes=tuple(notes), pipeline=summary.result,
        stage_times=stage_times, p2p_s=tuple(p2p), p2p_wrap_s=wrap, timelines=timelines,
        checkpoint_bytes_per_device=max(optimizer.checkpoint_bytes, default=0.0),
        checkpoint_bytes=sum(optimizer.checkpoint_bytes) * (world // pp))


def _ordered(values: Mapping[str, float]) -> dict[str, float]:
    keys = sorted(values, key=lambda k: (_GROUP_ORDER.index(k) if k in _GROUP_ORDER else 99, k))
    return {k: values[k] for k in keys}


#: The model FLOPs of the last few (capture, batch, sequence, plugin host), with the notes
#: they gave: a search asks them once per layout, and they depend on nothing else.
_MODEL_FLOPS: dict[tuple[int, ...], tuple[Any, Any, float, tuple[str, ...]]] = {}


def _model_flops(captured: TrainingCapture, train: TrainSpec, notes: list[str],
                 host: PluginHost | None) -> float:
    """3 × the reference training forward of the global batch (remembered per capture,
    batch, sequence and host: :data:`_MODEL_FLOPS`)."""
    key = (id(captured), train.global_batch, train.seq_len, train.micro_batch, id(host))
    hit = _MODEL_FLOPS.get(key)
    if hit is None or hit[0] is not captured or hit[1] is not host:
        made: list[str] = []
        flops = _count_model_flops(captured, train, made, host)
        if len(_MODEL_FLOPS) >= 16:
            _MODEL_FLOPS.pop(next(iter(_MODEL_FLOPS)))
        hit = _MODEL_FLOPS[key] = (captured, host, flops, tuple(made))
    notes.extend(hit[3])
    return hit[2]


def _count_model_flops(captured: TrainingCapture, train: TrainSpec, notes: list[str],
                       host: PluginHost | None) -> float:
    """3 × the reference training forward of the global batch (causal attention, logits of
    every position): the core's analytic count, or a plugin's (``zrt_reference_flops``) for
    families the core does not describe; the captured forward where neither counts it."""
    from zrt_core.modelmath.flops import reference_flops
    try:
        counted, source = reference_flops(_thaw(captured.config), Phase.TRAIN_FORWARD,
                                          train.global_batch, train.seq_len, host=host)
        forward = counted.total
        if source != "zrt-core":
            notes.append(f"MFU from the reference FLOPs of {source}")
    except ModelError as exc:
        notes.append(f"MFU from the captured forward FLOPs: {exc}")
        per_micro = captured.graph(Phase.TRAIN_FORWARD).totals().flops
        forward = per_micro * train.global_batch / train.micro_batch
    return 3.0 * forward


def _memory(hw: HardwareSpec, stages: Sequence[StageReport], summary: _PipelineSummary,
            optimizer: _OptimizerStep, per_rank: Sequence[Sequence[tuple[int, float]]],
            pp: int) -> TrainingMemory:
    capacity = hw.memory.capacity_gb * 2.0 ** 30
    best: TrainingMemory | None = None
    for rank in range(pp):
        mine = [stages[v] for v, _ in per_rank[rank]]
        acts = summary.peak_activation_bytes[rank]
        per_micro = max((s.activation_bytes for s in mine), default=0.0)
        report = TrainingMemory(
            rank=rank, weights_bytes=optimizer.weights_bytes[rank],
            gradients_bytes=optimizer.gradients_bytes[rank],
            optimizer_bytes=optimizer.states_bytes[rank], activations_bytes=acts,
            transient_bytes=max((s.transient_bytes for s in mine), default=0.0),
            comm_buffer_bytes=optimizer.gather_buffer_bytes[rank], capacity_bytes=capacity,
            usable_bytes=capacity * USABLE_MEMORY_FRACTION,
            inflight_microbatches=summary.peak_inflight[rank],
            activation_bytes_per_microbatch=per_micro,
            host_optimizer_bytes=optimizer.host_states_bytes[rank])
        if best is None or report.peak_bytes > best.peak_bytes:
            best = report
    assert best is not None
    return best
