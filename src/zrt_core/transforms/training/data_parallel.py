"""Data-parallel gradient sync and ZeRO-3 / FSDP parameter gathers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from zrt_core.ir.graph import (
    OpGraph,
    OpNode,
    Phase,
    dtype_bytes,
)
from zrt_core.transforms.training.common import _next_id, collective_node
from zrt_core.transforms.training.params import ParamGroup, ParamInventory

if TYPE_CHECKING:
    from zrt_core.fsdp import ShardingPlan
    from zrt_core.strategy import Parallel
    from zrt_core.transforms.base import TransformContext


# -- data-parallel gradient sync and ZeRO-3 / FSDP gathers ----------------------------------------


def grad_dtype(precision: str, reduce_in_fp32: bool = True) -> str:
    """The gradient buffer's dtype: Megatron accumulates and reduces bf16 (and fp8-recipe)
    gradients in fp32 (``accumulate_allreduce_grads_in_fp32``, Megatron-LM's default for
    bf16) unless the run sets ``grad_reduce_in_fp32=False`` (every Megatron-Bridge
    performance recipe: bf16 gradients, the distributed optimizer casting its shard to fp32
    at the step); fp16 runs keep fp16 gradients (ZeRO's 2 + 2 + 12 bytes); fp32 runs fp32."""
    if precision == "fp16":
        return "float16"
    if precision == "fp32" or reduce_in_fp32:
        return "float32"
    return "bfloat16"


def dp_groups(parallel: Parallel) -> tuple[str, str]:
    """(dense group, expert group) of the gradient reduction: dense weights reduce over
    DP × CP (Megatron's ``dp_cp`` group), routed experts over the expert-DP replicas."""
    return ("dp_cp" if parallel.cp > 1 else "dp"), "edp"


@frozen
class GradientSync:
    """Data-parallel gradient reduction, bucketed per layer and overlapped with backward.

    After the last backward node of each layer (template) the layer's gradients are reduced:
    an all-reduce without a sharded optimizer (ZeRO 0), a reduce-scatter with Megatron's
    distributed optimizer / ZeRO ≥ 1 / FSDP. Dense weights reduce over ``dp`` (``dp_cp``
    with context parallelism), routed experts over ``edp``. ``attrs["overlap"] =
    "backward"``: with ``overlap_grad_reduce`` the bucket runs during the rest of the
    backward and only what is left after the last one is exposed (Megatron's
    ``--overlap-grad-reduce``; DeepSpeed and FSDP alike). Buckets are per layer: Megatron's
    default bucket (40 M parameters, or 1 M × dp) holds about one layer of a large model.

    With an HSDP plan (``plan.replicas > 1``) the reduce-scatter runs within the shard group
    and the gradient shards are then all-reduced across the replicas (FSDP2's HSDP:
    reduce-scatter on the shard mesh dimension, all-reduce on the replicate one).

    :param inventory: parameters per device (:func:`param_inventory`).
    :param grad_dtype: the dtype gradients are reduced in (:func:`grad_dtype`).
    :param plan: the sharding plan (:func:`zrt_core.fsdp.sharding_plan`); None reduces over
        the whole data-parallel group.
    """

    inventory: ParamInventory
    grad_dtype: str
    sharded: bool
    algorithm: str | None = None
    plan: ShardingPlan | None = None
    name: str = "dp_grad_sync"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        dense_group, expert_group = dp_groups(p)
        dense_size = p.span(dense_group)[0]
        expert_size = p.span(expert_group)[0]
        if dense_size == 1 and expert_size == 1:
            return graph
        kind = "reduce_scatter" if self.sharded else "all_reduce"
        nbytes = dtype_bytes(self.grad_dtype)
        last_of: dict[int, int] = {}
        for n in graph.nodes:
            if n.layer_index is not None:
                last_of[n.layer_index] = n.id
        first_layer = next((i for i, n in enumerate(graph.nodes)
                            if n.layer_index is not None), len(graph.nodes))
        last_layer = max((i for i, n in enumerate(graph.nodes) if n.layer_index is not None),
                         default=-1)
        head_anchor = graph.nodes[first_layer - 1].id if first_layer > 0 else None
        embed_anchor = graph.nodes[-1].id if last_layer < len(graph.nodes) - 1 else None
        next_id = _next_id(graph)
        after: dict[int, list[OpNode]] = {}

        plan = self.plan if self.sharded and self.plan is not None \
            and self.plan.replicas > 1 else None
        extra = {"algorithm": self.algorithm} if self.algorithm else None

        def add(anchor: int | None, group: ParamGroup, layer: int | None, kind_name: str | None
                ) -> None:
            nonlocal next_id
            if anchor is None:
                return
            shards = (plan.shard, plan.expert_shard) if plan else (None, None)
            for elements, grp, size, shard in ((group.dense, dense_group, dense_size,
                                                shards[0]),
                                               (group.expert, expert_group, expert_size,
                                                shards[1])):
                if elements <= 0 or size <= 1:
                    continue
                node = collective_node(
                    next_id, kind, grp, p, elements * nbytes, phase=Phase.TRAIN_BACKWARD,
                    layer_index=layer, layer_kind=kind_name, module_path=f"dp.{group.key}",
                    overlap="backward", dtype=self.grad_dtype, extra=extra,
                    size_span=(shard.size, shard.span) if shard else None)
                next_id += 1
                after.setdefault(anchor, []).append(node)
                if plan is not None and shard is not None and size // shard.size > 1:
                    # HSDP: the reduce-scattered shard is all-reduced across the replicas
                    node = collective_node(
                        next_id, "all_reduce", grp, p, elements * nbytes / shard.size,
                        phase=Phase.TRAIN_BACKWARD, layer_index=layer, layer_kind=kind_name,
                        module_path=f"hsdp.{group.key}", overlap="backward",
                        dtype=self.grad_dtype,
                        size_span=(size // shard.size, plan.replica_span))
                    next_id += 1
                    after.setdefault(anchor, []).append(node)

        for rep, group in self.inventory.layers.items():
            template = graph.templates.get(rep)
            add(last_of.get(rep), group, rep, template.kind if template else None)
        add(head_anchor, self.inventory.head, None, None)
        add(embed_anchor, self.inventory.embedding, None, None)
        out: list[OpNode] = []
        edges = list(graph.edges)
        for n in graph.nodes:
            out.append(n)
            for c in after.get(n.id, ()):
                out.append(c)
                edges.append((n.id, c.id))
        return graph.with_nodes(out, edges)


@frozen
class ParamGather:
    """ZeRO-3 / FSDP parameter all-gathers: before each layer's forward and again before its
    backward (and its recompute), each layer's weights are gathered from their ``dp`` shards
    (``attrs["overlap"] = "prefetch"``: issued one layer ahead, as FSDP's
    ``forward_prefetch``/``backward_prefetch`` and DeepSpeed's prefetch bucket do).

    :param algorithm: the collective algorithm to price (None: the tuner's choice);
        ``"pairwise"`` for DeepSpeed ZeRO-3 as of 2021, whose gathers and gradient
        reduce-scatters ran at one scale-out link per GPU (docs/training-model.md).
    :param plan: the sharding plan (:func:`zrt_core.fsdp.sharding_plan`): the gathers run
        over its shard group, or with ``post_forward`` over the re-shard group FSDP2's
        ``reshard_after_forward=N`` leaves for backward; None: the whole DP group.
    """

    inventory: ParamInventory
    param_dtype: str
    algorithm: str | None = None
    plan: ShardingPlan | None = None
    post_forward: bool = False
    name: str = "zero3_param_gather"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        p = ctx.parallel
        dense_group, expert_group = dp_groups(p)
        if p.span(dense_group)[0] == 1 and p.span(expert_group)[0] == 1:
            return graph
        nbytes = dtype_bytes(self.param_dtype)
        first_of: dict[int, int] = {}
        consumers: dict[int, list[int]] = {}
        for n in graph.nodes:
            if n.layer_index is None:
                continue
            first_of.setdefault(n.layer_index, n.id)
            if any(t.param is not None for t in n.inputs):
                consumers.setdefault(n.layer_index, []).append(n.id)
        next_id = _next_id(graph)
        before: dict[int, list[OpNode]] = {}
        edges = list(graph.edges)
        for rep, group in self.inventory.layers.items():
            anchor = first_of.get(rep)
            if anchor is None:
                continue
            template = graph.templates.get(rep)
            plan = self.plan
            groups = (None, None) if plan is None else (
                (plan.post_forward, plan.expert_post_forward) if self.post_forward
                else (plan.shard, plan.expert_shard))
            for elements, grp, sub in ((group.dense, dense_group, groups[0]),
                                       (group.expert, expert_group, groups[1])):
                size = sub.size if sub is not None else p.span(grp)[0]
                if elements <= 0 or size <= 1:
                    continue
                node = collective_node(
                    next_id, "all_gather", grp, p, elements * nbytes, phase=graph.phase,
                    layer_index=rep, layer_kind=template.kind if template else None,
                    module_path=f"zero3.{group.key}", overlap="prefetch",
                    dtype=self.param_dtype,
                    extra={"algorithm": self.algorithm} if self.algorithm else None,
                    size_span=(sub.size, sub.span) if sub is not None else None)
                next_id += 1
                before.setdefault(anchor, []).append(node)
                edges.extend((node.id, c) for c in consumers.get(rep, ()))
        out: list[OpNode] = []
        for n in graph.nodes:
            out.extend(before.get(n.id, ()))
            out.append(n)
        return graph.with_nodes(out, edges)
