"""Per-stage schedules: each pipeline stage's forward and backward on compute and communication
streams, the amax reductions and the pipeline's point-to-point messages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zrt_core.cost.pricing import OUTSIDE_LAYERS
from zrt_core.errors import SpecError
from zrt_core.estimate.host import HostModel, exposed_host_s, launch_tables, paired_host_s
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    dtype_bytes,
)
from zrt_core.reports.training import StageReport
from zrt_core.schedule.pipeline import (
    SPLIT_BACKWARD,
    StageTimes,
    stage_rank,
)
from zrt_core.schedule.scheduler import OverlapRules, schedule_phase, weight_grad_s
from zrt_core.schedule.timeline import COMPUTE, Timeline, stream_group
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.training import (
    RECOMPUTE_ATTR,
    PrecisionPlan,
)

if TYPE_CHECKING:
    from zrt_core.cost.backend import NodeCost
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelinfo import ModelDims


# -- per-stage schedules --------------------------------------------------------------------


def _stages(fwd: OpGraph, bwd: OpGraph, bwd_sync: OpGraph, costs: Mapping[str, Mapping[int,
            NodeCost]], rules: OverlapRules, schedule: str, parallel: Parallel,
            ranges: Sequence[range], saved: Mapping[int | str, float],
            transient: Mapping[int | str, float], *, keep_timelines: bool, sync_s: float = 0.0,
            host_model: HostModel | None = None, microbatches: int = 1,
            memo: dict[Any, Any] | None = None, ep_sm_share: float = 0.0,
            overlap_share: float = 0.0, overlap_groups: frozenset[str] | None = None,
            hosts: tuple[Any, Any] | None = None
            ) -> tuple[list[StageReport], StageTimes, list[tuple[float, float]],
                       dict[str, Timeline]]:
    """Schedule each distinct stage; ``sync_s``: a blocking collective at the end of every
    stage forward and backward (the fp8 amax reduction), counted as exposed ``dp``;
    ``host_model``: the host's launch time the device waits for (:mod:`.host`), counted as
    exposed ``host``. ``memo``: what a stage's forward and backward give (all but the
    last micro-batch's gradient reduction), kept by the caller for these ``fwd``/``bwd``
    graphs, their costs, ``rules``, ``host_model`` and whether the schedule splits the
    backward (:meth:`.reuse.TrainingReuse.of_graphs`); ``ep_sm_share``: the SMs the EP
    dispatch kernels hold under batch-level overlap (:func:`ep_comm_sm_share`);
    ``overlap_share``: the SMs any other overlapped collective holds
    (:func:`comm_overlap_share`): the compute beside it is slower by that share of the
    collective's hidden time, counted as exposed ``overlap``, for the ``overlap_groups``
    (:func:`scale_up_groups`); ``hosts``: :func:`~zrt_core.estimate.host.launch_tables` of
    these graphs when the caller has them (made here otherwise)."""
    host_model = host_model or HostModel()
    fwd_host, bwd_host = hosts if hosts is not None else launch_tables(
        host_model, fwd, bwd, costs["fwd"], costs["bwd"])
    kind_of: dict[int, int] = {}
    kind_name: dict[int | None, str] = {None: OUTSIDE_LAYERS}
    for g in (bwd, fwd):
        for rep, t in g.templates.items():
            for i in t.indices:
                kind_of[i] = rep
                kind_name[i] = t.kind
    recompute_nodes = [n for n in bwd.nodes if n.attrs.get(RECOMPUTE_ATTR)
                       and n.category != Category.COLLECTIVE]
    fwd_flops = {}
    bwd_flops = {}
    for g, acc in ((fwd, fwd_flops), (bwd, bwd_flops)):
        for n in g.nodes:
            acc[n.layer_index] = acc.get(n.layer_index, 0) + n.flops
    first_layer_pos_bwd = next((i for i, n in enumerate(bwd.nodes) if n.layer_index is not None),
                               len(bwd.nodes))
    outer_bwd_flops = {"head": 0.0, "embedding": 0.0}
    for pos, n in enumerate(bwd.nodes):
        if n.layer_index is None:
            outer_bwd_flops["head" if pos < first_layer_pos_bwd else "embedding"] += n.flops
    first_layer_pos_fwd = next((i for i, n in enumerate(fwd.nodes) if n.layer_index is not None),
                               len(fwd.nodes))
    outer_fwd_flops = {"head": 0.0, "embedding": 0.0}
    for pos, n in enumerate(fwd.nodes):
        if n.layer_index is None:
            outer_fwd_flops["embedding" if pos < first_layer_pos_fwd else "head"] += n.flops

    cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    per_signature: dict[tuple[Any, ...], tuple[float, float, dict[str, float],
                                               dict[str, float]]] = {}
    reports: list[StageReport] = []
    dp_tails: list[tuple[float, float]] = []
    timelines: dict[str, Timeline] = {}
    n_stages = len(ranges)
    for v, layers in enumerate(ranges):
        first, last = v == 0, v == n_stages - 1
        signature = (tuple(kind_of.get(i, i) for i in layers), first, last)
        hit = cache.get(signature)
        part = memo.get(signature) if hit is None and memo is not None else None
        if hit is None and part is not None:
            lay = list(layers)
            st = _sync_schedule(memo, signature, bwd_sync, costs["bwd_sync"], rules, lay,
                                first, last) \
                if bwd_sync is not bwd and (lay or first or last) else part[1]
            hit = cache[signature] = (*part[:2], st, *part[2:8], _dp_busy_s(st), *part[8:])
        if hit is None:
            lay = list(layers)
            if lay or first or last:
                ft = schedule_phase(fwd, costs["fwd"], rules, layers=lay, embedding_side=first,
                                    head_side=last, regions=None if memo is None
                                    else memo.setdefault(("regions", "fwd"), {}))
                bt = schedule_phase(bwd, costs["bwd"], rules, layers=lay, embedding_side=first,
                                    head_side=last, regions=None if memo is None
                                    else memo.setdefault(("regions", "bwd"), {}))
                st = _sync_schedule(memo, signature, bwd_sync, costs["bwd_sync"], rules, lay,
                                    first, last) if bwd_sync is not bwd else bt
            else:  # a layout's empty stage: it only passes activations on
                ft = bt = st = Timeline.compose([])
            counts: dict[int, int] = {}
            for i in lay:
                counts[kind_of.get(i, i)] = counts.get(kind_of.get(i, i), 0) + 1
            recompute = sum(costs["bwd"][n.id].time_s * counts.get(n.layer_index, 0)
                            for n in recompute_nodes if n.layer_index is not None)
            wgrad = weight_grad_s(bwd, costs["bwd"], layers=lay) \
                if schedule in SPLIT_BACKWARD else 0.0
            act = sum(saved.get(rep, 0.0) * c for rep, c in counts.items())
            act += (saved.get("embedding", 0.0) if first else 0.0) + \
                (saved.get("head", 0.0) if last else 0.0)
            trans = max([transient.get(rep, 0.0) for rep in counts]
                        + ([transient.get("head", 0.0)] if last else [])
                        + ([transient.get("embedding", 0.0)] if first else []) + [0.0])
            ff = sum(fwd_flops.get(rep, 0) * c for rep, c in counts.items()) + \
                (outer_fwd_flops["embedding"] if first else 0) + \
                (outer_fwd_flops["head"] if last else 0)
            bf = sum(bwd_flops.get(rep, 0) * c for rep, c in counts.items()) + \
                (outer_bwd_flops["embedding"] if first else 0) + \
                (outer_bwd_flops["head"] if last else 0)
            dp_busy = _dp_busy_s(st)
            by_category: dict[str, float] = {}
            by_kind: dict[str, float] = {}
            for tl in (ft, bt):
                for k, val in tl.compute_by_category().items():
                    by_category[k] = by_category.get(k, 0.0) + val
                for i, val in tl.compute_by_layer().items():
                    kind = kind_name.get(i, "layer")
                    by_kind[kind] = by_kind.get(kind, 0.0) + val
            reps: list[int | None] = [kind_of.get(i, i) for i in lay]
            if first or last:
                reps = [None, *reps] if first else [*reps, None]
            host_f, host_b = exposed_host_s(host_model, reps, fwd_host, bwd_host,
                                            ft.makespan_s, bt.makespan_s)
            host_pair = paired_host_s(host_model, reps, fwd_host, bwd_host, ft.makespan_s,
                                      bt.makespan_s) if rules.ep_batch_overlap else None
            hit = (ft, bt, st, recompute, min(wgrad, bt.makespan_s), act, trans, ff, bf,
                   dp_busy, by_category, by_kind, host_f, host_b, host_pair)
            cache[signature] = hit
            if memo is not None:  # all but st and dp_busy (the gradient reduction's)
                memo[signature] = (*hit[:2], *hit[3:9], *hit[10:])
        (ft, bt, st, recompute, wgrad, act, trans, ff, bf, dp_busy, by_category, by_kind,
         host_f, host_b, host_pair) = hit
        if host_pair is not None and microbatches > 1:
            # the micro-batches batch-level EP overlap pairs (as _ep_batch_overlap counts
            # them) issue their launches interleaved with their partner's
            paired = _paired_share(parallel.pp, microbatches)
            host_f = (1.0 - paired) * host_f + paired * host_pair[0]
            host_b = (1.0 - paired) * host_b + paired * host_pair[1]
        # what follows depends on the stage's signature alone: once per distinct stage
        derived = per_signature.get(signature)
        if derived is None:
            exposed: dict[str, float] = {}
            hidden: dict[str, float] = {}
            for tl in (ft, bt):
                for k, val in tl.exposed_comm_s.items():
                    exposed[k] = exposed.get(k, 0.0) + val
                for k, val in tl.hidden_comm_s.items():
                    hidden[k] = hidden.get(k, 0.0) + val
                idle = tl.idle_s
                if idle > 1e-12:
                    exposed["other"] = exposed.get("other", 0.0) + idle
            slow_f = overlap_slowdown_s(ft.hidden_comm_s, overlap_share, ep_sm_share,
                                        overlap_groups)
            slow_b = overlap_slowdown_s(bt.hidden_comm_s, overlap_share, ep_sm_share,
                                        overlap_groups)
            if slow_f + slow_b > 0:
                exposed["overlap"] = exposed.get("overlap", 0.0) + slow_f + slow_b
            ep_nccl = overlap_share if overlap_groups is None or "ep" in overlap_groups else 0.0
            ep_hidden_f, ep_hidden_b = _ep_batch_overlap(rules, ft, bt, parallel.pp, microbatches,
                                                         ep_sm_share or ep_nccl)
            if ep_hidden_f + ep_hidden_b > 0:
                exposed["ep"] = exposed.get("ep", 0.0) - ep_hidden_f - ep_hidden_b
                hidden["ep"] = hidden.get("ep", 0.0) + ep_hidden_f + ep_hidden_b
            if sync_s:
                exposed["dp"] = exposed.get("dp", 0.0) + 2 * sync_s
            if host_f + host_b > 0:
                exposed["host"] = exposed.get("host", 0.0) + host_f + host_b
            derived = per_signature[signature] = (
                ft.makespan_s + sync_s + host_f - ep_hidden_f + slow_f,
                bt.makespan_s + sync_s + host_b - ep_hidden_b + slow_b, exposed, hidden)
        forward_s, backward_s, exposed, hidden = derived
        reports.append(StageReport(
            stage=v, rank=stage_rank(schedule, parallel.pp, parallel.vp, v)
            if schedule != "dualpipe" else v, layers=(layers.start, layers.stop), first=first,
            last=last, forward_s=forward_s, backward_s=backward_s, weight_s=wgrad,
            forward_compute_s=ft.compute_s, backward_compute_s=bt.compute_s - recompute,
            recompute_s=recompute, exposed_comm_s=exposed, hidden_comm_s=hidden,
            activation_bytes=act, transient_bytes=trans, forward_flops=ff, backward_flops=bf,
            compute_by_category_s=by_category, compute_by_layer_kind_s=by_kind,
            host_forward_s=host_f, host_backward_s=host_b))
        # the last micro-batch's backward with the gradient reduction: how much longer it
        # runs, and how long the DP streams are busy
        dp_tails.append((max(0.0, st.makespan_s - bt.makespan_s), dp_busy))
        if keep_timelines and v == 0:
            timelines = {"forward": ft, "backward": bt, "backward_last": st}
    times = StageTimes(
        forward_s=[r.forward_s for r in reports], backward_s=[r.backward_s for r in reports],
        weight_s=[r.weight_s for r in reports] if schedule in SPLIT_BACKWARD else None,
        activation_bytes=[r.activation_bytes for r in reports])
    return reports, times, dp_tails, timelines


def _dp_busy_s(st: Timeline) -> float:
    """The time a stage's last backward keeps its data-parallel streams busy."""
    return sum(v for k, v in st.stream_busy_s.items()
               if k in ("comm.dp", "comm.dp_cp", "comm.edp"))


