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

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core.capture.sources import (  # noqa: F401  (the old module's imported names)
    raw_config,
)
from zrt_core.checks import (  # noqa: F401  (the old module's imported names)
    _dims_for_layout,
    _mtp_layers,
    _schedule_name,
    check_hardware_arg,
    check_train_request,
    layout_notes,
)
from zrt_core.cost.pricing import (  # noqa: F401  (the old module's imported names)
    OUTSIDE_LAYERS,
)
from zrt_core.errors import (  # noqa: F401  (the old module's imported names)
    LayoutError,
    ModelError,
    SpecError,
)
from zrt_core.estimate.captures import (  # noqa: F401  (the old module's imported names)
    CapturedGraphs,
)
from zrt_core.estimate.guards import (  # noqa: F401  (the old module's imported names)
    check_flops,
    check_training,
)
from zrt_core.estimate.host import (  # noqa: F401  (the old module's imported names)
    HostModel,
    exposed_host_s,
    layer_host,
    phase_host,
)
from zrt_core.estimate.training.activations import (  # noqa: F401
    _RANDOM_OPS,
    _forward_tensors,
    saved_activation_bytes,
    transient_bytes,
)
from zrt_core.estimate.training.capture import (  # noqa: F401
    _CAPTURE_CACHE_SIZE,
    _CAPTURES,
    TRAIN_CACHE_VERSION,
    TRAIN_PHASES,
    TrainingCapture,
    _remember,
    capture_dtype,
    capture_for_training,
)
from zrt_core.estimate.training.compose import (  # noqa: F401
    _compose,
    _memory,
    _model_flops,
    _ordered,
)
from zrt_core.estimate.training.estimator import (  # noqa: F401
    _TRANSFORMED,
    _TRANSFORMED_SIZE,
    CUDA_GRAPH_MODES,
    FULL_CUDA_GRAPH_RECIPES,
    FUSED_CROSS_ENTROPY_SOURCES,
    NO_NVLS_SOURCES,
    NO_TP_COMM_OVERLAP_MODELS,
    NO_TP_COMM_OVERLAP_RECIPES,
    SYNC_TP_BACKWARD_SOURCES,
    TP_ONLY_AMAX_SOURCES,
    _decoder_counts,
    _platform_and_parallel,
    _transform,
    default_overlap,
    estimate_training,
    legacy_overlap,
)
from zrt_core.estimate.training.optimizer import (  # noqa: F401
    _optimizer,
    _OptimizerStep,
)
from zrt_core.estimate.training.pipeline import (  # noqa: F401
    _pipeline,
    _PipelineSummary,
    _rank_stages,
    _summarise,
)
from zrt_core.estimate.training.records import (  # noqa: F401
    LEGACY_MEGATRON_SOURCES,
    MAX_SEARCH_TP,
    NVFP4_BF16_TAIL,
    STAGE_SPLIT_FIELDS,
    TOKEN_DROP_NOTE,
    TrainingCase,
    _lora_rank,
    _recipe_name,
    _record_stage_split,
    _whole_graphs,
    case_from_record,
    estimate_case,
    layout_candidates,
    record_dispatcher,
    record_recipe,
    search_layout,
)
from zrt_core.estimate.training.spec import (  # noqa: F401
    _GROUP_ORDER,
    _NEMOTRON_KINDS,
    ATTENTION_KERNELS,
    CROSS_ENTROPY_KERNELS,
    USABLE_MEMORY_FRACTION,
    MtpSpec,
    _ro,
    mtp_at_depths,
    mtp_from_config,
)
from zrt_core.estimate.training.stages import (  # noqa: F401
    AMAX_REDUCTIONS,
    _amax_reduction_s,
    _ep_batch_overlap,
    _p2p_message_bytes,
    _stages,
)
from zrt_core.ir.graph import (  # noqa: F401  (the old module's imported names)
    Category,
    OpGraph,
    OpNode,
    Phase,
    _frozen_mapping,
    _thaw,
    dtype_bytes,
)
from zrt_core.reports.training import (  # noqa: F401  (the old module's imported names)
    StageReport,
    TrainingMemory,
    TrainingReport,
)
from zrt_core.schedule.pipeline import (  # noqa: F401  (the old module's imported names)
    SPLIT_BACKWARD,
    PipelineResult,
    StageTimes,
    check_schedule,
    p2p_times_s,
    simulate,
    stage_rank,
    virtual_stages,
)
from zrt_core.schedule.scheduler import (  # noqa: F401  (the old module's imported names)
    OverlapRules,
    schedule_phase,
    weight_grad_s,
)
from zrt_core.schedule.stages import (  # noqa: F401  (the old module's imported names)
    StageSplit,
    plan_stages,
)
from zrt_core.schedule.timeline import (  # noqa: F401  (the old module's imported names)
    Timeline,
)
from zrt_core.strategy import (  # noqa: F401  (the old module's imported names)
    Parallel,
    TrainSpec,
    check_layout,
    train_spec_defaults,
)
from zrt_core.transforms.base import (  # noqa: F401  (the old module's imported names)
    TransformContext,
    apply_all,
    around_fusion,
)
from zrt_core.transforms.training import (  # noqa: F401  (the old module's imported names)
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
    inplace_cross_entropy,
    mark_weight_grads,
    optimizer_graph,
    param_inventory,
    precision_plan,
    split_layer_templates,
    tp_overlap_hints,
    unfused_cross_entropy,
)

__all__ = [
    "LEGACY_MEGATRON_SOURCES",
    "NO_TP_COMM_OVERLAP_MODELS",
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
    "mtp_at_depths",
    "mtp_from_config",
    "saved_activation_bytes",
    "search_layout",
    "train_spec_defaults",
    "transient_bytes",
]
