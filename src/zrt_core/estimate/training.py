"""The training estimator: one step of a model on a machine and a parallel layout.

``estimate_training(model, hardware, parallel, train)`` captures ``train_forward`` and
``train_backward`` for one micro-batch (once per model, micro-batch and sequence; reused
across layouts), applies the platform's fusion rules, the parallel transforms (TP/SP/CP/EP),
the precision recipe, recompute, ZeRO gathers and the data-parallel gradient sync, prices
every node, schedules each pipeline stage's forward and backward on compute and
communication streams, composes the stage times with the pipeline schedule, adds the
gradient-sync tail and the optimizer step, and sizes memory per device.

The report's identities hold exactly (up to float rounding); ``docs/training-model.md``
derives each term:

    step      = pipeline + optimizer + exposed optimizer communication
    pipeline  = compute + exposed communication (in the pipeline) + bubble
    compute   = forward + backward + recompute

all for the critical pipeline rank (the busiest; the one the step waits for).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.checks import (
    _dims_for_layout,
    _mtp_layers,
    _schedule_name,
    check_hardware_arg,
    check_train_request,
    layout_notes,
    raw_config,
)
from zrt_core.cost.pricing import OUTSIDE_LAYERS
from zrt_core.errors import LayoutError, ModelError, SpecError
from zrt_core.estimate.captures import CapturedGraphs
from zrt_core.estimate.guards import check_flops, check_training
from zrt_core.estimate.host import HostModel, exposed_host_s, layer_host, phase_host
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    OpNode,
    Phase,
    _frozen_mapping,
    _thaw,
    dtype_bytes,
)
from zrt_core.reports.training import StageReport, TrainingMemory, TrainingReport
from zrt_core.schedule.pipeline import (
    SPLIT_BACKWARD,
    PipelineResult,
    StageTimes,
    check_schedule,
    p2p_times_s,
    simulate,
    stage_rank,
    virtual_stages,
)
from zrt_core.schedule.scheduler import OverlapRules, schedule_phase, weight_grad_s
from zrt_core.schedule.stages import StageSplit, plan_stages
from zrt_core.schedule.timeline import Timeline
from zrt_core.strategy import Parallel, TrainSpec, check_layout, train_spec_defaults
from zrt_core.transforms.base import TransformContext, apply_all, around_fusion
from zrt_core.transforms.training import (
    RECOMPUTE_ATTR,
    STATE_BYTES,
    GradientSync,
    ParamGather,
    ParamInventory,
    Precision,
    PrecisionPlan,
    Recompute,
    UnfusedAttention,
    add_mtp_layers,
    dp_groups,
    grad_dtype,
    mark_weight_grads,
    optimizer_graph,
    param_inventory,
    precision_plan,
    split_layer_templates,
    tp_overlap_hints,
    unfused_cross_entropy,
)

if TYPE_CHECKING:
    from zrt_core.capture.api import CaptureResult
    from zrt_core.cost.backend import NodeCost
    from zrt_core.hardware import HardwareSpec
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost

#: Fraction of a device's memory a training job may fill: the rest is the CUDA context,
#: NCCL's buffers and the caching allocator's fragmentation.
USABLE_MEMORY_FRACTION = 0.95
ATTENTION_KERNELS = ("flash", "unfused")
CROSS_ENTROPY_KERNELS = ("fused", "megatron")
_GROUP_ORDER = ("tp", "etp", "cp", "ep", "pp", "dp", "dp_cp", "edp", "host", "other")


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@frozen
class MtpSpec:
    """Multi-token prediction as the training recipe runs it (Megatron-Core
    ``--mtp-num-layers``): ``depths`` MTP modules, each a block of the layer ``kinds`` (empty:
    the kind of the last decoder layer, as DeepSeek's) with its own LM head and loss;
    ``shared_weights``: one block's weights at every depth (``mtp_use_repeated_layer``);
    ``bf16``: the MTP layers' linear layers stay bf16 under fp8/fp4 recipes
    (``keep_mtp_spec_in_bf16``). :func:`zrt_core.transforms.training.add_mtp_layers`."""

    depths: int
    kinds: tuple[str, ...] = field(default=(), converter=tuple)
    shared_weights: bool = False
    bf16: bool = False

    @property
    def layers(self) -> int:
        return self.depths * max(1, len(self.kinds))


#: Nemotron-H block characters (``hybrid_override_pattern``) → captured template kinds.
_NEMOTRON_KINDS = {"M": "mamba", "E": "moe", "*": "full_attention", "-": "mlp"}


def mtp_from_config(config: Mapping[str, Any]) -> MtpSpec | None:
    """The MTP the Megatron-Bridge recipes train with for a HF config that declares MTP
    layers (``num_nextn_predict_layers``): DeepSeek-V3/V4 one MoE block per layer declared;
    Nemotron 3 (Super, 3.5 Lightning) the ``mtp_hybrid_override_pattern`` block (``"*E"``)
    run at two depths with repeated weights and kept in bf16
    (``recipes/nemotronh``: ``mtp_num_layers = 2``, ``mtp_use_repeated_layer``,
    ``keep_mtp_spec_in_bf16``)."""
    n = _mtp_layers(config)
    if not n:
        return None
    if str(config.get("model_type")) == "nemotron_h":
        pattern = str(config.get("mtp_hybrid_override_pattern") or "*E")
        kinds = tuple(_NEMOTRON_KINDS[c] for c in pattern if c in _NEMOTRON_KINDS)
        return MtpSpec(depths=2, kinds=kinds, shared_weights=True, bf16=True)
    return MtpSpec(depths=n)


# -- captures ---------------------------------------------------------------------------------


@frozen
class TrainingCapture(CapturedGraphs):
    """What the estimator needs from a capture: ``train_forward`` and ``train_backward`` of
    one micro-batch, the config and the model's name; stored as JSON in the capture cache.
    """

    name: str
    model_type: str
    config: Mapping[str, Any] = field(converter=_frozen_mapping)
    graphs: Mapping[str, OpGraph] = field(converter=lambda g: dict(g))
    micro_batch: int
    seq_len: int
    dtype: str = "bfloat16"
    tp_plan: Any = None

    @property
    def model(self) -> str:
        return self.name

    @classmethod
    def from_capture(cls, result: Any) -> TrainingCapture:
        """From a :class:`zrt_core.capture.CaptureResult` holding both training phases."""
        from zrt_core.estimate.captures import config_tp_plan

        missing = [p for p in TRAIN_PHASES if p not in result.graphs]
        if missing:
            raise ModelError(f"the capture has no {', '.join(missing)} graph",
                             "capture with phases=('train_forward', 'train_backward')")
        fwd = result.graphs[Phase.TRAIN_FORWARD]
        return cls(name=result.model, model_type=result.model_type, config=result.config,
                   graphs={p: result.graphs[p] for p in TRAIN_PHASES},
                   micro_batch=int(fwd.meta.get("batch", result.options.batch)),
                   seq_len=int(fwd.meta.get("seq_len", result.options.seq_len)),
                   dtype=result.options.dtype, tp_plan=config_tp_plan(result.model_type))

    def to_json(self) -> dict[str, Any]:
        return {"cache_version": TRAIN_CACHE_VERSION, "name": self.name,
                "model_type": self.model_type, "config": _thaw(self.config),
                "graphs": {k: g.to_json() for k, g in self.graphs.items()},
                "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingCapture:
        if data.get("cache_version") != TRAIN_CACHE_VERSION:
            raise ValueError("stale cache entry")
        return cls(name=data["name"], model_type=data["model_type"], config=data["config"],
                   graphs={k: OpGraph.from_json(g) for k, g in data["graphs"].items()},
                   micro_batch=int(data["micro_batch"]), seq_len=int(data["seq_len"]),
                   dtype=data.get("dtype", "bfloat16"))


TRAIN_PHASES = (Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD)
TRAIN_CACHE_VERSION = 1
_CAPTURES: dict[tuple[str, int, int, str], TrainingCapture] = {}
_CAPTURE_CACHE_SIZE = 8


def capture_for_training(model: Any, micro_batch: int, seq_len: int, *, dtype: str = "bfloat16",
                         host: PluginHost | None = None, use_cache: bool | None = None
                         ) -> TrainingCapture:
    """``train_forward`` + ``train_backward`` of one micro-batch, kept in memory and in the
    capture cache on disk (``$ZRT_CACHE_DIR/captures``, keyed like serving captures on the
    config, the options and the installed versions; ``ZRT_NO_CACHE=1`` or
    ``use_cache=False`` turns it off), so a layout search or a second run re-uses it."""
    import os

    from zrt_core.capture.api import capture

    if isinstance(model, TrainingCapture):
        return model
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    key_model = (json.dumps(dict(model), sort_keys=True, default=str)
                 if isinstance(model, Mapping) else str(model))
    key = (key_model, micro_batch, seq_len, dtype)
    hit = _CAPTURES.get(key)
    if hit is not None:
        return hit
    if use_cache is None:
        use_cache = os.environ.get("ZRT_NO_CACHE", "") not in ("1", "true", "yes")
    path = None
    if use_cache and isinstance(model, str | os.PathLike | Mapping):
        from zrt_core.capture.sources import resolve_model
        from zrt_core.estimate.captures import cache_dir, cache_key

        resolved = resolve_model(model, host, check_model_type=False)
        marked = {**dict(resolved.config), "_zrt_training_micro_batch": micro_batch}
        digest = cache_key(marked, seq_len, dtype, host)
        path = cache_dir() / f"train-{resolved.name.replace('/', '--')[:60]}-{digest}.json"
        if path.is_file():
            try:
                result = TrainingCapture.from_json(json.loads(path.read_text()))
                _remember(key, result)
                return result
            except (ValueError, KeyError, TypeError):
                pass  # stale or damaged: capture again
    raw = capture(model, phases=TRAIN_PHASES, batch=micro_batch, seq_len=seq_len, host=host,
                  dtype=dtype)
    result = TrainingCapture.from_capture(raw)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(result.to_json(), separators=(",", ":")))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: estimation works, only slower next time
    _remember(key, result)
    return result


def _remember(key: tuple[str, int, int, str], result: TrainingCapture) -> None:
    if len(_CAPTURES) >= _CAPTURE_CACHE_SIZE:
        _CAPTURES.pop(next(iter(_CAPTURES)))
    _CAPTURES[key] = result


def capture_dtype(precision: str) -> str:
    return {"fp16": "float16", "fp32": "float32"}.get(precision, "bfloat16")


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
    :param attention: ``flash`` (fused FlashAttention kernels, as captured) or ``unfused``
        (Megatron-LM's 2021-22 attention core: full-square batched GEMMs, fused softmax and
        attention dropout over the scores; :class:`UnfusedAttention`).
    :param keep_timelines: keep the first stage's forward/backward timelines (for traces
        and HTML).
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
    :param cross_entropy: ``fused`` (one loss kernel: TransformerEngine's, Megatron's
        ``--cross-entropy-loss-fusion``) or ``megatron`` (``vocab_parallel_cross_entropy``'s
        fp32 passes over the logits: :func:`~zrt_core.transforms.training.
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
    check_flops(captured.config, {g.phase: g for g in (fwd0, bwd0)}, host, model=where)
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
    if zero_algorithm is not None and zero_algorithm not in ("ring", "pairwise"):
        raise SpecError(f"unknown ZeRO collective algorithm {zero_algorithm!r}",
                        "use ring or pairwise")
    if cross_entropy not in CROSS_ENTROPY_KERNELS:
        raise SpecError(f"unknown cross-entropy kernel {cross_entropy!r}",
                        f"use one of {', '.join(CROSS_ENTROPY_KERNELS)}")
    key = (id(captured), captured.name, parallel, train, attention, stage_split,
           zero_algorithm, rules, hw.id, hw.vendor, plan, mtp, cross_entropy, id(host))
    hit = _TRANSFORMED.get(key)
    if hit is not None and hit[0] is captured:
        _, fwd, bwd, bwd_sync, inventory, applied, transform_notes = hit
        notes.extend(transform_notes)
    else:
        before = len(notes)
        fwd, bwd, bwd_sync, inventory, applied = _transform(
            captured, fwd0, bwd0, ctx, notes, attention=attention, plan=plan, rules=rules,
            zero_algorithm=zero_algorithm, dims=dims, mtp=mtp, cross_entropy=cross_entropy)
        if len(_TRANSFORMED) >= _TRANSFORMED_SIZE:
            _TRANSFORMED.pop(next(iter(_TRANSFORMED)))
        _TRANSFORMED[key] = (captured, fwd, bwd, bwd_sync, inventory, applied,
                             tuple(notes[before:]))
    timings["transforms"] = time.perf_counter() - t0

    # -- prices -----------------------------------------------------------------------------
    t0 = time.perf_counter()
    from zrt_core.cost.pricing import build_backends, price_nodes

    backends = build_backends(hw, host)
    costs: dict[str, dict[int, NodeCost]] = {}
    for label, g in (("fwd", fwd), ("bwd", bwd), ("bwd_sync", bwd_sync)):
        costs[label] = price_nodes(g.nodes, backends)
    timings["price"] = time.perf_counter() - t0

    # -- stages -----------------------------------------------------------------------------
    t0 = time.perf_counter()
    saved = saved_activation_bytes(fwd, bwd)
    transient = transient_bytes(bwd)
    amax_s = _amax_reduction_s(fwd, plan, parallel, hw, amax_reduction, len(stage_ranges))
    if amax_s:
        notes.append(f"fp8 delayed scaling: a blocking amax all-reduce over {amax_reduction} "
                     f"({amax_s * 1e6:.0f} µs) after every stage's forward and backward")
    if cuda_graph not in CUDA_GRAPH_MODES:
        raise SpecError(f"unknown CUDA graph mode {cuda_graph!r}",
                        f"use one of {', '.join(CUDA_GRAPH_MODES)}")
    host_model = HostModel(
        launch_s=hw.efficiency.host_launch_us * 1e-6 if cuda_graph == "none" else 0.0,
        moe_sync=not moe_token_drop)
    stage_reports, stage_times, dp_tails, timelines = _stages(
        fwd, bwd, bwd_sync, costs, rules, schedule, parallel, stage_ranges, saved, transient,
        keep_timelines=keep_timelines, sync_s=amax_s, host_model=host_model,
        microbatches=m)
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
    message = _p2p_message_bytes(fwd, parallel, train, dims, plan)
    p2p, wrap = p2p_times_s(hw, parallel, message) if parallel.pp > 1 else ((0.0,), 0.0)
    vp = parallel.vp if schedule == "interleaved" else 1
    summary = _pipeline(schedule, stage_times, parallel.pp, vp, m, p2p, wrap)
    timings["pipeline"] = time.perf_counter() - t0

    # -- step -------------------------------------------------------------------------------
    opt = _optimizer(inventory, fwd.templates, stage_reports, parallel, train, plan, hw,
                     backends, rules, host_link_gb_per_s, notes)
    report = _compose(
        captured=captured, hw=hw, parallel=parallel, train=train, schedule=schedule,
        microbatches=m, stage_reports=stage_reports, summary=summary, dp_tails=dp_tails,
        optimizer=opt, inventory=inventory, plan=plan, p2p=p2p, wrap=wrap,
        notes=notes, applied=applied, timelines=timelines, stage_times=stage_times,
        fwd=fwd, bwd=bwd, dims=dims, host=ctx.host)
    timings["total"] = time.perf_counter() - started
    report = evolve(report, timings_s=timings)
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
               cross_entropy: str = "fused"
               ) -> tuple[OpGraph, OpGraph, OpGraph, ParamInventory, tuple[str, ...]]:
    """Every graph transform of one estimate: forward, backward for every micro-batch, the
    last micro-batch's backward with the gradient reduction, and the parameter inventory."""
    train = ctx.train
    assert train is not None
    parallel = ctx.parallel
    fwd, bwd, applied = _platform_and_parallel(fwd0, bwd0, ctx, notes, attention=attention,
                                               config=captured.config,
                                               tp_plan=None)
    if cross_entropy == "megatron":
        fwd, bwd = unfused_cross_entropy(fwd, bwd)
        notes.append("cross-entropy as Megatron's vocab_parallel_cross_entropy without loss "
                     "fusion: fp32 passes over the logits (52 bytes per logit)")
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
    if train.lora_rank:
        from zrt_core.transforms.lora import LoRA

        fwd, bwd = LoRA(train.lora_rank).apply_pair(fwd, bwd)
        notes.append(f"LoRA: frozen base weights (no weight-gradient GEMMs), rank-"
                     f"{train.lora_rank} bf16 adapters on each decoder linear layer, only "
                     "they reduce gradients and keep optimizer states")
    bwd = apply_all(bwd, [Recompute(train.recompute, fwd, rules)], ctx)
    bwd = tp_overlap_hints(bwd, fwd, rules)
    inventory = param_inventory(fwd, parallel, dims)
    if train.lora_rank:
        from zrt_core.transforms.lora import lora_inventory

        inventory = evolve(inventory, trainable=lora_inventory(fwd, parallel, dims))
    sharded_grads = train.zero >= 1 or train.fsdp
    zero3 = train.zero == 3 or train.fsdp
    gdtype = grad_dtype(train.precision)
    if zero3:
        gather = ParamGather(inventory, plan.activation_dtype, zero_algorithm)
        fwd = apply_all(fwd, [gather], ctx)
        bwd = apply_all(bwd, [gather], ctx)
    sync = GradientSync(inventory.trainable or inventory, gdtype, sharded=sharded_grads,
                        algorithm=zero_algorithm if zero3 else None)
    per_microbatch_sync = train.zero >= 2 or train.fsdp
    bwd_sync = apply_all(bwd, [sync], ctx)
    if per_microbatch_sync:
        bwd = bwd_sync
    return fwd, bwd, bwd_sync, inventory, applied


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
#: v4.1 GPT-3 config: ``cross_entropy_loss_fusion: True``); every other Megatron-LM / NeMo
#: source runs ``vocab_parallel_cross_entropy`` unfused, the default then.
FUSED_CROSS_ENTROPY_SOURCES = ("Megatron-Bridge", "MLPerf Training v4.1")

#: Sources whose fp8 runs reduce amaxes over the TP group only (NVIDIA's MLPerf Training
#: v4.1 GPT-3 configs: ``tp_only_amax_red: True``; v3.1's reduce over DP × TP, Megatron's
#: default).
TP_ONLY_AMAX_SOURCES = ("MLPerf Training v4.1",)

#: Sources whose Megatron-LM predates the asynchronous backward TP all-reduce.
SYNC_TP_BACKWARD_SOURCES = ("Narayanan et al. 2021",)

#: Recipes (named in a record's ``notes``) that run TP > 1 with sequence parallelism but
#: without TransformerEngine's userbuffer overlap (``--tp-comm-overlap``): Megatron-Bridge's
#: Nemotron-H / Nemotron 3 perf recipes build on ``_pretrain_common`` (``comm_overlap=None``)
#: and set no ``CommOverlapConfig`` (``perf_recipes/nemotronh/gb200/nemotronh.py``: Nemotron
#: 3 Super at TP 2 + SP). Their forward all-gathers and reduce-scatters block; the backward
#: ones still run beside the GEMMs (TE's asynchronous gathers and reduce-scatters).
NO_TP_COMM_OVERLAP_RECIPES = ("perf_recipes/nemotronh/",)

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
    return fwd, bwd, tuple(applied)


# -- activations and transient memory --------------------------------------------------------


def _members(node: OpNode) -> list[OpNode]:
    """A node, or the ops a fused node replaced (recursively)."""
    if not node.fused_from:
        return [node]
    out: list[OpNode] = []
    for m in node.fused_from:
        out.extend(_members(m))
    return out


_RANDOM_OPS = ("bernoulli", "rand", "dropout", "normal", "uniform")


def _forward_tensors(forward: OpGraph) -> tuple[dict[int, int], dict[int, Any], set[int]]:
    """What the forward graph says about its tensors: view → the storage it views (views of
    views followed, inside fused nodes too), storage id → its metadata, and the tensors a
    fused kernel recomputes in its backward instead of keeping.

    Recomputed: what a fused kernel produces internally (neither a view nor one of its
    outputs), and the outputs of a fused elementwise kernel that no other forward node
    reads (kept only for its backward: a fused bias-GeLU's backward recomputes tanh from
    the GEMM output, Megatron's ``bias_gelu``) — unless the kernel draws random numbers (a
    dropout mask must be kept).
    """
    base: dict[int, int] = {}
    meta: dict[int, Any] = {}
    internal: set[int] = set()
    read: set[int] = set()
    for n in forward.nodes:
        for t in n.inputs:
            if t.tensor_id is not None:
                read.add(t.tensor_id)
    for n in forward.nodes:
        boundary = {t.tensor_id for t in n.outputs}
        members = _members(n)
        fused = bool(n.fused_from)
        random = fused and any(any(r in m.op for r in _RANDOM_OPS) for m in members)
        for m in members:
            view = m.category == Category.VIEW
            src = m.inputs[0].tensor_id if m.inputs else None
            for t in m.outputs:
                tid = t.tensor_id
                if tid is None:
                    continue
                if view and src is not None:
                    base[tid] = base.get(src, src)
                elif tid not in meta:
                    meta[tid] = t
                    if fused and not random and tid not in boundary:
                        internal.add(tid)
        if fused and not random and n.category == Category.ELEMENTWISE:
            for t in n.outputs:
                if t.tensor_id is not None and t.tensor_id not in read:
                    internal.add(t.tensor_id)
    # a view of a recomputed tensor is recomputed with it
    for tid, root in base.items():
        if root in internal:
            internal.add(tid)
    return base, meta, internal


def saved_activation_bytes(forward: OpGraph, backward: OpGraph) -> dict[int | str, float]:
    """Bytes one micro-batch keeps from forward to backward, per layer template (key: its
    representative, one layer's worth) and outside the layers (``"embedding"`` and
    ``"head"`` sides).

    A saved activation is a tensor a backward node reads that no backward node produced
    and that is not a weight: capture shares tensor ids between the two phases
    (docs/architecture.md). Views count once, as the storage they view; a tensor saved in
    two dtypes (the bf16 original and an fp8 copy for a weight-gradient GEMM) counts both.
    A tensor a fused forward kernel produces internally is not kept: the fused backward
    kernel recomputes it from the fused kernel's inputs (Megatron's fused bias-GeLU keeps
    the GEMM output only). Under recompute the backward reads re-computed tensors, so only
    the checkpoints remain.
    """
    base, meta, internal = _forward_tensors(forward)
    produced = {t.tensor_id for n in backward.nodes for t in n.outputs
                if t.tensor_id is not None}
    first_layer = next((i for i, n in enumerate(backward.nodes)
                        if n.layer_index is not None), len(backward.nodes))
    seen: dict[int, tuple[int | str, set[str], int]] = {}
    for pos, n in enumerate(backward.nodes):
        key: int | str
        if n.layer_index is not None:
            key = n.layer_index
        else:
            key = "head" if pos < first_layer else "embedding"
        for t in n.inputs:
            tid = t.tensor_id
            if tid is None or t.param is not None or tid in produced:
                continue
            root = base.get(tid, tid)
            if root in internal:
                continue
            entry = seen.get(root)
            if entry is None:
                stored = meta.get(root)
                numel = stored.numel if stored is not None else t.numel
                seen[root] = (key, {stored.dtype if stored is not None and t.dtype ==
                                    stored.dtype else t.dtype}, numel)
            else:
                entry[1].add(t.dtype)
    out: dict[int | str, float] = {}
    for key, dtypes, numel in seen.values():
        out[key] = out.get(key, 0.0) + sum(numel * dtype_bytes(d) for d in dtypes)
    return out


def transient_bytes(backward: OpGraph) -> dict[int | str, float]:
    """Peak bytes of tensors a backward segment creates and frees while it runs (liveness
    over the segment's nodes in order: outputs allocated, freed after their last reader),
    per layer template and for the outer head / embedding segments."""
    segments: dict[int | str, list[OpNode]] = {}
    first_layer = next((i for i, n in enumerate(backward.nodes)
                        if n.layer_index is not None), len(backward.nodes))
    for pos, n in enumerate(backward.nodes):
        key: int | str = n.layer_index if n.layer_index is not None else (
            "head" if pos < first_layer else "embedding")
        segments.setdefault(key, []).append(n)
    out: dict[int | str, float] = {}
    for key, nodes in segments.items():
        last_use: dict[int, int] = {}
        for i, n in enumerate(nodes):
            for t in n.inputs:
                if t.tensor_id is not None:
                    last_use[t.tensor_id] = i
        live = 0.0
        peak = 0.0
        sizes: dict[int, float] = {}
        for i, n in enumerate(nodes):
            if not (n.zero_cost or n.category in (Category.VIEW, Category.COLLECTIVE)):
                for t in n.outputs:
                    if t.tensor_id is not None and not t.is_view and t.tensor_id not in sizes:
                        sizes[t.tensor_id] = t.nbytes
                        live += t.nbytes
            peak = max(peak, live)
            for t in (*n.inputs, *n.outputs):
                tid = t.tensor_id
                if tid in sizes and last_use.get(tid, -1) <= i:
                    live -= sizes.pop(tid)
        out[key] = peak
    return out


# -- per-stage schedules --------------------------------------------------------------------


def _stages(fwd: OpGraph, bwd: OpGraph, bwd_sync: OpGraph, costs: Mapping[str, Mapping[int,
            NodeCost]], rules: OverlapRules, schedule: str, parallel: Parallel,
            ranges: Sequence[range], saved: Mapping[int | str, float],
            transient: Mapping[int | str, float], *, keep_timelines: bool, sync_s: float = 0.0,
            host_model: HostModel | None = None, microbatches: int = 1
            ) -> tuple[list[StageReport], StageTimes, list[tuple[float, float]],
                       dict[str, Timeline]]:
    """Schedule each distinct stage; ``sync_s``: a blocking collective at the end of every
    stage forward and backward (the fp8 amax reduction), counted as exposed ``dp``;
    ``host_model``: the host's launch time the device waits for (:mod:`.host`), counted as
    exposed ``host``."""
    host_model = host_model or HostModel()
    fwd_host = layer_host(fwd, costs["fwd"], moe_sync=host_model.moe_sync) \
        if host_model.launch_s > 0 else {}
    bwd_host = phase_host(bwd, costs["bwd"]) if host_model.launch_s > 0 else {}
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
    reports: list[StageReport] = []
    dp_tails: list[tuple[float, float]] = []
    timelines: dict[str, Timeline] = {}
    n_stages = len(ranges)
    for v, layers in enumerate(ranges):
        first, last = v == 0, v == n_stages - 1
        signature = (tuple(kind_of.get(i, i) for i in layers), first, last)
        hit = cache.get(signature)
        if hit is None:
            lay = list(layers)
            if lay or first or last:
                ft = schedule_phase(fwd, costs["fwd"], rules, layers=lay, embedding_side=first,
                                    head_side=last)
                bt = schedule_phase(bwd, costs["bwd"], rules, layers=lay, embedding_side=first,
                                    head_side=last)
                st = schedule_phase(bwd_sync, costs["bwd_sync"], rules, layers=lay,
                                    embedding_side=first, head_side=last) \
                    if bwd_sync is not bwd else bt
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
            dp_busy = sum(v for k, v in st.stream_busy_s.items()
                          if k in ("comm.dp", "comm.dp_cp", "comm.edp"))
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
            hit = (ft, bt, st, recompute, min(wgrad, bt.makespan_s), act, trans, ff, bf,
                   dp_busy, by_category, by_kind, host_f, host_b)
            cache[signature] = hit
        (ft, bt, st, recompute, wgrad, act, trans, ff, bf, dp_busy, by_category, by_kind,
         host_f, host_b) = hit
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
        ep_hidden_f, ep_hidden_b = _ep_batch_overlap(rules, ft, bt, parallel.pp, microbatches)
        if ep_hidden_f + ep_hidden_b > 0:
            exposed["ep"] = exposed.get("ep", 0.0) - ep_hidden_f - ep_hidden_b
            hidden["ep"] = hidden.get("ep", 0.0) + ep_hidden_f + ep_hidden_b
        if sync_s:
            exposed["dp"] = exposed.get("dp", 0.0) + 2 * sync_s
        if host_f + host_b > 0:
            exposed["host"] = exposed.get("host", 0.0) + host_f + host_b
        reports.append(StageReport(
            stage=v, rank=stage_rank(schedule, parallel.pp, parallel.vp, v)
            if schedule != "dualpipe" else v, layers=(layers.start, layers.stop), first=first,
            last=last, forward_s=ft.makespan_s + sync_s + host_f - ep_hidden_f,
            backward_s=bt.makespan_s + sync_s + host_b - ep_hidden_b,
            weight_s=wgrad,
            forward_compute_s=ft.compute_s, backward_compute_s=bt.compute_s - recompute,
            recompute_s=recompute, exposed_comm_s=exposed, hidden_comm_s=hidden,
            activation_bytes=act, transient_bytes=trans, forward_flops=ff, backward_flops=bf,
            compute_by_category_s=by_category, compute_by_layer_kind_s=by_kind))
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


AMAX_REDUCTIONS = ("dp_tp", "tp", "none")


def _amax_reduction_s(fwd: OpGraph, plan: PrecisionPlan, parallel: Parallel,
                      hw: HardwareSpec, group: str, stages: int = 1) -> float:
    """One amax all-reduce of fp8 delayed scaling (TransformerEngine ``DelayedScaling`` with
    ``reduce_amax``: ``FP8GlobalStateManager.reduce_and_update_fp8_tensors`` at every
    autocast exit, over Megatron's amax-reduction group): 3 fp32 amaxes (input, weight,
    gradient) per linear GEMM of a (virtual) stage — latency-bound."""
    if plan.recipe != "fp8" or group == "none":
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


def _p2p_message_bytes(fwd: OpGraph, parallel: Parallel, train: TrainSpec, dims: ModelDims,
                       plan: PrecisionPlan) -> float:
    """One micro-batch's activation between stages, per rank: ``b·s·h`` 16-bit values split
    over TP (sequence parallel, or Megatron's scatter-gather optimisation without it) and
    CP."""
    elements = train.micro_batch * train.seq_len * dims.hidden
    return elements * dtype_bytes(plan.activation_dtype) / (parallel.tp * parallel.cp)


# -- pipeline ---------------------------------------------------------------------------------


@frozen
class _PipelineSummary:
    total_s: float
    critical_rank: int
    busy_s: tuple[float, ...]
    p2p_exposed_s: tuple[float, ...]
    bubble_s: tuple[float, ...]
    peak_inflight: tuple[int, ...]
    peak_activation_bytes: tuple[float, ...]
    # per rank: seconds from its last operation's end to the step's end, and per virtual
    # stage on the rank, seconds from its last backward's start to the step's end
    end_before_total_s: tuple[float, ...]
    last_backward_before_total_s: Mapping[int, float]
    result: PipelineResult | None


def _pipeline(schedule: str, times: StageTimes, pp: int, vp: int, m: int,
              p2p: Sequence[float], wrap: float) -> _PipelineSummary:
    """Simulate the schedule (exactly, however long: the simulation skips repeated steady
    states itself) and summarise what the step composition needs."""
    r = simulate(schedule, times, pp=pp, vp=vp, microbatches=m, p2p_s=p2p, p2p_wrap_s=wrap)
    return _summarise(r, schedule, pp, vp)


def _summarise(r: PipelineResult, schedule: str, pp: int, vp: int) -> _PipelineSummary:
    table = r._table  # the per-operation arrays; read once, vectorised
    import numpy as np

    end = table.start + table.duration
    end_before = []
    last_bwd: dict[int, float] = {}
    is_bwd = (table.kind == 1) | (table.kind == 3) | (table.kind == 4)
    bwd_stage = np.where(table.kind == 4, table.stage2, table.stage)
    for rank in range(pp):
        mask = table.rank == rank
        end_before.append(r.total_s - float(end[mask].max()) if mask.any() else 0.0)
    for v in np.unique(bwd_stage[is_bwd]).tolist():
        mask = is_bwd & (bwd_stage == v)
        last_bwd[int(v)] = r.total_s - float(table.start[mask].max())
    return _PipelineSummary(
        total_s=r.total_s, critical_rank=r.critical_rank,
        busy_s=tuple(s.busy_s for s in r.ranks),
        p2p_exposed_s=tuple(s.exposed_p2p_s for s in r.ranks),
        bubble_s=tuple(s.bubble_s for s in r.ranks),
        peak_inflight=tuple(s.peak_inflight for s in r.ranks),
        peak_activation_bytes=tuple(s.peak_activation_bytes or 0.0 for s in r.ranks),
        end_before_total_s=tuple(end_before), last_backward_before_total_s=last_bwd,
        result=r)


def _ep_batch_overlap(rules: OverlapRules, ft: Timeline, bt: Timeline, pp: int, m: int
                      ) -> tuple[float, float]:
    """EP all-to-all time hidden per micro-batch by batch-level overlap (forward, backward).

    Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``,
    ``megatron/core/pipeline_parallel/combined_1f1b.py``) runs micro-batch i+1's forward
    with micro-batch i's backward, layer by layer, the all-to-all of each under the other's
    computation: a pair lasts ``max(C, A)`` instead of ``C + A`` (C: both phases' compute,
    A: their exposed all-to-all), hiding ``min(A, C)``. The warm-up forwards and cool-down
    backwards of a pipeline stage have no partner: ``max(0, m − pp)`` of ``m`` micro-batches
    pair. The hidden time is split over forward and backward as their all-to-all is."""
    if not rules.ep_batch_overlap or m <= 1:
        return 0.0, 0.0
    a_f = ft.exposed_comm_s.get("ep", 0.0)
    a_b = bt.exposed_comm_s.get("ep", 0.0)
    total = a_f + a_b
    if total <= 0:
        return 0.0, 0.0
    paired = max(0, m - pp) / m
    hidden = min(total, ft.compute_s + bt.compute_s) * paired
    return hidden * a_f / total, hidden * a_b / total


def _rank_stages(schedule: str, pp: int, vp: int, m: int, n_stages: int
                 ) -> list[list[tuple[int, float]]]:
    """Per rank: (stage-report index, micro-batches it runs) for every stage it holds."""
    out: list[list[tuple[int, float]]] = [[] for _ in range(pp)]
    if schedule == "dualpipe":
        for r in range(pp):
            out[r] = [(r, m / 2), (pp - 1 - r, m / 2)]
        return out
    for v in range(n_stages):
        out[stage_rank(schedule, pp, vp, v)].append((v, float(m)))
    return out


# -- optimizer ---------------------------------------------------------------------------------


@frozen
class _OptimizerStep:
    compute_s: float
    comm_s: float
    comm_exposed_s: float
    comm_group: str
    per_rank_s: tuple[float, ...]
    weights_bytes: tuple[float, ...]
    gradients_bytes: tuple[float, ...]
    states_bytes: tuple[float, ...]
    host_states_bytes: tuple[float, ...]
    gather_buffer_bytes: tuple[float, ...]
    graphs: tuple[OpGraph, ...]


def _optimizer(inventory: ParamInventory, templates: Mapping[int, Any],
               stages: Sequence[StageReport], parallel: Parallel, train: TrainSpec,
               plan: PrecisionPlan, hw: HardwareSpec, backends: Sequence[Any],
               rules: OverlapRules, host_link_gb_per_s: float | None, notes: list[str]
               ) -> _OptimizerStep:
    from zrt_core.cost.pricing import price_nodes

    pp = parallel.pp
    dense_group, expert_group = dp_groups(parallel)
    dense_dp = parallel.span(dense_group)[0]
    expert_dp = parallel.span(expert_group)[0]
    shard_states = train.zero >= 1 or train.fsdp
    shard_grads = train.zero >= 2 or train.fsdp
    shard_params = train.zero == 3 or train.fsdp
    pbytes = dtype_bytes(plan.activation_dtype)
    gbytes = dtype_bytes(grad_dtype(train.precision))
    state = STATE_BYTES.get(train.optimizer, 12)
    link = host_link_gb_per_s or getattr(hw, "host_link_gb_per_s", None)
    per_rank: list[float] = []
    comm: list[float] = []
    weights: list[float] = []
    grads: list[float] = []
    states: list[float] = []
    host_states: list[float] = []
    buffers: list[float] = []
    graphs: list[OpGraph] = []
    group = dense_group
    for rank in range(pp):
        mine = [s for s in stages if s.rank == rank]
        layers = [i for s in mine for i in range(*s.layers)]
        first = any(s.first for s in mine)
        last = any(s.last for s in mine)
        trainable = inventory.trainable or inventory
        all_dense, all_expert = inventory.stage(layers, templates, first=first, last=last,
                                                pp=pp)
        dense, expert = trainable.stage(layers, templates, first=first, last=last, pp=pp)
        g = optimizer_graph(inventory, templates, layers, parallel, train, first=first,
                            last=last, plan=plan, host_link_gb_per_s=link)
        graphs.append(g)
        priced = price_nodes(g.nodes, backends)
        compute = comm_s = 0.0
        for n in g.nodes:
            mult = g.multiplicity(n)
            host_s = n.attrs.get("host_link_s")
            t = float(host_s) if host_s is not None else priced[n.id].time_s
            if n.category == Category.COLLECTIVE:
                comm_s += t * mult
                group = str(n.attrs.get("group", group))
            else:
                compute += t * mult
        per_rank.append(compute)
        comm.append(comm_s)
        dense_shard = dense_dp if shard_states else 1
        expert_shard = expert_dp if shard_states else 1
        opt_elements = dense / dense_shard + expert / expert_shard
        if train.offload_optimizer:
            states.append(0.0)
            host_states.append(opt_elements * state)
        else:
            states.append(opt_elements * state)
            host_states.append(0.0)
        grad_elements = (dense / dense_dp + expert / expert_dp) if shard_grads \
            else dense + expert
        grads.append(grad_elements * gbytes)
        param_elements = (all_dense / dense_dp + all_expert / expert_dp) if shard_params \
            else all_dense + all_expert
        w = param_elements * pbytes
        if plan.low_precision:
            # TransformerEngine keeps row- and column-wise low-precision weight copies
            w += 2 * plan.quantized_bytes(int(all_dense + all_expert), plan.gemm_dtype or "")
        weights.append(w)
        if shard_params:
            mine_layers = set(layers)
            largest = max([g.total for k, g in inventory.layers.items()
                           if templates.get(k) is not None
                           and mine_layers.intersection(templates[k].indices)] + [0])
            buffers.append(2 * largest * pbytes)  # the layer in use and the one prefetched
        else:
            buffers.append(0.0)
    worst = max(range(pp), key=lambda r: per_rank[r] + comm[r])
    exposed = 0.0 if rules.overlap_param_gather else comm[worst]
    if train.offload_optimizer:
        notes.append("optimizer states offloaded: the step moves gradients and weights over "
                     f"the host link at {link} GB/s; the host's own Adam time is not modelled")
    return _OptimizerStep(
        compute_s=per_rank[worst], comm_s=comm[worst], comm_exposed_s=exposed,
        comm_group=group, per_rank_s=tuple(per_rank), weights_bytes=tuple(weights),
        gradients_bytes=tuple(grads), states_bytes=tuple(states),
        host_states_bytes=tuple(host_states), gather_buffer_bytes=tuple(buffers),
        graphs=tuple(graphs))


# -- composing the step -------------------------------------------------------------------------


def _compose(*, captured: TrainingCapture, hw: HardwareSpec, parallel: Parallel, train: TrainSpec,
             schedule: str, microbatches: int, stage_reports: Sequence[StageReport],
             summary: _PipelineSummary, dp_tails: Sequence[tuple[float, float]],
             optimizer: _OptimizerStep, inventory: ParamInventory, plan: PrecisionPlan,
             p2p: Sequence[float], wrap: float, notes: list[str], applied: Sequence[str],
             timelines: Mapping[str, Timeline], stage_times: StageTimes, fwd: OpGraph,
             bwd: OpGraph, dims: ModelDims, host: PluginHost | None) -> TrainingReport:
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
    pipeline = summary.total_s
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
        stage_times=stage_times, p2p_s=tuple(p2p), p2p_wrap_s=wrap, timelines=timelines)


