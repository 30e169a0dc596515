"""What ZeRO-3 / FSDP / HSDP gather and reduce, over which ranks and how often: the plan the
training transforms and the memory model read (docs/fsdp.md gives each rule its source)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from zrt_core.errors import LayoutError, SpecError

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel, TrainSpec


@frozen
class ShardGroup:
    """One group a sharded collective runs over: its members and the consecutive ranks they
    spread over (:meth:`zrt_core.strategy.Parallel.span`'s meaning)."""

    size: int
    span: int


@frozen
class ShardingPlan:
    """The parameter and gradient sharding of one training step.

    :param gather: parameters are sharded and all-gathered before use (ZeRO-3 / FSDP).
    :param reshard: after a layer's forward its gathered parameters are ``"full"`` freed
        (gathered again for backward: FSDP2 ``reshard_after_forward=True``, ZeRO-3),
        ``"none"`` kept until backward (``False``), or ``"partial"`` kept as a shard over
        ``post_forward`` (an int N: the backward gathers within N ranks).
    :param gather_once: with ``reshard="none"`` under pipeline parallelism, the parameters
        stay gathered for the whole step (PyTorch pipelining turns FSDP's
        ``reshard_after_backward`` off for every backward but the last): one all-gather per
        stage per step, not per micro-batch.
    :param grads_per_microbatch: gradients are reduce-scattered after every micro-batch's
        backward (ZeRO-2/3, FSDP without a pipeline) rather than once after the last one
        (FSDP under pipeline parallelism: ``set_requires_gradient_sync(False)`` but for the
        last backward).
    :param shard: the dense weights' shard group (dp × cp, or the HSDP group × cp).
    :param post_forward: the re-shard group of ``reshard="partial"`` (else ``shard``).
    :param replicas: HSDP replicas (dp / hsdp); 1 without HSDP. Gradient shards are
        all-reduced across them after the reduce-scatter.
    :param expert_shard: the routed experts' shard group (the expert-DP ranks, over the
        same number of replicas).
    :param expert_post_forward: the experts' re-shard group.
    :param framework: whose semantics and defaults (``deepspeed``, ``torchtitan``).
    """

    gather: bool
    reshard: str
    gather_once: bool
    grads_per_microbatch: bool
    shard: ShardGroup
    post_forward: ShardGroup
    replicas: int
    replica_span: int
    expert_shard: ShardGroup
    expert_post_forward: ShardGroup
    framework: str

    def describe(self) -> str:
        """One line for the report's notes."""
        if not self.gather:
            return ""
        what = ("ZeRO-3 (DeepSpeed: parameters re-gathered for backward)"
                if self.framework == "deepspeed" else "FSDP")
        parts = [what]
        if self.framework != "deepspeed":
            parts.append({"full": "reshard_after_forward=True (gathered again for backward)",
                          "none": "reshard_after_forward=False (kept from forward to "
                                  "backward)",
                          "partial": f"reshard_after_forward={self.post_forward.size} "
                                     f"(backward gathers within {self.post_forward.size} "
                                     "ranks)"}[self.reshard])
        if self.replicas > 1:
            parts.append(f"HSDP: sharded within {self.shard.size} ranks, {self.replicas} "
                         "replicas all-reduce the gradient shards")
        parts.append("one parameter all-gather per stage per step" if self.gather_once
                     else "parameters gathered every micro-batch")
        parts.append("gradients reduce-scattered every micro-batch" if
                     self.grads_per_microbatch else
                     "gradients reduce-scattered once, after the last micro-batch")
        return "; ".join(parts)


def _sub(group: ShardGroup, size: int) -> ShardGroup:
    """The first ``size`` members of ``group`` (consecutive in its order): same stride."""
    return ShardGroup(size, max(size, group.span * size // group.size))


def sharding_plan(parallel: Parallel, train: TrainSpec) -> ShardingPlan:
    """The sharding plan of ``train`` on ``parallel``.

    Defaults where ``reshard_after_forward`` is not given: torchtitan's (``not
    pp_enabled``: keep parameters gathered under pipeline parallelism, re-shard without
    it) for ``fsdp``; DeepSpeed's for ``zero=3`` (freed after forward, re-gathered for
    backward, gradients reduced every micro-batch).

    :raises SpecError: ``hsdp`` / ``reshard_after_forward`` without FSDP.
    :raises LayoutError: ``hsdp`` that does not divide dp, a re-shard group larger than
        (or not dividing) the shard group.
    """
    p = parallel
    fsdp = bool(train.fsdp)
    gather = fsdp or train.zero == 3
    if not fsdp and (train.hsdp is not None or train.reshard_after_forward is not None):
        flag = "--hsdp" if train.hsdp is not None else "--reshard-after-forward"
        raise SpecError(f"{flag} is an FSDP setting, but the run does not use FSDP",
                        "add --fsdp")
    replicas = 1
    dp_shard = p.dp
    if train.hsdp is not None:
        if p.dp % train.hsdp:
            raise LayoutError(f"--hsdp {train.hsdp} does not divide dp={p.dp}",
                              "shard over a divisor of dp (e.g. the data-parallel ranks of "
                              "one node or rack)")
        dp_shard = train.hsdp
        replicas = p.dp // train.hsdp
    # dense weights shard over dp × cp (Megatron's dp_cp group; torchtitan's dp_shard_cp
    # mesh): consecutive ranks in Megatron order tp, cp, dp, pp
    shard = ShardGroup(dp_shard * p.cp, p.tp * p.cp * dp_shard)
    replica_span = p.tp * p.cp * p.dp
    expert_dp = p.expert_dp
    expert_shard_size = expert_dp // replicas if expert_dp % replicas == 0 else expert_dp
    expert_shard = ShardGroup(expert_shard_size, p.tp * p.cp * dp_shard
                              if expert_shard_size != expert_dp else replica_span)
    value = train.reshard_after_forward
    if not fsdp:
        framework = "deepspeed"
        value = True
    else:
        framework = "torchtitan"
        if value is None:
            value = p.pp == 1  # torchtitan fsdp_reshard_after_forward="default"
    post_forward, expert_post_forward = shard, expert_shard
    if isinstance(value, bool):
        reshard = "full" if value else "none"
    else:
        if value > shard.size or shard.size % value:
            group = (f"the shard group's {shard.size} ranks (dp{' / hsdp replicas' if replicas > 1 else ''}"
                     f"{' × cp' if p.cp > 1 else ''})")
            raise LayoutError(
                f"--reshard-after-forward {value} is "
                + (f"larger than {group}" if value > shard.size else f"not a divisor of {group}"),
                f"re-shard to a divisor of {shard.size}, e.g. the ranks of one node")
        if value == shard.size:
            reshard = "full"
        elif value == 1:
            reshard = "none"
        else:
            reshard = "partial"
            post_forward = _sub(shard, value)
            expert_post_forward = _sub(expert_shard, max(1, min(value, expert_shard.size)))
    gather_once = gather and fsdp and reshard == "none" and p.pp > 1
    grads_per_microbatch = (train.zero >= 2 and not fsdp) or (fsdp and p.pp == 1)
    return ShardingPlan(
        gather=gather, reshard=reshard if gather else "none", gather_once=gather_once,
        grads_per_microbatch=grads_per_microbatch, shard=shard, post_forward=post_forward,
        replicas=replicas, replica_span=replica_span, expert_shard=expert_shard,
        expert_post_forward=expert_post_forward, framework=framework)
