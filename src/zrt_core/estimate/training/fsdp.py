"""ZeRO-3 / FSDP / HSDP in the training estimate: which graphs carry the parameter gathers
and the gradient reduction (:func:`zrt_core.fsdp.sharding_plan`), and the start-of-step
delay of gathering once per step under a pipeline (docs/fsdp.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from zrt_core.fsdp import sharding_plan
from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.base import TransformContext, apply_all
from zrt_core.transforms.training import GradientSync, ParamGather, ParamInventory

if TYPE_CHECKING:
    from zrt_core.cost.backend import NodeCost
    from zrt_core.reports.training import StageReport
    from zrt_core.schedule.scheduler import OverlapRules


def apply_sharding(fwd: OpGraph, bwd: OpGraph, ctx: TransformContext,
                   inventory: ParamInventory, *, param_dtype: str, grad_dtype: str,
                   algorithm: str | None, notes: list[str]
                   ) -> tuple[OpGraph | None, OpGraph, OpGraph, OpGraph]:
    """``(first forward, forward, backward, last backward)`` with the plan's collectives.

    - Parameters sharded (ZeRO-3 / FSDP): each layer's all-gather before its forward,
      prefetched one layer ahead. With the parameters kept gathered for the whole step
      (``gather_once``) only the first micro-batch's forward carries them (returned
      first; None otherwise).
    - Re-sharded after forward: the backward gathers again, over the shard group
      (``reshard_after_forward=True``) or the re-shard group (an int).
    - The gradient reduction (reduce-scatter, and the HSDP replicas' all-reduce) on the last
      micro-batch's backward, or on every backward when ``grads_per_microbatch``.
    """
    train = ctx.train
    assert train is not None
    plan = sharding_plan(ctx.parallel, train)
    fwd_first = None
    if plan.gather:
        gathered = apply_all(fwd, [ParamGather(inventory, param_dtype, algorithm, plan=plan)],
                             ctx)
        if plan.gather_once:
            fwd_first = gathered
        else:
            fwd = gathered
        if plan.reshard != "none":
            bwd = apply_all(bwd, [ParamGather(inventory, param_dtype, algorithm, plan=plan,
                                              post_forward=plan.reshard == "partial")], ctx)
        notes.append(plan.describe())
    if train.zero >= 2 and not train.fsdp and ctx.parallel.pp > 1:
        # deepspeed/runtime/pipe/engine.py: PipelineEngine asserts zero_optimization_stage()
        # < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        notes.append(f"ZeRO-{train.zero} with pp {ctx.parallel.pp}: DeepSpeed's pipeline engine "
                     "refuses ZeRO-2/3; priced as its per-micro-batch sharding would run. "
                     "--fsdp is the sharded form that pipelines (torchtitan: gathers once per "
                     "stage per step), --zero 1 Megatron's")
    sharded = train.zero >= 1 or train.fsdp
    sync = GradientSync(inventory.trainable or inventory, grad_dtype, sharded=sharded,
                        algorithm=algorithm if plan.gather else None, plan=plan)
    bwd_sync = apply_all(bwd, [sync], ctx)
    if plan.grads_per_microbatch:
        bwd = bwd_sync
    return fwd_first, fwd, bwd, bwd_sync


def first_forward_delay_s(fwd: OpGraph, fwd_first: OpGraph,
                          costs: Mapping[str, Mapping[int, NodeCost]], rules: OverlapRules,
                          ranges: Sequence[range], stages: Sequence[StageReport], *,
                          regions: dict | None = None) -> tuple[float, tuple[float, ...]]:
    """How much the step starts later because the first micro-batch's forward of each
    stage gathers the parameters (kept gathered for the rest of the step).

    Each stage's gathers run under its first forward, one layer ahead (FSDP's forward
    prefetch); what that forward cannot hide, ``extra_v``, delays the first micro-batch.
    A later stage issues its gathers at the step's start (PyTorch pipelining's ``UNSHARD``
    runs before the stage's first forward action) and has the time the first micro-batch
    takes to reach it, ``wait_v`` (the forwards of the stages before), to hide them. The
    step starts ``max_v (extra_v − wait_v)`` later, and no later stage adds to it: each
    wait grows with the delay already taken.

    :param regions: the forward's scheduled regions (``schedule_phase``'s memo, shared with
        the stage schedules of the same graph and costs).
    :returns: the delay, and each virtual stage's gather time on its DP streams (once per
        step; what the delay does not expose is hidden)."""
    from zrt_core.schedule.scheduler import schedule_phase

    kind_of: dict[int, int] = {}
    for rep, t in fwd.templates.items():
        for i in t.indices:
            kind_of[i] = rep
    cache: dict[tuple[object, ...], tuple[float, float]] = {}
    busy: list[float] = []
    delay = wait = 0.0
    n = len(ranges)
    for v, layers in enumerate(ranges):
        first, last = v == 0, v == n - 1
        key = (tuple(kind_of.get(i, i) for i in layers), first, last)
        hit = cache.get(key)
        if hit is None:
            lay = list(layers)
            plain = schedule_phase(fwd, costs["fwd"], rules, layers=lay, embedding_side=first,
                                   head_side=last, regions=regions)
            gathered = schedule_phase(fwd_first, costs["fwd_first"], rules, layers=lay,
                                      embedding_side=first, head_side=last)
            gathers = sum(t for k, t in gathered.stream_busy_s.items()
                          if k in ("comm.dp", "comm.dp_cp", "comm.edp"))
            hit = cache[key] = (max(0.0, gathered.makespan_s - plain.makespan_s), gathers)
        extra, gathers = hit
        busy.append(gathers)
        delay = max(delay, extra - wait)
        wait += stages[v].forward_s
    return delay, tuple(busy)