def _ordered(values: Mapping[str, float]) -> dict[str, float]:
    keys = sorted(values, key=lambda k: (_GROUP_ORDER.index(k) if k in _GROUP_ORDER else 99, k))
    return {k: values[k] for k in keys}


def _model_flops(captured: TrainingCapture, train: TrainSpec, notes: list[str],
                 host: PluginHost | None) -> float:
    """3 × the reference training forward of the global batch (causal attention, logits of
    every position): the core's analytic count, or a plugin's (``zrt_reference_flops``) for
    families the core does not describe; the captured forward where neither counts it."""
    from zrt_core.analytic.flops import reference_flops
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


@frozen
class TrainingCase:
    """The inputs of one estimate, as read from a validation record (SCHEMA.md) with
    Megatron-LM / NeMo defaults for what the record leaves null; ``assumptions`` lists each
    default that was taken."""

    config: Mapping[str, Any] = field(converter=_ro)
    hardware: str
    parallel: Parallel
    train: TrainSpec
    overlap: OverlapRules
    num_gpus: int
    attention: str = "flash"
    stage_split: str | StageSplit = "even"
    zero_algorithm: str | None = None
    assumptions: tuple[str, ...] = ()
    #: the source published no layout (tp, pp, cp, vp and dp all null): :func:`estimate_case`
    #: runs :func:`search_layout` instead of the placeholder ``parallel``
    layout_search: bool = False
    #: (first, last) decoder layers whose linear layers stay bf16 under an fp8/fp4 recipe
    bf16_layers: tuple[int, int] = (0, 0)
    #: multi-token prediction the recipe trains (:func:`mtp_from_config`)
    mtp: MtpSpec | None = None
    #: the loss kernels (``fused`` or ``megatron``)
    cross_entropy: str = "fused"
    #: fp8 delayed scaling's amax-reduction group (``dp_tp``, ``tp``, ``none``)
    amax_reduction: str = "dp_tp"
    #: MoE layers drop and pad tokens to capacity (no routing-count sync to the host)
    moe_token_drop: bool = False
    #: ``none`` (eager) or ``full`` (whole layers as CUDA graphs)
    cuda_graph: str = "none"