#: Last micro-batch backward schedules a stage memo keeps (one per gradient-sync graph).
_SYNC_KEPT = 8


def _sync_schedule(memo: dict[Any, Any] | None, signature: Any, bwd_sync: OpGraph,
                   costs: Mapping[int, NodeCost], rules: OverlapRules, layers: list[int],
                   first: bool, last: bool) -> Timeline:
    """The stage's last backward with the gradient reduction, from ``memo`` when this
    gradient-sync graph (held by identity) was scheduled for the stage before; its regions
    (layer templates) are scheduled once per graph."""
    if memo is None:
        return schedule_phase(bwd_sync, costs, rules, layers=layers, embedding_side=first,
                              head_side=last)
    key = ("sync", id(bwd_sync))
    hit = memo.get(key)
    if hit is None or hit[0] is not bwd_sync:
        kept = [k for k in memo if k[0] == "sync"]
        for k in kept[:max(0, len(kept) - _SYNC_KEPT + 1)]:
            del memo[k]
        hit = memo[key] = (bwd_sync, {}, {})
    st = hit[1].get(signature)
    if st is None:
        st = hit[1][signature] = schedule_phase(bwd_sync, costs, rules, layers=layers,
                                                embedding_side=first, head_side=last,
                                                regions=hit[2])
    return st


