"""The optimizer step: its kernels over the rank's parameter shard and the ZeRO communication."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from zrt_core.fsdp import sharding_plan
from zrt_core.ir.graph import (
    Category,
    OpGraph,
    dtype_bytes,
)
from zrt_core.reports.training import StageReport
from zrt_core.schedule.scheduler import OverlapRules
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.training import (
    STATE_BYTES,
    ParamInventory,
    PrecisionPlan,
    dp_groups,
    grad_dtype,
    optimizer_graph,
)

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec


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
    #: bytes each device of a pipeline rank writes to a checkpoint (see below)
    checkpoint_bytes: tuple[float, ...] = ()


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
    sharding = sharding_plan(parallel, train)
    if train.fsdp:  # HSDP shards within its group only (replicas hold copies)
        dense_dp, expert_dp = sharding.shard.size, sharding.expert_shard.size
    pbytes = dtype_bytes(plan.activation_dtype)
    gbytes = dtype_bytes(grad_dtype(train.precision, train.grad_reduce_in_fp32))
    state = STATE_BYTES.get(train.optimizer, 12)
    link = host_link_gb_per_s or getattr(hw, "host_link_gb_per_s", None)
    per_rank: list[float] = []
    comm: list[float] = []
    weights: list[float] = []
    grads: list[float] = []
    states: list[float] = []
    host_states: list[float] = []
    buffers: list[float] = []
    checkpoint: list[float] = []
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
        if shard_params and not sharding.grads_per_microbatch:
            # FSDP under a pipeline: gradients accumulate unsharded until the last backward
            grad_elements += dense + expert
        grads.append(grad_elements * gbytes)
        param_elements = (all_dense / dense_dp + all_expert / expert_dp) if shard_params \
            else all_dense + all_expert
        if shard_params and sharding.reshard == "none":
            # kept gathered from forward to backward (for the step, under a pipeline)
            param_elements += all_dense + all_expert
        elif shard_params and sharding.reshard == "partial":
            # a 1/N shard kept from forward to backward
            param_elements += (all_dense / sharding.post_forward.size
                               + all_expert / sharding.expert_post_forward.size)
        w = param_elements * pbytes
        if plan.low_precision and train.quantized_params and not shard_params:
            # fp8_param_gather: the decoder layers' weights are TE quantized tensors only
            # (row- and column-wise copies below), the embedding, head and their norms stay
            # 16-bit (Megatron-Core's fp8_model_init covers the transformer layers' modules)
            layer_dense, layer_expert = inventory.stage(layers, templates, first=False,
                                                        last=False, pp=pp)
            w -= (layer_dense + layer_expert) * pbytes
        if plan.low_precision:
            # TransformerEngine keeps low-precision weight copies: row-wise, and column-wise
            # where the recipe and device need one (PrecisionPlan.columnwise_copy)
            w += plan.copies * plan.quantized_bytes(int(all_dense + all_expert),
                                                    plan.gemm_dtype or "")
        weights.append(w)
        # A checkpoint holds each trained weight once (in the activation dtype) and its
        # optimizer states; Megatron's fully parallel save (and FSDP's sharded state dict)
        # splits the replicated copies over the data-parallel ranks, so every device writes
        # 1/dp of its model-parallel shard whatever the ZeRO stage.
        checkpoint.append((dense / dense_dp + expert / expert_dp) * (pbytes + state))
        if shard_params and sharding.reshard != "none":
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
        graphs=tuple(graphs), checkpoint_bytes=tuple(checkpoint))