#: Share of the decoder layers, the last ones, whose linear layers NVIDIA's NVFP4 training
#: recipe keeps in BF16: about 15% of the linear layers ("Pretraining Large Language Models
#: with NVFP4", NVIDIA 2025); Megatron-Bridge's Nemotron 3 Super recipe
#: (``nemotron_3_super_bf16_with_nvfp4_mixed``): ``first_last_layers_bf16`` with the last 14
#: of 88 layers and none at the start.
NVFP4_BF16_TAIL = 14 / 88


#: Sources whose runs used Megatron-LM as of 2021-22, before overlapped gradient reduction,
#: parameter gathers and TP userbuffers existed.
LEGACY_MEGATRON_SOURCES = ("Narayanan et al. 2021", "Korthikanti et al. 2022")


#: What a record's notes say of a token-drop MoE run (Megatron-Bridge 25.09's
#: ``apply_moe_token_drop``: capacity factor 1, padded to capacity).
TOKEN_DROP_NOTE = "Token-drop MoE run"


def case_from_record(record: Mapping[str, Any]) -> TrainingCase:
    """Read a ``workload: train`` validation record (../shared/validation/SCHEMA.md).

    Null fields take Megatron-LM / NeMo defaults (docs/training-model.md): dp =
    GPUs / (tp × cp × pp); sequence parallelism on when tp > 1; the distributed optimizer
    (ZeRO-1); no FSDP; no recompute; micro-batch 1; bf16; expert TP = TP; 1F1B, interleaved
    when vp > 1; AdamW. Overlap flags: Megatron-Core's (:func:`default_overlap`), except
    for runs of Megatron-LM as published in 2021-22 (:func:`legacy_overlap`).

    :raises ModelError: the record is not a training record or lacks what cannot default.
    """
    if record.get("workload") != "train":
        raise ModelError(f"record {record.get('id')!r} is not a training record",
                         "only workload: train records have a training step")
    rid = record.get("id", "?")
    try:
        config = record["model"]["hf_config"]
        hardware = record["hardware"]
        num_gpus = int(record["num_gpus"])
        seq_len = int(record["seq_len"])
        global_batch = int(record["global_batch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"record {rid}: missing or bad field {exc}",
                         "see ../shared/validation/SCHEMA.md") from None
    raw = dict(record.get("parallel") or {})
    assumptions: list[str] = []
    layout_search = all(raw.get(k) is None for k in ("tp", "pp", "cp", "vp", "dp"))

    def take(key: str, default: Any, why: str) -> Any:
        value = raw.get(key)
        if value is None:
            assumptions.append(f"{key}={default} ({why})")
            return default
        return value

    tp = int(take("tp", 1, "not published"))
    pp = int(take("pp", 1, "not published"))
    cp = int(take("cp", 1, "not published"))
    vp = int(take("vp", 1, "no interleaving stated"))
    ep = int(take("ep", 1, "not published"))
    if raw.get("dp") is None:
        dp = max(1, num_gpus // (tp * pp * cp))
        assumptions.append(f"dp={dp} (GPUs / (tp × cp × pp))")
    else:
        dp = int(raw["dp"])
    etp = raw.get("etp")
    if etp is None and ep > 1:
        etp = 1
        assumptions.append("etp=1 (NeMo / Megatron-Bridge MoE recipes: experts are not "
                           "tensor-parallel)")
    sp = raw.get("sp")
    if sp is None and tp > 1:
        assumptions.append("sp on (Megatron/NeMo default with tp > 1)")
    zero = raw.get("zero")
    if zero is None:
        zero = 1
        assumptions.append("zero=1 (distributed optimizer)")
    fsdp = bool(raw.get("fsdp") or False)
    recipe = record_recipe(record)
    dispatcher = record_dispatcher(record, recipe, assumptions)
    parallel = Parallel(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=int(etp) if etp else None,
                        dp=dp, sp=None if sp is None else bool(sp), ep_dispatcher=dispatcher)
    recompute = record.get("recompute")
    if recompute is None:
        recompute = "none"
        assumptions.append("recompute=none")
    micro_batch = record.get("micro_batch")
    if micro_batch is None:
        micro_batch = 1
        assumptions.append("micro_batch=1")
    precision = record.get("precision")
    if precision is None:
        precision = "bf16"
        assumptions.append("precision=bf16 (16-bit mixed precision)")
    precision = str(precision).lower()  # as serving records are read: FP8 is fp8
    lora_rank = _lora_rank(record, assumptions)
    train = TrainSpec(micro_batch=int(micro_batch), global_batch=global_batch,
                      seq_len=seq_len, recompute=str(recompute), zero=int(zero), fsdp=fsdp,
                      optimizer="adamw", precision=str(precision),
                      pp_schedule="interleaved" if vp > 1 else "1f1b", lora_rank=lora_rank)
    source = str(record.get("source", ""))
    attention = "flash"
    if any(s in source for s in LEGACY_MEGATRON_SOURCES):
        attention = "unfused"
        assumptions.append("2021-22 attention kernels (no FlashAttention)")
    zero_algorithm = None
    if any(s in source for s in LEGACY_MEGATRON_SOURCES) and int(zero) == 3:
        zero_algorithm = "pairwise"
        assumptions.append("DeepSpeed ZeRO-3 of 2021: parameter gathers and gradient "
                           "reduce-scatters at one scale-out link per GPU")
    if any(s in source for s in LEGACY_MEGATRON_SOURCES) and int(zero) != 3:
        sync_tp = any(s in source for s in SYNC_TP_BACKWARD_SOURCES)
        overlap = legacy_overlap(tp_backward_async=not sync_tp)
        assumptions.append("Megatron-LM of 2021-22: no overlapped grad reduction, param "
                           "gather or TP userbuffers"
                           + ("; the backward TP all-reduce blocking (before "
                              "--async-tensor-model-parallel-allreduce)" if sync_tp else ""))
    else:
        overlap = default_overlap(parallel, train)
        notes = str(record.get("notes", ""))
        if overlap.tp_comm_overlap > 0 and any(r in notes for r in NO_TP_COMM_OVERLAP_RECIPES):
            overlap = evolve(overlap, tp_comm_overlap=0.0)
            assumptions.append("no TP userbuffer overlap (the recipe sets no comm_overlap: "
                               "forward TP/SP collectives block)")
        if recipe is not None and recipe.moe_a2a_overlap and ep > 1:
            overlap = evolve(overlap, ep_batch_overlap=True)
            assumptions.append("EP all-to-all overlapped across micro-batches "
                               f"(overlap_moe_expert_parallel_comm, {_recipe_name(recipe)})")
    try:
        from zrt_core.modelinfo import ModelDims

        layers = ModelDims.from_config(config).layers
    except ModelError:
        layers = 0
    cross_entropy = "fused"
    if not any(s in source for s in FUSED_CROSS_ENTROPY_SOURCES):
        cross_entropy = "megatron"
        assumptions.append("cross-entropy unfused (Megatron-LM / NeMo default before "
                           "--cross-entropy-loss-fusion; Megatron-Bridge recipes fuse it)")
    amax_reduction = "dp_tp"
    if any(s in source for s in TP_ONLY_AMAX_SOURCES):
        amax_reduction = "tp"
        assumptions.append("fp8 amax reduction over TP only (tp_only_amax_red)")
    mtp = mtp_from_config(config)
    if mtp is not None:
        assumptions.append(f"multi-token prediction trained: {mtp.depths} depth(s) of "
                           f"{'+'.join(mtp.kinds) or 'the last layer kind'} (the config's "
                           "num_nextn_predict_layers; Megatron-Bridge recipes)")
    bf16_layers = (0, 0)
    if str(precision) == "nvfp4" and layers:
        bf16_layers = (0, round(layers * NVFP4_BF16_TAIL))
        assumptions.append(f"nvfp4: the last {bf16_layers[1]} of {layers} layers keep bf16 "
                           "linear layers (NVIDIA's NVFP4 recipe, Megatron-Bridge "
                           "first_last_layers_bf16)")
    stage_split = _record_stage_split(raw, layers, pp, vp, assumptions)
    moe_token_drop = TOKEN_DROP_NOTE in str(record.get("notes", "")) or bool(
        recipe is not None and recipe.moe_pad_expert_input_to_capacity)
    if moe_token_drop:
        assumptions.append("MoE token drop padded to capacity (moe_pad_expert_input_to_capacity:"
                           " no routing-count sync to the host)")
    cuda_graph = "none"
    name = str((record.get("model") or {}).get("name", ""))
    if any(s in source and m == name and hardware in hws
           for s, m, hws in FULL_CUDA_GRAPH_RECIPES) or (
            recipe is not None and _whole_graphs(recipe)):
        cuda_graph = "full"
        assumptions.append("whole layers as CUDA graphs (the recipe's enable_cuda_graph)")
    if layout_search:
        assumptions = [a for a in assumptions if not a.startswith(("tp=", "pp=", "cp=", "vp=",
                                                                   "dp=", "sp on"))]
        assumptions.append("layout not published: the fastest feasible Megatron layout "
                           "(search_layout: tp within the NVLink domain dividing the heads, "
                           "pp dividing the layers, dp the rest, the global batch divisible, "
                           "memory within capacity)")
    return TrainingCase(config=config, hardware=str(hardware), parallel=parallel, train=train,
                        overlap=overlap, num_gpus=num_gpus, attention=attention,
                        stage_split=stage_split, zero_algorithm=zero_algorithm,
                        assumptions=tuple(assumptions), layout_search=layout_search,
                        bf16_layers=bf16_layers, mtp=mtp, cross_entropy=cross_entropy,
                        amax_reduction=amax_reduction, moe_token_drop=moe_token_drop,
                        cuda_graph=cuda_graph)


def record_recipe(record: Mapping[str, Any]) -> Any:
    """The Megatron-Bridge perf recipe a record was measured with (:mod:`zrt_core.recipes`:
    the release's config read from its source), or None for other sources and records
    whose published layout no config of their release has."""
    if "Megatron-Bridge" not in str(record.get("source", "")):
        return None
    from zrt_core.recipes import lookup

    return lookup(record)


def record_dispatcher(record: Mapping[str, Any], recipe: Any, assumptions: list[str]) -> str:
    """The MoE token dispatcher of a record's run: ``parallel.ep_dispatcher`` when the record
    states it (zrt's extension of the schema), else its recipe's (Megatron-Core's flex
    dispatcher with a DeepEP or HybridEP backend), else Megatron-Core's ``alltoall``."""
    raw = dict(record.get("parallel") or {})
    value = raw.get("ep_dispatcher")
    if value is not None:
        return str(value)
    if recipe is not None and recipe.moe_token_dispatcher_type == "flex" \
            and recipe.moe_flex_dispatcher_backend in ("deepep", "hybridep"):
        assumptions.append(f"EP dispatch: flex + {recipe.moe_flex_dispatcher_backend} "
                           f"({_recipe_name(recipe)})")
        return str(recipe.moe_flex_dispatcher_backend)
    return "alltoall"


def _whole_graphs(recipe: Any) -> bool:
    """The recipe replays whole layers or the whole iteration as CUDA graphs: Megatron-Core's
    ``cuda_graph_impl = "full_iteration"``, or ``"local"`` graphs of whole layers (no scope,
    or the ``full_iteration`` one). Scoped TransformerEngine graphs (``attn``,
    ``moe_router``...) leave the experts eager: not whole."""
    impl = recipe.cuda_graph_impl
    scope = tuple(recipe.cuda_graph_scope or ())
    return impl == "full_iteration" or (impl == "local" and scope in ((), ("full_iteration",)))


def _recipe_name(recipe: Any) -> str:
    return f"Megatron-Bridge {recipe.provenance_tag} {recipe.provenance_config}"


#: Record fields (under ``parallel``) that give the pipeline split, by Megatron's argument
#: names: ``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
#: ``--pipeline-model-parallel-layout``.
STAGE_SPLIT_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                      "pipeline_model_parallel_layout")


def _record_stage_split(raw: Mapping[str, Any], layers: int, pp: int, vp: int,
                        assumptions: list[str]) -> str | StageSplit:
    """The split a record gives (:data:`STAGE_SPLIT_FIELDS`), else Megatron's even split,
    else ``auto`` (the embedding and loss counted, else the balanced layout: the estimate
    notes which)."""
    first, last, layout = (raw.get(k) for k in STAGE_SPLIT_FIELDS)
    if first is not None or last is not None or layout is not None:
        try:
            return StageSplit(first_layers=None if first is None else int(first),
                              last_layers=None if last is None else int(last),
                              layout=None if layout is None else str(layout))
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"bad pipeline split in the record ({exc})",
                              "give integer layer counts or a layout string") from None
    if layers and layers % (pp * vp):
        assumptions.append(f"{layers} layers over pp × vp = {pp * vp} stages, no split "
                           "published: Megatron-Core's embedding/loss accounting, else the "
                           "balanced layout (the estimate's notes say which)")
        return "auto"
    return "even"