AMAX_REDUCTIONS = ("dp_tp", "tp", "none")


def _amax_reduction_s(fwd: OpGraph, plan: PrecisionPlan, parallel: Parallel,
                      hw: HardwareSpec, group: str, stages: int = 1) -> float:
    """One amax all-reduce of fp8 delayed scaling (TransformerEngine ``DelayedScaling`` with
    ``reduce_amax``: ``FP8GlobalStateManager.reduce_and_update_fp8_tensors`` at every
    autocast exit, over Megatron's amax-reduction group): 3 fp32 amaxes (input, weight,
    gradient) per linear GEMM of a (virtual) stage — latency-bound. Current scaling
    (``plan.amax_pass``) keeps no amax history and has none of it."""
    if plan.recipe != "fp8" or plan.amax_pass or group == "none":
        return 0.0
    if group not in AMAX_REDUCTIONS:
        raise SpecError(f"unknown amax reduction group {group!r}",
                        f"use one of {', '.join(AMAX_REDUCTIONS)}")
    from zrt_core.cost.collectives import collective_cost

    size = parallel.tp * parallel.cp * (parallel.dp if group == "dp_tp" else 1)
    if size <= 1:
        return 0.0
    gemms = sum(fwd.multiplicity(n) for n in fwd.nodes
                if n.attrs.get("precision") == plan.recipe and n.category == Category.MATMUL)
    per_stage = math.ceil(gemms / max(1, stages))
    return collective_cost("all_reduce", 3 * 4 * max(1, per_stage), size, size, hw).time_s


