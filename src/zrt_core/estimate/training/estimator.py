"""``estimate_training``: the transforms applied to a capture (fusion, TP/SP/CP/EP, precision,
recompute, ZeRO, gradient sync) and the overlap rules and defaults each source's framework ran.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.capture.sources import raw_config
from zrt_core.checks import (
    _dims_for_layout,
    _schedule_name,
    check_hardware_arg,
    check_train_request,
    layout_notes,
)
from zrt_core.cost.opdims import ATTENTION_KERNEL_ATTR
from zrt_core.errors import ModelError, SpecError
from zrt_core.estimate.guards import check_flops, check_training
from zrt_core.estimate.host import HostModel
from zrt_core.estimate.training.activations import saved_activation_bytes, transient_bytes
from zrt_core.estimate.training.capture import TrainingCapture, capture_dtype, capture_for_training
from zrt_core.estimate.training.compose import _compose
from zrt_core.estimate.training.fsdp import apply_sharding, first_forward_delay_s
from zrt_core.estimate.training.optimizer import _optimizer
from zrt_core.estimate.training.pipeline import _pipeline
from zrt_core.estimate.training.reuse import TrainingReuse
from zrt_core.estimate.training.spec import (
    ATTENTION_GENERATION_NAMES,
    ATTENTION_KERNELS,
    CROSS_ENTROPY_KERNELS,
    MtpSpec,
)
from zrt_core.estimate.training.stages import (
    _amax_reduction_s,
    _p2p_message_bytes,
    _stages,
    comm_overlap_share,
    ep_comm_sm_share,
    scale_up_groups,
)
from zrt_core.hardware import ATTENTION_GENERATIONS
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    Phase,
)
from zrt_core.reports.training import TrainingReport
from zrt_core.schedule.pipeline import (
    SPLIT_BACKWARD,
    check_schedule,
    p2p_times_s,
    virtual_stages,
)
from zrt_core.schedule.scheduler import OverlapRules
from zrt_core.schedule.stages import StageSplit, plan_stages
from zrt_core.strategy import Parallel, TrainSpec, check_layout
from zrt_core.transforms.base import TransformContext, apply_all, around_fusion
from zrt_core.transforms.training import (
    ParamInventory,
    Precision,
    PrecisionPlan,
    Recompute,
    UnfusedAttention,
    add_mtp_layers,
    grad_dtype,
    inplace_cross_entropy,
    mark_weight_grads,
    param_inventory,
    precision_plan,
    split_layer_templates,
    tp_overlap_hints,
    unfused_cross_entropy,
)
from zrt_core.transforms.training.experts import expert_gemm_loop

if TYPE_CHECKING:
    from zrt_core.capture.api import CaptureResult
    from zrt_core.cost.backend import NodeCost
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost


# -- the estimator ------------------------------------------------------------------------------


def estimate_training(
    model: Any,
    hardware: HardwareSpec | str,
    parallel: Parallel,
    train: TrainSpec,
    *,
    host: PluginHost | None = None,
    captured: TrainingCapture | CaptureResult | None = None,
    overlap: OverlapRules | None = None,
    num_gpus: int | None = None,
    host_link_gb_per_s: float | None = None,
    attention: str = "flash",
    attention_fallback: bool = False,
    keep_timelines: bool = False,
    use_cache: bool | None = None,
    stage_split: str | StageSplit = "even",
    zero_algorithm: str | None = None,
    bf16_layers: tuple[int, int] = (0, 0),
    mtp: MtpSpec | None = None,
    cross_entropy: str = "fused",
    amax_reduction: str = "dp_tp",
    moe_token_drop: bool = False,
    cuda_graph: str = "none",
    nvls: bool = True,
    reuse: TrainingReuse | None = None,
    price_coverage: bool = False,
) -> TrainingReport:
    """Estimate one training step (see the module docstring).

    :param model: anything :func:`zrt_core.capture` takes (bundled name, path, config
        mapping); ignored for the graphs when ``captured`` is given.
    :param hardware: a :class:`HardwareSpec` or a hardware id / alias.
    :param parallel: the layout; ``sp=None`` means on when ``tp > 1`` (Megatron).
    :param train: micro-batch, global batch, sequence, recompute, ZeRO stage, optimizer,
        precision, pipeline schedule (``1f1b`` becomes ``interleaved`` when ``vp > 1``).
    :param captured: a :class:`TrainingCapture` (or a ``CaptureResult``) with both training
        phases at ``train.micro_batch × train.seq_len``; captured (and cached) when None.
    :param overlap: communication-overlap rules; default :func:`default_overlap`.
    :param num_gpus: checked against ``tp × cp × pp × dp`` when given.
    :param host_link_gb_per_s: device-to-host bandwidth for ``offload_optimizer``.
    :param attention: ``flash`` (the device's own fused attention kernel, as captured:
        cuDNN / FlashAttention-3 on Hopper), ``flash2`` / ``flash1`` (FlashAttention-2 or
        1.x kernels, at the rates the pack publishes for them: PyTorch-native stacks) or
        ``unfused`` (Megatron-LM's 2021-22 attention core: full-square batched GEMMs, fused
        softmax and attention dropout over the scores; :class:`UnfusedAttention`).
    :param attention_fallback: price the device's own kernel (with a note) where the pack
        publishes no rate for ``attention``'s generation, instead of refusing (records whose
        source names the stack: :func:`case_from_record`).
    :param keep_timelines: keep the first stage's forward/backward timelines (for traces
        and HTML).
    :param price_coverage: report where the forward and backward prices came from
        (measured tables, interpolation, roofline; ``TrainingReport.price_coverage``): one
        pass over the graphs, left out of a search's many estimates.
    :param use_cache: read and write the capture cache on disk (default: unless
        ``ZRT_NO_CACHE=1``).
    :param stage_split: how layers split into pipeline stages, Megatron-Core's options
        (:class:`~zrt_core.schedule.stages.StageSplit`: first/last stage layer counts, a
        ``--pipeline-model-parallel-layout`` string, the embedding/loss accounting), or
        ``even`` (pp × vp must divide the layers), ``embedding-loss`` (Megatron's
        ``account_for_embedding_in_pipeline_split`` and ``..._loss_in_pipeline_split``) or
        ``auto`` (even, else embedding-loss, else the balanced layout, noted).
    :param zero_algorithm: how ZeRO-3/FSDP gathers and reduce-scatters run: None / ``ring``
        (NCCL) or ``pairwise`` (flat, one scale-out link per GPU: DeepSpeed as of 2021).
    :param bf16_layers: ``(first, last)``: under an fp8/fp4 recipe, the linear layers of the
        first ``first`` and the last ``last`` decoder layers stay bf16 (Megatron's
        ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 first
        --num-layers-at-end-in-bf16 last``).
    :param mtp: multi-token prediction modules the recipe trains (:class:`MtpSpec`,
        :func:`mtp_from_config`); they run on the last pipeline stage.
    :param cross_entropy: ``fused`` (one loss kernel keeping an fp32 softmax or gradient:
        Megatron's ``--cross-entropy-loss-fusion`` native kernel, TransformerEngine's from
        2.18), ``te_inplace`` (TransformerEngine's up to 2.17, which writes the gradient into
        the 16-bit logits and keeps them: :func:`~zrt_core.transforms.training.
        inplace_cross_entropy`) or ``megatron`` (``vocab_parallel_cross_entropy``'s fp32
        passes over the logits: :func:`~zrt_core.transforms.training.
        unfused_cross_entropy`).
    :param amax_reduction: under fp8 delayed scaling, the group TransformerEngine all-reduces
        each autocast region's amaxes over (``reduce_amax``): ``dp_tp`` (Megatron-Core's
        default amax-reduction group, data × tensor (× context) parallel), ``tp``
        (``tp_only_amax_red``) or ``none``. The reduction blocks at the end of every
        virtual stage's forward and backward of every micro-batch.
    :param moe_token_drop: MoE layers drop and pad tokens to a fixed capacity
        (``moe_pad_expert_input_to_capacity``): static shapes, no device-to-host sync of
        the routing counts (:class:`~zrt_core.estimate.host.HostModel`).
    :param cuda_graph: ``none`` (eager: every kernel launched by the host, priced with the
        hardware's ``host_launch_us``) or ``full`` (every layer's forward and backward
        replayed as CUDA graphs, Megatron-Core's ``enable_cuda_graph``: no host launches
        to wait for).
    :param nvls: NCCL may use NVLink SHARP where the hardware pack's tiers offer it (NCCL's
        default, ``NCCL_NVLS_ENABLE`` unset); False prices as ``NCCL_NVLS_ENABLE=0`` (the
        NeMo / Megatron-Bridge performance launchers' setting). docs/collectives.md.
    :param reuse: the per-layer work a search's layouts share (:class:`~zrt_core.estimate.
        training.reuse.TrainingReuse`): layer graphs, node prices and the FLOP check made
        by an earlier estimate with the same inputs are taken from it (same results).
    :raises LayoutError: a layout rule fails (named, with the numbers).
    :raises ModelError: the model cannot be captured or the capture does not match.
    """
    started = time.perf_counter()
    timings: dict[str, float] = {}
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    check_hardware_arg(hardware)
    config, where = raw_config(model, host, captured=captured)
    check_train_request(config, parallel, train, num_gpus=num_gpus, stage_split=stage_split,
                        positions=captured is None, where=where)
    hw = host.hardware_spec(hardware) if isinstance(hardware, str) else hardware
    if not nvls:
        hw = hw.without_in_network(nvls=True, sharp=False)
    if captured is None:
        captured = capture_for_training(model, train.micro_batch, train.seq_len,
                                        dtype=capture_dtype(train.precision), host=host,
                                        use_cache=use_cache)
        timings["capture"] = time.perf_counter() - started
    elif not isinstance(captured, TrainingCapture):
        captured = TrainingCapture.from_capture(captured)
    t0 = time.perf_counter()
    dims = captured.dims
    if dims is None:
        from zrt_core.modelinfo import ModelDims

        dims = ModelDims.from_config(captured.config)
    fwd0 = captured.graph(Phase.TRAIN_FORWARD)
    bwd0 = captured.graph(Phase.TRAIN_BACKWARD)
    for g in (fwd0, bwd0):
        if g.meta.get("batch") != train.micro_batch or g.meta.get("seq_len") != train.seq_len:
            raise ModelError(
                f"the captured {g.phase} graph is for batch {g.meta.get('batch')} × "
                f"sequence {g.meta.get('seq_len')}, not the micro-batch "
                f"{train.micro_batch} × {train.seq_len}",
                "capture at the training micro-batch and sequence length")
    if reuse is None or not reuse.flops_checked(captured, host):
        check_flops(captured.config, {g.phase: g for g in (fwd0, bwd0)}, host, model=where)
        if reuse is not None:
            reuse.mark_flops_checked(captured, host)
    num_layers = int(fwd0.meta.get("num_layers") or dims.layers)
    notes: list[str] = []
    schedule = _schedule_name(parallel, train)
    stages = virtual_stages(schedule, parallel.pp,
                            parallel.vp if schedule == "interleaved" else 1)
    split = StageSplit.parse(stage_split)
    stage_plan = plan_stages(
        num_layers, stages, parallel.pp, split, mtp_depths=mtp.depths if mtp else 0,
        mtp_layers_per_depth=mtp.layers // mtp.depths if mtp and mtp.depths else 1,
        rank_major=schedule not in ("zb-v", "dualpipev"))
    stage_ranges = stage_plan.ranges
    if stage_plan.note:
        notes.append(stage_plan.note)
    if split != StageSplit() or num_layers % stages:
        notes.append(f"pipeline layout {stage_plan.layout} (decoder layers per virtual stage "
                     f"{'/'.join(str(r) for r in _decoder_counts(stage_ranges, num_layers))})")
    parallel = check_layout(parallel, _dims_for_layout(dims, stages, num_layers),
                            num_gpus=num_gpus, train=train)
    notes.extend(layout_notes(parallel, train))
    if mtp is not None and mtp.layers:
        notes.append(f"multi-token prediction: {mtp.depths} module(s) of "
                     f"{'+'.join(mtp.kinds) or 'the last layer kind'} with their own LM head "
                     "and loss on the stage the layout gives them (the last by default)"
                     + (", in bf16" if mtp.bf16 else "")
                     + (", weights shared across depths" if mtp.shared_weights else ""))
    m = train.num_microbatches(parallel)
    check_schedule(schedule, parallel.pp, parallel.vp if schedule == "interleaved" else 1, m)
    rules = overlap or default_overlap(parallel, train)
    start, end = bf16_layers
    keep = tuple(range(min(start, num_layers))) + tuple(range(max(0, num_layers - end),
                                                              num_layers))
    if mtp is not None and mtp.bf16:
        keep += tuple(range(num_layers, num_layers + mtp.layers))
    plan = precision_plan(train.precision, hw, high_precision_layers=keep)
    if plan.low_precision and keep:
        notes.append(f"{len(set(keep))} of {num_layers} decoder layers keep bf16 linear layers "
                     f"(first {start}, last {end}: Megatron's first_last_layers_bf16)")
    if plan.note:
        notes.append(plan.note)
    ctx = TransformContext(dims=dims, hardware=hw, parallel=parallel, host=host, train=train)

    # -- transforms -------------------------------------------------------------------------
    if attention not in ATTENTION_KERNELS:
        raise SpecError(f"unknown attention kernel {attention!r}",
                        f"use one of {', '.join(ATTENTION_KERNELS)}")
    if attention in ATTENTION_GENERATIONS and hw.efficiency.attention_rates(attention) is None:
        if not attention_fallback:
            raise SpecError(f"{hw.id} has no published rate for attention kernel {attention} "
                            f"({ATTENTION_GENERATION_NAMES[attention]})",
                            "use --attention flash (the device's own kernel), or a hardware "
                            "pack that gives attention_fa2 / attention_fa1")
        notes.append(f"{hw.id}: no published {ATTENTION_GENERATION_NAMES[attention]} rate; "
                     "attention priced as the device's own fused kernel")
        attention = "flash"
    if zero_algorithm is not None and zero_algorithm not in ("ring", "pairwise"):
        raise SpecError(f"unknown ZeRO collective algorithm {zero_algorithm!r}",
                        "use ring or pairwise")
    if cross_entropy not in CROSS_ENTROPY_KERNELS:
        raise SpecError(f"unknown cross-entropy kernel {cross_entropy!r}",
                        f"use one of {', '.join(CROSS_ENTROPY_KERNELS)}")
    if cuda_graph not in CUDA_GRAPH_MODES:
        raise SpecError(f"unknown CUDA graph mode {cuda_graph!r}",
                        f"use one of {', '.join(CUDA_GRAPH_MODES)}")
    # the host launches each per-expert kernel of an eager step (none replayed from graphs)
    eager = cuda_graph == "none"
    key = (id(captured), captured.name, parallel, train, attention, stage_split,
           zero_algorithm, rules, hw.id, hw.vendor, plan, mtp, cross_entropy, eager, id(host))
    hit = _TRANSFORMED.get(key)
    if hit is not None and hit[0] is captured:
        _, fwd, bwd, bwd_sync, inventory, applied, transform_notes, fwd_first = hit
        notes.extend(transform_notes)
    else:
        before = len(notes)
        fwd, bwd, bwd_sync, inventory, applied, fwd_first = _transform(
            captured, fwd0, bwd0, ctx, notes, attention=attention, plan=plan, rules=rules,
            zero_algorithm=zero_algorithm, dims=dims, mtp=mtp, cross_entropy=cross_entropy,
            eager=eager, reuse=reuse)
        if len(_TRANSFORMED) >= _TRANSFORMED_SIZE:
            _TRANSFORMED.pop(next(iter(_TRANSFORMED)))
        _TRANSFORMED[key] = (captured, fwd, bwd, bwd_sync, inventory, applied,
                             tuple(notes[before:]), fwd_first)
    timings["transforms"] = time.perf_counter() - t0

    # -- prices -----------------------------------------------------------------------------
    t0 = time.perf_counter()
    from zrt_core.cost.collective_table import collective_table
    from zrt_core.cost.pricing import build_backends, price_nodes

    # a GEMM-dense step holds the board at its power limit: the clock that limit sustains
    # (compute.power_limited_clock; MFU below stays against the datasheet peak)
    priced_hw = hw.power_limited()
    if priced_hw is not hw:
        notes.append(f"compute rates at the power-limited clock, "
                     f"{hw.compute.power_limited_clock:g} x the datasheet's (board power and "
                     "SMs against the die's reference SKU: docs/cost-model.md)")
    backends = build_backends(priced_hw, host) if reuse is None \
        else reuse.backends(priced_hw, host)
    costs: dict[str, dict[int, NodeCost]] = {}
    for label, g in (("fwd", fwd), ("bwd", bwd), ("bwd_sync", bwd_sync)):
        costs[label] = price_nodes(g.nodes, backends) if reuse is None \
            else reuse.costs(g, backends)
    if fwd_first is not None:
        costs["fwd_first"] = price_nodes(fwd_first.nodes, backends) if reuse is None \
            else reuse.costs(fwd_first, backends)
    timings["price"] = time.perf_counter() - t0

    # -- stages -----------------------------------------------------------------------------
    t0 = time.perf_counter()
    if reuse is None:
        saved = saved_activation_bytes(fwd, bwd)
        transient = transient_bytes(bwd)
    else:
        saved, transient = reuse.of_graphs(fwd, bwd, "activations", lambda: (
            saved_activation_bytes(fwd, bwd), transient_bytes(bwd)))
    amax_s = _amax_reduction_s(fwd, plan, parallel, hw, amax_reduction, len(stage_ranges))
    if amax_s:
        notes.append(f"fp8 delayed scaling: a blocking amax all-reduce over {amax_reduction} "
                     f"({amax_s * 1e6:.0f} µs) after every stage's forward and backward")
    host_model = HostModel.of(hw, eager=cuda_graph == "none", moe_sync=not moe_token_drop)
    stage_memo = None if reuse is None else reuse.of_graphs(
        fwd, bwd, ("stages", rules, host_model, schedule in SPLIT_BACKWARD, hw), dict)
    if stage_memo is not None and ("regions", "fwd") not in stage_memo:
        # the forward's scheduled regions depend on the forward, its prices and the rules
        # alone: shared with the other backwards of this forward (the recompute variants)
        stage_memo[("regions", "fwd")] = reuse.of_graphs(fwd, fwd, ("regions", rules, hw),
                                                         dict)
    stage_reports, stage_times, dp_tails, timelines = _stages(
        fwd, bwd, bwd_sync, costs, rules, schedule, parallel, stage_ranges, saved, transient,
        keep_timelines=keep_timelines, sync_s=amax_s, host_model=host_model,
        microbatches=m, memo=stage_memo,
        hosts=None if reuse is None else reuse.launch_tables(host_model, fwd, bwd, costs, hw),
        ep_sm_share=ep_comm_sm_share(parallel.ep_dispatcher, hw.efficiency.parallel_units),
        overlap_share=comm_overlap_share(hw), overlap_groups=scale_up_groups(parallel, hw))
    if rules.ep_batch_overlap and any(r.hidden_comm_s.get("ep") for r in stage_reports):
        notes.append("EP all-to-all overlapped across micro-batches (Megatron-Core "
                     "--overlap-moe-expert-parallel-comm): each pair of one micro-batch's "
                     "forward and another's backward lasts max(compute, all-to-all)")
    if any(r.exposed_comm_s.get("host") for r in stage_reports):
        notes.append(f"eager host launches at {hw.efficiency.host_launch_us:g} µs each"
                     + (", the host waiting at every dropless MoE layer's routing-count sync"
                        if host_model.moe_sync and any(
                            n.category == Category.MOE_DISPATCH for n in fwd.nodes) else "")
                     + ": exposed where the host issues kernels slower than the device runs "
                     "them")
    timings["schedule"] = time.perf_counter() - t0

    # -- pipeline ---------------------------------------------------------------------------
    t0 = time.perf_counter()
    message = _p2p_message_bytes(parallel, train, dims, plan)
    p2p, wrap = ((0.0,), 0.0) if parallel.pp == 1 else p2p_times_s(hw, parallel, message) \
        if reuse is None else reuse.value(("p2p", hw, parallel, message),
                                          lambda: p2p_times_s(hw, parallel, message))
    vp = parallel.vp if schedule == "interleaved" else 1
    # the simulation is a function of these values alone: layouts that differ only in
    # what it does not read (ZeRO 0 and 1: the same stage times) share one (search reuse)
    summary = _pipeline(schedule, stage_times, parallel.pp, vp, m, p2p, wrap) \
        if reuse is None else reuse.value(
            ("pipeline", schedule, stage_times, parallel.pp, vp, m, tuple(p2p), wrap),
            lambda: _pipeline(schedule, stage_times, parallel.pp, vp, m, p2p, wrap))
    gather_delay, gather_busy = first_forward_delay_s(
        fwd, fwd_first, costs, rules, stage_ranges, stage_reports,
        regions=None if stage_memo is None else stage_memo.setdefault(("regions", "fwd"), {})) \
        if fwd_first is not None else (0.0, ())
    timings["pipeline"] = time.perf_counter() - t0

    # -- step -------------------------------------------------------------------------------
    opt = _optimizer(inventory, fwd.templates, stage_reports, parallel, train, plan, hw,
                     backends, rules, host_link_gb_per_s, notes)
    report = _compose(
        captured=captured, hw=hw, parallel=parallel, train=train, schedule=schedule,
        microbatches=m, stage_reports=stage_reports, summary=summary, dp_tails=dp_tails,
        optimizer=opt, inventory=inventory, plan=plan, p2p=p2p, wrap=wrap,
        notes=notes, applied=applied, timelines=timelines, stage_times=stage_times,
        fwd=fwd, bwd=bwd, dims=dims, host=ctx.host, start_delay_s=gather_delay,
        start_gathers_s=gather_busy)
    timings["total"] = time.perf_counter() - started
    report = evolve(report, timings_s=timings, collectives=collective_table(
        (("forward", fwd, costs["fwd"]), ("backward", bwd_sync, costs["bwd_sync"]))))
    if price_coverage:
        from types import SimpleNamespace

        from zrt_core.cost.coverage import coverage

        # one micro-batch's forward and backward (the last, with the gradient reduction)
        report = evolve(report, price_coverage=coverage(
            [SimpleNamespace(graph=fwd, costs=costs["fwd"]),
             SimpleNamespace(graph=bwd_sync, costs=costs["bwd_sync"])]))
    check_training(report)
    return report


#: Transformed graphs of the last few estimates (they depend on the capture, the layout, the
#: recipe and the hardware's kind, not on its efficiencies): a calibration or a search over
#: recipes re-prices them without re-running the transforms.
_TRANSFORMED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_TRANSFORMED_SIZE = 8


def _transform(captured: TrainingCapture, fwd0: OpGraph, bwd0: OpGraph, ctx: TransformContext,
               notes: list[str], *, attention: str, plan: PrecisionPlan, rules: OverlapRules,
               zero_algorithm: str | None, dims: ModelDims, mtp: MtpSpec | None = None,
               cross_entropy: str = "fused", eager: bool = True,
               reuse: TrainingReuse | None = None
               ) -> tuple[OpGraph, OpGraph, OpGraph, ParamInventory, tuple[str, ...],
                          OpGraph | None]:
    """Every graph transform of one estimate: forward, backward for every micro-batch, the
    last micro-batch's backward with the gradient reduction, the parameter inventory, and
    the first micro-batch's forward where it alone gathers the parameters (FSDP without
    re-sharding under a pipeline; None otherwise), the MoE experts' grouped GEMMs and casts
    marked as TransformerEngine's per-expert loop (``eager``: launched from the host, not
    replayed from CUDA graphs). The per-layer part (:func:`_layer_graphs`) comes from
    ``reuse`` when given."""
    train = ctx.train
    assert train is not None
    parallel = ctx.parallel
    if reuse is not None:
        # everything the transforms read besides the capture: the per-layer degrees, the
        # recipe, the hardware and the plugins (_layer_graphs), then pp and dp (the ZeRO
        # gathers' and the gradient sync's groups) and the sharding plan (never vp or the
        # schedule: they only split and order the stages)
        layer_key = (*_sharding_key(parallel, train, attention, ctx), train.recompute,
                     train.recompute_modules, train.lora_rank, train.lora_modules,
                     train.freeze_language_model, plan, rules, mtp, cross_entropy)

        def layers(made: list[str]) -> tuple[OpGraph, OpGraph, tuple[str, ...]]:
            return _layer_graphs(captured, fwd0, bwd0, ctx, made, attention=attention,
                                 plan=plan, rules=rules, mtp=mtp, cross_entropy=cross_entropy,
                                 reuse=reuse)

        return reuse.shared(
            captured, ("transform", *layer_key, parallel.pp, parallel.dp, train.zero,
                       train.fsdp, train.reshard_after_forward, train.hsdp, train.precision,
                       zero_algorithm, eager), notes,
            lambda made: _expert_loops(_data_parallel(
                *reuse.shared(captured, ("layer", *layer_key), made, layers), ctx, dims,
                plan=plan, zero_algorithm=zero_algorithm, notes=made), eager))
    fwd, bwd, applied = _layer_graphs(captured, fwd0, bwd0, ctx, notes, attention=attention,
                                      plan=plan, rules=rules, mtp=mtp,
                                      cross_entropy=cross_entropy)
    return _expert_loops(_data_parallel(fwd, bwd, applied, ctx, dims, plan=plan,
                                        zero_algorithm=zero_algorithm, notes=notes), eager)


def _expert_loops(transformed: tuple[OpGraph, OpGraph, OpGraph, ParamInventory,
                                     tuple[str, ...], OpGraph | None], eager: bool
                  ) -> tuple[OpGraph, OpGraph, OpGraph, ParamInventory, tuple[str, ...],
                             OpGraph | None]:
    """:func:`_data_parallel`'s graphs with the experts as TE's ``GroupedLinear`` runs them
    (:func:`~zrt_core.transforms.training.experts.expert_gemm_loop`), each distinct graph
    once, so a backward that is also the gradient-sync graph stays one graph."""
    fwd, bwd, bwd_sync, inventory, applied, fwd_first = transformed
    made: dict[int, OpGraph] = {}

    def loop(g: OpGraph) -> OpGraph:
        if id(g) not in made:
            made[id(g)] = expert_gemm_loop(g, eager=eager)
        return made[id(g)]

    return (loop(fwd), loop(bwd), loop(bwd_sync), inventory, applied,
            None if fwd_first is None else loop(fwd_first))


def _data_parallel(fwd: OpGraph, bwd: OpGraph, applied: tuple[str, ...],
                   ctx: TransformContext, dims: ModelDims, *, plan: PrecisionPlan,
                   zero_algorithm: str | None, notes: list[str]
                   ) -> tuple[OpGraph, OpGraph, OpGraph, ParamInventory, tuple[str, ...],
                              OpGraph | None]:
    """The parameter inventory, the ZeRO-3/FSDP gathers and the gradient sync
    (:func:`~zrt_core.estimate.training.fsdp.apply_sharding`)."""
    train = ctx.train
    assert train is not None
    parallel = ctx.parallel
    inventory = param_inventory(fwd, parallel, dims)
    if train.lora_rank:
        from zrt_core.transforms.lora import lora_inventory

        inventory = evolve(inventory, trainable=lora_inventory(fwd, parallel, dims))
    elif train.freeze_language_model:
        # nothing the graphs hold trains (a VLM's trainable projection is not captured)
        inventory = evolve(inventory, trainable=param_inventory(fwd.with_nodes((), ()),
                                                                parallel, dims))
    fwd_first, fwd, bwd, bwd_sync = apply_sharding(
        fwd, bwd, ctx, inventory, param_dtype=plan.activation_dtype,
        grad_dtype=grad_dtype(train.precision, train.grad_reduce_in_fp32), algorithm=zero_algorithm, notes=notes)
    return fwd, bwd, bwd_sync, inventory, applied, fwd_first


def _layer_graphs(captured: TrainingCapture, fwd0: OpGraph, bwd0: OpGraph,
                  ctx: TransformContext, notes: list[str], *, attention: str,
                  plan: PrecisionPlan, rules: OverlapRules, mtp: MtpSpec | None,
                  cross_entropy: str, reuse: TrainingReuse | None = None
                  ) -> tuple[OpGraph, OpGraph, tuple[str, ...]]:
    """The per-layer transforms: TP/SP/CP/EP, fusion, the loss kernel, MTP layers, the
    precision recipe, LoRA and recompute (nothing here reads pp, vp, dp, the schedule or
    ZeRO: :mod:`.reuse` shares the result across the layouts that differ in those; the
    sharded and fused graphs, the costliest part, also across recompute and precision)."""
    train = ctx.train
    assert train is not None

    def sharded(made: list[str]) -> tuple[OpGraph, OpGraph, tuple[str, ...]]:
        fwd, bwd = megatron_vocabulary(ctx.dims, fwd0, bwd0, ctx.parallel.tp,
                                       (train.micro_batch * train.seq_len, train.seq_len),
                                       made)
        return _platform_and_parallel(fwd, bwd, ctx, made, attention=attention,
                                      config=captured.config, tp_plan=None)

    fwd, bwd, applied = sharded(notes) if reuse is None else reuse.shared(
        captured, ("sharded", *_sharding_key(ctx.parallel, train, attention, ctx)), notes,
        sharded)

    def recipe(made: list[str]) -> tuple[OpGraph, OpGraph]:
        return _recipe_graphs(fwd, bwd, fwd0, ctx, made, plan=plan, mtp=mtp,
                              cross_entropy=cross_entropy)

    # the loss kernel, MTP, the precision recipe, LoRA: shared by the recompute variants
    # (recompute reads the forward, never changes it)
    fwd, bwd = recipe(notes) if reuse is None else reuse.shared(
        captured, ("recipe", *_sharding_key(ctx.parallel, train, attention, ctx),
                   plan, mtp, cross_entropy, train.lora_rank, train.lora_modules,
                   train.freeze_language_model),
        notes, recipe)
    bwd = apply_all(bwd, [Recompute(train.recompute, fwd, rules,
                                    modules=train.recompute_modules)], ctx)
    bwd = tp_overlap_hints(bwd, fwd, rules)
    return fwd, bwd, applied


def _recipe_graphs(fwd: OpGraph, bwd: OpGraph, fwd0: OpGraph, ctx: TransformContext,
                   notes: list[str], *, plan: PrecisionPlan, mtp: MtpSpec | None,
                   cross_entropy: str) -> tuple[OpGraph, OpGraph]:
    """:func:`_layer_graphs`' steps between the sharded graphs and recompute."""
    train = ctx.train
    assert train is not None
    if cross_entropy == "megatron":
        fwd, bwd = unfused_cross_entropy(fwd, bwd)
        notes.append("cross-entropy as Megatron's vocab_parallel_cross_entropy without loss "
                     "fusion: fp32 passes over the logits (52 bytes per logit)")
    elif cross_entropy == "te_inplace":
        fwd, bwd = inplace_cross_entropy(fwd, bwd)
        notes.append("cross-entropy as TransformerEngine's fused kernel up to TE 2.17: the "
                     "gradient written into the 16-bit logits, which are kept for backward")
    if mtp is not None and mtp.depths:
        kinds = mtp.kinds or tuple(
            t.kind for t in fwd.templates.values()
            if max(i for t2 in fwd.templates.values() for i in t2.indices) in t.indices)
        fwd, bwd, _ = add_mtp_layers(fwd, bwd, kinds, mtp.depths,
                                     shared_weights=mtp.shared_weights)
    if plan.low_precision and plan.high_precision_layers:
        fwd, bwd = split_layer_templates(fwd, bwd, plan.high_precision_layers)
    fwd = apply_all(fwd, [Precision(plan)], ctx)
    bwd = mark_weight_grads(fwd, bwd)
    bwd = apply_all(bwd, [Precision(plan, forward=fwd0)], ctx)
    if train.freeze_language_model and not train.lora_rank:
        from zrt_core.transforms.lora import frozen_nodes

        fwd_nodes, bwd_nodes = frozen_nodes(fwd, bwd)
        fwd, bwd = fwd.with_nodes(fwd_nodes), bwd.with_nodes(bwd_nodes)
        notes.append("language model frozen (Megatron-Bridge freeze_language_model): no "
                     "weight-gradient GEMMs, gradient reduction or optimizer states for its "
                     "weights; the backward still runs every layer's input gradients")
    if train.lora_rank:
        from zrt_core.transforms.lora import LoRA

        fwd, bwd = LoRA(train.lora_rank, train.lora_modules).apply_pair(fwd, bwd)
        where = ("each decoder linear layer" if train.lora_modules is None
                 else "the decoder's " + ", ".join(train.lora_modules))
        notes.append(f"LoRA: frozen base weights (no weight-gradient GEMMs), rank-"
                     f"{train.lora_rank} bf16 adapters on {where}, only they reduce "
                     "gradients and keep optimizer states")
    return fwd, bwd


def megatron_vocabulary(dims: ModelDims, fwd: OpGraph, bwd: OpGraph, tp: int,
                        tokens: tuple[int, ...], notes: list[str]) -> tuple[OpGraph, OpGraph]:
    """The training graphs with the vocabulary Megatron-Core allocates: padded to a
    multiple of 128 × TP (:mod:`zrt_core.transforms.vocab`), so each rank's output-layer
    GEMMs have rows of a multiple of 128. ``tokens``: the micro-batch's tokens and the
    sequence, sizes a dimension of the graphs has besides the hidden size."""
    from zrt_core.transforms.vocab import pad_vocabulary, padded_vocab

    padded = padded_vocab(dims.vocab, "megatron", tp)
    (fwd, bwd), note = pad_vocabulary((fwd, bwd), dims.vocab, padded,
                                      other_dims=(dims.hidden, *tokens))
    if note:
        notes.append(note + " (Megatron: a multiple of 128 × TP)")
    return fwd, bwd


def _sharding_key(parallel: Parallel, train: TrainSpec, attention: str,
                  ctx: TransformContext) -> tuple[Any, ...]:
    """What :func:`_platform_and_parallel` reads besides the capture: the per-layer degrees,
    the micro-batch, the attention kernel, the hardware and the plugin host."""
    return (parallel.tp, parallel.cp, parallel.ep, parallel.expert_tp,
            parallel.sequence_parallel(training=True), parallel.cp_kind,
            parallel.ep_dispatcher, parallel.moe_load, train.micro_batch, train.seq_len,
            attention, ctx.hardware, id(ctx.host))


def default_overlap(parallel: Parallel, train: TrainSpec) -> OverlapRules:
    """Megatron-Core's overlap flags as NeMo / Megatron-Bridge recipes enable them.

    ``--overlap-grad-reduce`` and ``--overlap-param-gather`` on; with TP > 1 and sequence
    parallelism, TransformerEngine's userbuffer overlap (``--tp-comm-overlap``) chunks each
    all-gather / reduce-scatter with its GEMM over the ``tp`` ranks, hiding all but one
    chunk: ``(tp − 1)/tp`` of the collective; backward TP collectives run beside the
    weight-gradient GEMMs; ring attention's KV exchange hides under the attention blocks.
    """
    sp = parallel.sequence_parallel(training=True)
    hidden = (parallel.tp - 1) / parallel.tp if parallel.tp > 1 and sp else 0.0
    return OverlapRules(tp_comm_overlap=hidden)


def legacy_overlap(*, tp_backward_async: bool = True) -> OverlapRules:
    """Megatron-LM as in 2021-22 (Narayanan et al., Korthikanti et al.): no grad-reduce or
    param-gather overlap, no TP userbuffer overlap. The backward TP all-reduce runs
    asynchronously beside the weight-gradient GEMM from late 2021
    (``--async-tensor-model-parallel-allreduce``, Korthikanti et al.'s runs); before it (the
    runs of Narayanan et al. 2021) it was the autograd function's blocking all-reduce:
    ``tp_backward_async=False``."""
    return OverlapRules(tp_comm_overlap=0.0, overlap_grad_reduce=False,
                        overlap_param_gather=False, tp_backward_async=tp_backward_async)


#: Sources whose recipes fuse the loss (Megatron-Bridge ``_benchmark_common``:
#: ``cross_entropy_loss_fusion`` with TransformerEngine's kernel; NVIDIA's MLPerf Training
#: configs from v4.1: ``cross_entropy_loss_fusion: True`` in GPT-3's (v4.1) and Llama 3.1
#: 405B's and 8B's ``custom.yaml`` (v5.0, v5.1); v4.0's and v3.1's GPT-3 configs leave it
#: out); every other Megatron-LM / NeMo source runs ``vocab_parallel_cross_entropy``
#: unfused, the default then.
FUSED_CROSS_ENTROPY_SOURCES = ("Megatron-Bridge", "MLPerf Training v4.1", "MLPerf Training v5.0",
                               "MLPerf Training v5.1")

#: Sources whose launcher sets ``NCCL_NVLS_ENABLE=0`` ("Disable NVLink SHARP to save
#: memory"): Megatron-Bridge's ``scripts/performance/executors.py`` (since its first perf
#: scripts, 2025-08) and per-recipe ``env_vars``; dgxc-benchmarking v25.05 runs NeMo's
#: ``scripts.performance.llm`` with NeMo's executor, which sets the same; NVIDIA's MLPerf
#: Training submissions export it in ``config_common.sh`` (GPT-3 from v3.1, Llama 3.1 405B
#: and 8B in v5.0 and v5.1; mlcommons/training_results_v3.1 … v5.1).
NO_NVLS_SOURCES = ("Megatron-Bridge", "dgxc-benchmarking", "MLPerf Training")

#: Sources whose fp8 runs reduce amaxes over the TP group only (NVIDIA's MLPerf Training
#: configs: ``tp_only_amax_red: True`` in v4.1's GPT-3 and v5.0's / v5.1's Llama 3.1
#: ``custom.yaml``; v3.1's and v4.0's GPT-3 reduce over DP × TP, Megatron's default).
TP_ONLY_AMAX_SOURCES = ("MLPerf Training v4.1", "MLPerf Training v5.0", "MLPerf Training v5.1")

#: Sources whose Megatron-LM predates the asynchronous backward TP all-reduce.
SYNC_TP_BACKWARD_SOURCES = ("Narayanan et al. 2021",)

#: Recipes (named in a record's ``notes``) that run TP > 1 with sequence parallelism but
#: without TransformerEngine's userbuffer overlap (``--tp-comm-overlap``): Megatron-Bridge's
#: Nemotron-H / Nemotron 3 perf recipes build on ``_pretrain_common`` (``comm_overlap=None``)
#: and set no ``CommOverlapConfig`` (``perf_recipes/nemotronh/gb200/nemotronh.py``: Nemotron
#: 3 Super at TP 2 + SP). Their forward all-gathers and reduce-scatters block; the backward
#: ones still run beside the GEMMs (TE's asynchronous gathers and reduce-scatters).
NO_TP_COMM_OVERLAP_RECIPES = ("perf_recipes/nemotronh/",)
#: Perf-config models (``zrt_core.recipes`` keys) whose every release's config is built that
#: way: Nemotron 3 Super's ``scripts/performance/configs/nemotronh/nemotron_3_llm_pretrain.py``
#: (v0.4.0 to v0.5.1) starts from the library recipe ``nemotron_3_super_pretrain_config``
#: (``_pretrain_common``: ``comm_overlap=None``) and sets none; ``perf_recipes/nemotronh``
#: from 381d0b825 on likewise.
NO_TP_COMM_OVERLAP_MODELS = ("nemotron_3_super",)

#: ``none``: eager launches; ``full``: whole layers replayed as CUDA graphs.
CUDA_GRAPH_MODES = ("none", "full")

#: Recipes that graph whole layers (Megatron-Core ``enable_cuda_graph``), as (source, model
#: name, hardware ids): Megatron-Bridge 25.09 (v0.1.0rc4) ``scripts/performance/configs/
#: qwen3/qwen3_30b_a3b_llm_pretrain.yaml`` sets ``cuda_graphs: true`` for B200 and GB200
#: (``set_cuda_graph_overrides`` → ``enable_cuda_graph``), with token drop padded to
#: capacity (static shapes); its H100 entry, Qwen3-235B on B200 / H100 and DeepSeek-V3 set
#: ``cuda_graphs: false``.
FULL_CUDA_GRAPH_RECIPES = (
    ("NeMo 25.09", "Qwen3-30B-A3B", ("nvidia_b200", "nvidia_gb200_nvl72")),
)


def _decoder_counts(ranges: Sequence[range], num_layers: int) -> list[int]:
    """Decoder layers (MTP layers left out) of each stage range."""
    return [len(range(r.start, min(r.stop, num_layers))) for r in ranges]


def _platform_and_parallel(fwd: OpGraph, bwd: OpGraph, ctx: TransformContext,
                           notes: list[str], *, attention: str = "flash",
                           config: Mapping[str, Any] | None = None, tp_plan: Any = None
                           ) -> tuple[OpGraph, OpGraph, tuple[str, ...]]:
    """The TP/SP/CP/EP transforms (:mod:`zrt_core.transforms.parallel`, forward then backward
    with shared tensor layouts, so saved activations keep their forward shapes), the
    attention kernels, then the platform's fusion rules on the per-rank graphs.

    Tensor parallelism follows Megatron's layout by module names (``TPPlan()``: column-
    parallel QKV / up / in_proj, row-parallel output / down / out_proj; routed experts split
    by ``etp`` alone), not a transformers ``base_model_tp_plan``: those describe HF's own TP
    (nemotron_h's splits the routed experts over TP, which Megatron does only with expert
    TP > 1), and reading them only when transformers happened to be imported made the
    estimate depend on whether a capture ran in the process (Nemotron 3 Super at TP 2:
    7.3 s from the disk cache, 4.8 s right after a capture). ``tp_plan`` overrides."""
    from zrt_core.transforms.fusion import Fusion
    from zrt_core.transforms.parallel import TPPlan, apply_phases

    plan = tp_plan or TPPlan()
    graphs = apply_phases({Phase.TRAIN_FORWARD: fwd, Phase.TRAIN_BACKWARD: bwd}, ctx, plan)
    fwd, bwd = graphs[Phase.TRAIN_FORWARD], graphs[Phase.TRAIN_BACKWARD]
    applied = ["parallel"]
    if attention == "unfused":
        cfg = config or {}
        dropout = float(cfg.get("attn_pdrop") or cfg.get("attention_dropout") or 0.0)
        unfused = UnfusedAttention(dropout=dropout)
        fwd, bwd = unfused.apply_pair(fwd, bwd)
        applied.append(unfused.name)
        notes.append("attention as Megatron-LM ran it before FlashAttention: full-square "
                     f"QK^T and PV GEMMs, fused softmax, dropout {dropout:g} on the scores")
    steps = around_fusion(ctx, Fusion())  # plugins' graph transforms around fusion
    fwd = apply_all(fwd, steps, ctx)
    bwd = apply_all(bwd, steps, ctx)
    applied.extend(t.name for t in steps)
    if attention in ATTENTION_GENERATIONS:
        fwd, bwd = (_mark_attention_kernel(g, attention) for g in (fwd, bwd))
        applied.append(f"attention_{attention}")
        notes.append(f"attention as {ATTENTION_GENERATION_NAMES[attention]} kernels run it, "
                     "at the rate published for them on this device (docs/cost-model.md, "
                     "\"Attention kernels\")")
    return fwd, bwd, tuple(applied)


def _mark_attention_kernel(graph: OpGraph, kernel: str) -> OpGraph:
    """``graph`` with its attention nodes marked as run by kernel generation ``kernel``
    (:data:`~zrt_core.cost.opdims.ATTENTION_KERNEL_ATTR`), which the roofline prices at
    that generation's rate."""
    nodes = [evolve(n, attrs={**n.attrs, ATTENTION_KERNEL_ATTR: kernel})
             if n.category == Category.ATTENTION else n for n in graph.nodes]
    return graph.with_nodes(nodes)