def _lora_rank(record: Mapping[str, Any], assumptions: list[str]) -> int:
    """The LoRA rank of a fine-tuning record: its ``peft`` field (``lora``, or a mapping with
    ``method: lora`` and ``rank``), else ``lora`` as a token of its id (the Megatron-Bridge
    LoRA rows) at Megatron-Bridge's default rank; 0 for full training."""
    from zrt_core.transforms.lora import DEFAULT_LORA_RANK

    peft = record.get("peft")
    if isinstance(peft, Mapping):
        if str(peft.get("method", "lora")).lower() != "lora":
            raise ModelError(f"record {record.get('id')}: peft method {peft.get('method')!r} "
                             "is not modelled", "only LoRA (peft: lora) is")
        return int(peft.get("rank") or DEFAULT_LORA_RANK)
    if isinstance(peft, str) and peft.lower() not in ("none", ""):
        if peft.lower() != "lora":
            raise ModelError(f"record {record.get('id')}: peft {peft!r} is not modelled",
                             "only LoRA (peft: lora) is")
        return DEFAULT_LORA_RANK
    if peft is None and "lora" in str(record.get("id", "")).lower().split("-"):
        assumptions.append(f"LoRA fine-tuning (the id says lora): rank {DEFAULT_LORA_RANK} "
                           "adapters on linear_qkv/proj/fc1/fc2, base weights frozen "
                           "(Megatron-Bridge's LoRA defaults)")
        return DEFAULT_LORA_RANK
    return 0


