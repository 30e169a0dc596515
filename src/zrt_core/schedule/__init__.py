"""Scheduling: costed nodes on per-device streams (a :class:`Timeline`), and pipeline
schedules composing stage times into a training step (:func:`simulate`)."""

from zrt_core.schedule.pipeline import (
    SCHEDULES,
    SPLIT_BACKWARD,
    PipelineOp,
    PipelineResult,
    RankStats,
    StageTimes,
    boundary_tiers,
    check_schedule,
    p2p_times_s,
    schedule_orders,
    simulate,
    stage_rank,
    virtual_stages,
)
from zrt_core.schedule.scheduler import (
    CommPlan,
    OverlapRules,
    is_weight_grad,
    schedule_phase,
    schedule_region,
    weight_grad_s,
)
from zrt_core.schedule.timeline import Event, Region, Timeline

__all__ = [
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "CommPlan",
    "Event",
    "OverlapRules",
    "PipelineOp",
    "PipelineResult",
    "RankStats",
    "Region",
    "StageTimes",
    "Timeline",
    "boundary_tiers",
    "check_schedule",
    "is_weight_grad",
    "p2p_times_s",
    "schedule_orders",
    "schedule_phase",
    "schedule_region",
    "simulate",
    "stage_rank",
    "virtual_stages",
    "weight_grad_s",
]