def _p2p_message_bytes(parallel: Parallel, train: TrainSpec, dims: ModelDims,
                       plan: PrecisionPlan) -> float:
    """One micro-batch's activation between stages, per rank: ``b·s·h`` 16-bit values split
    over TP (sequence parallel, or Megatron's scatter-gather optimisation without it) and
    CP."""
    elements = train.micro_batch * train.seq_len * dims.hidden
    return elements * dtype_bytes(plan.activation_dtype) / (parallel.tp * parallel.cp)


#: SMs the deduplicating dispatchers' kernels hold while they run: Megatron-Core's
#: ``TransformerConfig`` defaults ``moe_deepep_num_sms = 20`` and ``moe_hybridep_num_sms =
#: 16`` (``megatron/core/transformer/transformer_config.py``). NCCL's all-to-all is not
#: listed: its channel count is NCCL's choice at run time, not a recipe setting.
EP_DISPATCH_SMS = {"deepep": 20, "hybridep": 16}


def comm_overlap_share(hw: HardwareSpec) -> float:
    """The share of the SMs an overlapped collective's kernels hold while it runs beside
    computation (``efficiency.comm_overlap_sms`` of ``parallel_units``; 0 where either is
    not given): NCCL keeps one resident CTA per channel for the whole collective, and
    TransformerEngine's userbuffers a configured ``num_sm`` (docs/overlap-rules.md)."""
    sms, units = hw.efficiency.comm_overlap_sms, hw.efficiency.parallel_units
    return sms / units if 0 < sms < units else 0.0