def estimate_case(case: TrainingCase, *, host: PluginHost | None = None,
                  captured: TrainingCapture | CaptureResult | None = None,
                  **options: Any) -> TrainingReport:
    """:func:`estimate_training` with every input a :class:`TrainingCase` carries (layout,
    recipe, overlap rules, attention kernels, stage split, ZeRO collectives); ``options``
    adds or overrides keyword arguments (``keep_timelines=True``, a hardware spec...)."""
    if case.layout_search:
        return search_layout(case, host=host, captured=captured, **options)
    kwargs: dict[str, Any] = {
        "host": host, "captured": captured, "overlap": case.overlap,
        "num_gpus": case.num_gpus, "attention": case.attention,
        "stage_split": case.stage_split, "zero_algorithm": case.zero_algorithm,
        "bf16_layers": case.bf16_layers, "mtp": case.mtp,
        "cross_entropy": case.cross_entropy, "amax_reduction": case.amax_reduction,
        "moe_token_drop": case.moe_token_drop, "cuda_graph": case.cuda_graph}
    hardware = options.pop("hardware", case.hardware)
    kwargs.update(options)
    return estimate_training(case.config, hardware, case.parallel, case.train, **kwargs)


#: Largest tensor-parallel degree :func:`search_layout` tries: Megatron users keep TP inside
#: an 8-GPU board even on larger NVLink domains (TE userbuffers and the TP collectives of
#: every layer), and no published recipe goes beyond it.
MAX_SEARCH_TP = 8


def layout_candidates(dims: ModelDims, num_gpus: int, global_batch: int, micro_batch: int,
                      nvlink_domain: int | None, *, usable_bytes: float | None = None
                      ) -> list[Parallel]:
    """The Megatron layouts a user of the framework could run for an unpublished layout:
    ``tp`` a divisor of the attention heads (and of the KV heads or a multiple of them, and
    of the FFN width) within the NVLink domain and at most :data:`MAX_SEARCH_TP`; ``pp`` a
    divisor of the layers; ``dp = GPUs / (tp × pp)`` whole, with the global batch a multiple
    of ``micro_batch × dp`` and at least ``pp`` micro-batches; no context or expert
    parallelism, no interleaving. With
    ``usable_bytes``, layouts whose weights, fp32 gradients and sharded AdamW states alone
    exceed it (a lower bound on what a rank holds: ``P / (tp·pp) · (2 + 4 + 12/dp)``, with
    ``P`` counted without gated FFNs or biases) are left out."""
    top = min(MAX_SEARCH_TP, nvlink_domain or MAX_SEARCH_TP)
    params = dims.layers * (dims.hidden * (dims.heads + 2 * dims.kv_heads) * dims.head_dim
                            + dims.heads * dims.head_dim * dims.hidden
                            + 2 * dims.hidden * max(dims.ffn, dims.moe_ffn)) \
        + dims.vocab * dims.hidden
    out = []
    for tp in range(1, top + 1):
        if dims.heads % tp or (dims.kv_heads % tp and tp % dims.kv_heads) or \
                (dims.ffn and dims.ffn % tp) or num_gpus % tp:
            continue
        for pp in range(1, dims.layers + 1):
            if dims.layers % pp or num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if global_batch % (micro_batch * dp) or global_batch // (micro_batch * dp) < pp:
                continue
            if usable_bytes is not None and \
                    params / (tp * pp) * (2 + 4 + 12 / dp) > usable_bytes:
                continue
            out.append(Parallel(tp=tp, pp=pp, dp=dp))
    return out