#: Groups whose collectives can overlap computation inside a stage or a step.
_OVERLAP_GROUPS = ("tp", "etp", "cp", "ep", "dp", "dp_cp", "edp")


def scale_up_groups(parallel: Parallel, hw: HardwareSpec) -> frozenset[str]:
    """The parallel groups whose ranks lie inside one scale-up domain (an NVLink node or
    rack): their collectives move data with the SMs' own loads and stores (NCCL's NVLink
    transports, TransformerEngine's userbuffers), so the SMs they hold are busy. A group
    that crosses the network is not counted: there the NIC moves the data (GPUDirect RDMA)
    and NCCL's kernels post and reduce what arrives (docs/overlap-rules.md)."""
    limit = hw.scale_up_devices
    return frozenset(g for g in _OVERLAP_GROUPS if parallel.span(g)[1] <= limit)


def overlap_slowdown_s(hidden: Mapping[str, float], share: float, ep_share: float = 0.0,
                       groups: frozenset[str] | None = None) -> float:
    """Compute time lost to the SMs that overlapped collectives hold: each group's hidden
    time (communication that ran beside computation) × the share of SMs its kernels take
    (``ep_share`` for the EP group where its dispatcher's SMs are known, ``share``
    otherwise), over ``groups`` (default: all but the pipeline's point-to-point messages,
    which take one or two channels)."""
    lost = 0.0
    for group, t in hidden.items():
        if group == "pp" or t <= 0 or (groups is not None and group not in groups):
            continue
        lost += t * (ep_share if group == "ep" and ep_share > 0 else share)
    return lost


def ep_comm_sm_share(dispatcher: str, parallel_units: int) -> float:
    """The share of the GPU's SMs the EP dispatch kernels take from the compute they
    overlap (0 where unknown: NCCL's all-to-all, or a device without ``parallel_units``)."""
    sms = EP_DISPATCH_SMS.get(dispatcher, 0)
    if not sms or parallel_units <= sms:
        return 0.0
    return sms / parallel_units


def _ep_layers(tl: Any) -> list[tuple[float, float, float, float, float]]:
    """``(compute before the first all-to-all, compute between the two sides, first-side
    all-to-all, second-side all-to-all, compute after the second)`` of each layer region of
    ``tl`` that runs EP communication, in execution order: the first half of a region's EP
    events are the first side, the rest the second (forward: dispatch then combine;
    backward: the combine's backward first)."""
    out = []
    # a layer template's region is placed once per layer it stands for: split it once
    split: dict[int, tuple[float, float, float, float, float] | None] = {}
    for placement in getattr(tl, "placements", ()):
        region = placement.region
        key = id(region)
        if key not in split:
            split[key] = _ep_split(region)
        if split[key] is not None:
            out.append(split[key])
    return out


def _ep_split(region: Any) -> tuple[float, float, float, float, float] | None:
    """One region's :func:`_ep_layers` tuple; None where it runs no EP communication."""
    segs, comms = [0.0], []
    for e in region.body:
        if e.stream == COMPUTE:
            segs[-1] += e.duration_s
        elif stream_group(e.stream) == "ep":
            comms.append(e.duration_s)
            segs.append(0.0)
    if not comms:
        return None
    half = (len(comms) + 1) // 2
    return (segs[0], sum(segs[1:half + 1]), sum(comms[:half]), sum(comms[half:]),
            sum(segs[half + 1:]))