def search_layout(case: TrainingCase, *, host: PluginHost | None = None,
                  captured: TrainingCapture | CaptureResult | None = None,
                  **options: Any) -> TrainingReport:
    """Estimate a record whose source did not publish its layout: every candidate of
    :func:`layout_candidates` with the case's recipe (1F1B, Megatron-Core's overlap flags),
    and the fastest one that fits in memory (the fastest of all, noted as not fitting, when
    none does). The report's ``parallel`` is the chosen layout and its notes say how many
    were tried."""
    from zrt_core.errors import ZrtError
    from zrt_core.modelinfo import ModelDims

    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    hardware = options.pop("hardware", case.hardware)
    hw = host.hardware_spec(hardware) if isinstance(hardware, str) else hardware
    dims = ModelDims.from_config(case.config)
    usable = hw.memory.capacity_gb * 2.0 ** 30 * USABLE_MEMORY_FRACTION
    tier0 = hw.interconnect[0].devices if hw.interconnect else None
    candidates = layout_candidates(dims, case.num_gpus, case.train.global_batch,
                                   case.train.micro_batch, tier0, usable_bytes=usable)
    if not candidates:
        raise LayoutError(
            f"no Megatron layout of {case.num_gpus} GPUs divides the model and the global "
            f"batch of {case.train.global_batch}",
            "publish the layout in the record (parallel.tp, pp, dp)")
    best: TrainingReport | None = None
    tried = 0
    for par in candidates:
        train = evolve(case.train, pp_schedule="1f1b")
        try:
            report = estimate_training(
                case.config, hw, par, train, host=host, captured=captured,
                overlap=default_overlap(par, train), num_gpus=case.num_gpus,
                attention=case.attention, zero_algorithm=case.zero_algorithm,
                bf16_layers=case.bf16_layers, mtp=case.mtp,
                cross_entropy=case.cross_entropy, amax_reduction=case.amax_reduction,
                moe_token_drop=case.moe_token_drop, cuda_graph=case.cuda_graph, **options)
        except ZrtError:
            continue
        tried += 1
        key = (not report.feasible, report.step_time_s)
        if best is None or key < (not best.feasible, best.step_time_s):
            best = report
    if best is None:
        raise LayoutError(f"none of the {len(candidates)} candidate layouts could be estimated")
    p = best.parallel
    note = (f"layout not published: searched {tried} Megatron layouts of {case.num_gpus} GPUs "
            f"(tp ≤ {min(MAX_SEARCH_TP, tier0 or MAX_SEARCH_TP)} dividing the heads, pp "
            f"dividing the layers, dp the rest); the fastest that fits: tp {p.tp} × pp {p.pp} "
            f"× dp {p.dp}")
    return evolve(best, notes=(note, *best.notes))


__all__ = [
    "LEGACY_MEGATRON_SOURCES",
    "NO_TP_COMM_OVERLAP_RECIPES",
    "SYNC_TP_BACKWARD_SOURCES",
    "MtpSpec",
    "TrainingCapture",
    "TrainingCase",
    "capture_for_training",
    "case_from_record",
    "default_overlap",
    "estimate_case",
    "estimate_training",
    "layout_candidates",
    "legacy_overlap",
    "mtp_from_config",
    "saved_activation_bytes",
    "search_layout",
    "train_spec_defaults",
    "transient_bytes",
]