def _ep_pairs_hidden_s(ft: Any, bt: Any, a_f: float, a_b: float,
                       sm_share: float) -> float | None:
    """All-to-all time one forward/backward pair hides under Megatron-Core's combined 1F1B
    layer schedule; None where the timelines carry no layer with EP communication.

    ``TransformerLayerSchedulePlan.run`` (Megatron-Core ``megatron/core/models/common/
    model_chunk_schedule_plan.py``) runs forward layer i of one micro-batch with backward
    layer i (in backward order) of the other as three slots, each a compute stream beside
    a communication stream::

        comm:    combine_bwd      | dispatch_fwd -> dispatch_bwd   | combine_fwd
        compute: pre_dispatch_fwd | mlp_bwd -> mlp_fwd             | pre_dispatch_bwd

    so a layer pair lasts ``max(Kb, Fa) + max(Df, Bm) + max(Db, Fm) + max(Kf, Ba)``
    (F/B: forward/backward compute before (a: attention side) and after (m: experts) the
    dispatch; D/K: dispatch/combine all-to-all), not ``max(ΣC, ΣA)``: an all-to-all longer
    than the compute it is paired with stays exposed even where another slot has compute
    to spare. Each slot keeps the SM share of the dispatch kernels (``max(c + a·share,
    a)``). A layer without EP communication (dense layers, embedding, loss) hides
    nothing."""
    fl, bl = _ep_layers(ft), _ep_layers(bt)
    if not fl or not bl:
        return None
    busy_f = sum(c + d for _, _, c, d, _ in fl)
    busy_b = sum(c + d for _, _, c, d, _ in bl)
    # the all-to-all left exposed inside the regions, spread over their events
    sf = a_f / busy_f if busy_f > 0 else 0.0
    sb = a_b / busy_b if busy_b > 0 else 0.0

    def slot(c: float, a: float) -> float:
        return c + a - (max(c + a * sm_share, a) if a > 0 else c)

    hidden = 0.0
    for (fa, fm, df, kf, f_tail), (b_head, bm, kb, db, ba) in zip(fl, bl, strict=False):
        # forward: attention side, dispatch, experts, combine, then the combine's epilogue
        # (unpermute, shared expert) before the next layer: counted with the experts.
        # backward: the combine's backward (kb) first, the experts', the dispatch's (db),
        # then the attention side; compute before kb is counted with the attention side
        hidden += (slot(fa, kb * sb) + slot(bm, df * sf) + slot(fm + f_tail, db * sb)
                   + slot(ba + b_head, kf * sf))
    return hidden


def _paired_share(pp: int, m: int) -> float:
    """The share of a stage's ``m`` micro-batches that batch-level EP overlap pairs: the
    warm-up forwards and cool-down backwards of a ``pp``-stage pipeline have no partner."""
    return max(0, m - pp) / m


def _ep_batch_overlap(rules: OverlapRules, ft: Timeline, bt: Timeline, pp: int, m: int,
                      sm_share: float = 0.0) -> tuple[float, float]:
    """EP all-to-all time hidden per micro-batch by batch-level overlap (forward, backward).

    Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    ``megatron/core/pipeline_parallel/combined_1f1b.py``) runs micro-batch i+1's forward
    with micro-batch i's backward, layer by layer, the all-to-all of each under the other's
    computation, slot by slot (:func:`_ep_pairs_hidden_s`); where the timelines carry no
    layer structure a pair lasts ``max(C, A)`` instead of ``C + A`` (C: both phases'
    compute, A: their exposed all-to-all), hiding ``min(A, C)``. The warm-up forwards and
    cool-down backwards of a pipeline stage have no partner: ``max(0, m − pp)`` of ``m``
    micro-batches pair. The hidden time is split over forward and backward as their
    all-to-all is.

    The dispatch kernels hold ``sm_share`` of the SMs while they run (DeepEP's and
    HybridEP's kernels are persistent CTAs: :data:`EP_DISPATCH_SMS`); the compute beside
    them runs on the rest, at ``1 - sm_share`` of its rate, so a pair lasts
    ``max(C + A*sm_share, A)`` and hides ``min(A*(1 - sm_share), C)``."""
    if not rules.ep_batch_overlap or m <= 1:
        return 0.0, 0.0
    a_f = ft.exposed_comm_s.get("ep", 0.0)
    a_b = bt.exposed_comm_s.get("ep", 0.0)
    total = a_f + a_b
    if total <= 0:
        return 0.0, 0.0
    paired = _paired_share(pp, m)
    per_pair = _ep_pairs_hidden_s(ft, bt, a_f, a_b, sm_share)
    if per_pair is None:
        per_pair = min(total * (1.0 - sm_share), ft.compute_s + bt.compute_s)
    hidden = min(per_pair, total) * paired
    return hidden * a_f / total, hidden * a_b / total
