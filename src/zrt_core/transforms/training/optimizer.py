"""The optimizer step as a graph: its elementwise kernels over the rank's shard."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.errors import SpecError
from zrt_core.ir.graph import (
    Category,
    LayerTemplate,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    dtype_bytes,
)
from zrt_core.transforms.training.common import QUANTIZE_ATTR, collective_node
from zrt_core.transforms.training.data_parallel import dp_groups, grad_dtype
from zrt_core.transforms.training.params import ParamGroup, ParamInventory
from zrt_core.transforms.training.precision import PrecisionPlan

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel, TrainSpec


# -- the optimizer step ------------------------------------------------------------------------

#: Bytes per element an optimizer keeps in fp32 beyond the bf16/fp16 weight: master weights
#: and moments (Adam/AdamW: master, m, v; Muon and SGD: master, momentum).
STATE_BYTES = {"adam": 12, "adamw": 12, "muon": 8, "sgd": 8}
#: FLOPs per element of one fused AdamW update (moments, bias corrections, the update, decay).
ADAM_FLOPS_PER_ELEMENT = 18
#: Newton–Schulz iterations of Muon's orthogonalisation (Keller Jordan's reference, Moonlight).
MUON_NS_STEPS = 5


def optimizer_graph(
    inventory: ParamInventory,
    templates: Mapping[int, LayerTemplate],
    stage_layers: Sequence[int],
    parallel: Parallel,
    train: TrainSpec,
    *,
    first: bool,
    last: bool,
    plan: PrecisionPlan,
    host_link_gb_per_s: float | None = None,
) -> OpGraph:
    """The ``optimizer`` phase of one pipeline rank (its stages' parameters).

    Per layer template (nodes carry the template, so they run once per layer of the rank):

    - ``optimizer.grad_norm``: the global-norm pass of gradient clipping over the local
      gradient shard (``multi_tensor_l2norm``: reads each gradient once).
    - ``optimizer.adam`` (``adam``/``adamw``): one fused multi-tensor step over the local
      shard: reads the fp32 master weight, both moments and the gradient, writes the three
      states and the bf16/fp16 weight: ``4+4+4+g`` read, ``4+4+4+2`` written per element.
    - ``optimizer.muon`` + Newton–Schulz GEMMs (``muon``): for every 2-D (and expert 3-D)
      weight, ``MUON_NS_STEPS`` iterations of ``A = X·Xᵀ; B = bA + cA²; X = aX + B·X`` in
      bf16 (``4m²n + 2m³`` FLOPs per iteration, m ≤ n); other parameters take AdamW. With a
      sharded optimizer whole matrices are spread over the data-parallel ranks (Moonlight's
      distributed Muon), so a rank orthogonalises ``⌈layers / dp⌉`` layers' worth.
    - With ZeRO ≥ 1 / FSDP the step covers ``1/dp`` of the elements; the updated weights are
      then all-gathered (``comm.all_gather``, ``attrs["overlap"] = "next_step"``: Megatron's
      ``--overlap-param-gather`` runs it under the next step's forward). ZeRO-3/FSDP
      gathers per layer in the step itself instead, so no gather here.
    - fp8-family recipes cast the weights once per step (``precision.weight_cast``). Frozen
      weights (LoRA, a frozen language model) are cast too — TransformerEngine re-quantizes
      a 16-bit weight on each step's first micro-batch — unless they are stored quantized
      (``train.quantized_params``: built under ``fp8_model_init`` or quantized once before
      training), which leaves nothing to cast.
    - ``offload_optimizer``: the states live in host memory and the step runs on the host
      (DeepSpeed ZeRO-Offload / Megatron's ``--optimizer-cpu-offload``); the device sends
      its gradient shard and receives the updated weights over the host link
      (``offload.d2h``/``offload.h2d``, priced at ``host_link_gb_per_s``).
    """
    rep_of = {i: rep for rep, t in templates.items() for i in t.indices}
    counts: dict[int, int] = {}
    for i in stage_layers:
        rep = rep_of.get(i, i)
        counts[rep] = counts.get(rep, 0) + 1
    dense_group, expert_group = dp_groups(parallel)
    dense_shard = parallel.span(dense_group)[0] if train.zero >= 1 or train.fsdp else 1
    expert_shard = parallel.span(expert_group)[0] if train.zero >= 1 or train.fsdp else 1
    if train.hsdp is not None:  # HSDP: each replica's shard group steps its own copy
        from zrt_core.fsdp import sharding_plan

        sharded = sharding_plan(parallel, train)
        dense_shard, expert_shard = sharded.shard.size, sharded.expert_shard.size
    gdtype = grad_dtype(train.precision, train.grad_reduce_in_fp32)
    gbytes = dtype_bytes(gdtype)
    pbytes = dtype_bytes(plan.activation_dtype)
    frozen_stored_quantized = train.quantized_params and bool(
        train.lora_rank or train.freeze_language_model)
    optimizer = train.optimizer
    nodes: list[OpNode] = []
    new_templates: dict[int, LayerTemplate] = {}

    def node(op: str, category: str, layer: int | None, kind: str | None, *, flops: float = 0,
             read: float = 0, written: float = 0, inputs: tuple[TensorMeta, ...] = (),
             outputs: tuple[TensorMeta, ...] = (), attrs: Mapping[str, Any] | None = None
             ) -> None:
        nodes.append(OpNode(
            id=len(nodes), op=op, category=category, phase=Phase.OPTIMIZER, inputs=inputs,
            outputs=outputs, module_path=f"optimizer.{kind or 'outer'}", layer_index=layer,
            layer_kind=kind, flops=int(flops), bytes_read=int(read), bytes_written=int(written),
            formula=op, attrs=dict(attrs or {})))

    def step(layer: int | None, kind: str | None, group: ParamGroup, count: int,
             frozen: ParamGroup | None = None) -> None:
        cast = frozen or group  # LoRA: TE still casts 16-bit frozen weights every step
        dense = math.ceil(group.dense / dense_shard) if group.dense else 0
        expert = math.ceil(group.expert / expert_shard) if group.expert else 0
        elements = dense + expert
        if elements == 0 and cast.total == 0:
            return
        if train.offload_optimizer:
            if not host_link_gb_per_s:
                raise SpecError("offloading optimizer states needs the host link bandwidth",
                                "pass host_link_gb_per_s (PCIe or C2C GB/s per device)")
            link = host_link_gb_per_s * 1e9
            node("offload.d2h", Category.COPY, layer, kind, read=elements * gbytes,
                 attrs={"host_link_s": elements * gbytes / link})
            node("offload.h2d", Category.COPY, layer, kind, written=elements * pbytes,
                 attrs={"host_link_s": elements * pbytes / link})
            return
        node("optimizer.grad_norm", Category.REDUCTION, layer, kind, flops=2 * elements,
             read=elements * gbytes)
        adam_elements = elements
        if optimizer == "muon" and group.matrices:
            muon_elements = 0
            for shape in group.matrices:
                experts = shape[0] if len(shape) == 3 else 1
                m, n = sorted(shape[-2:])
                muon_elements += experts * m * n
                # whole matrices are spread over the data-parallel ranks: the busiest rank
                # orthogonalises ⌈matrices / shard⌉ of them, batched as one bmm per GEMM
                shard = expert_shard if len(shape) == 3 else dense_shard
                batch = math.ceil(experts * count / shard)
                for _ in range(MUON_NS_STEPS):
                    for rows, cols, inner in ((m, m, n), (m, m, m), (m, n, m)):
                        node("aten.bmm.default", Category.MATMUL, None, kind,
                             flops=2 * batch * rows * cols * inner,
                             read=2 * batch * (rows * inner + inner * cols),
                             written=2 * batch * rows * cols,
                             inputs=(TensorMeta((batch, rows, inner), "bfloat16"),
                                     TensorMeta((batch, inner, cols), "bfloat16")),
                             outputs=(TensorMeta((batch, rows, cols), "bfloat16"),),
                             attrs={"optimizer": "muon_newton_schulz"})
            muon_local = min(elements, math.ceil(muon_elements / max(dense_shard, 1)))
            # momentum update and the scaled weight update: read master, momentum, grad;
            # write master, momentum, weight
            node("optimizer.muon", Category.OPTIMIZER, layer, kind, flops=6 * muon_local,
                 read=muon_local * (4 + 4 + gbytes), written=muon_local * (4 + 4 + pbytes))
            adam_elements = max(0, elements - muon_local)
        if adam_elements:
            op = "optimizer.sgd" if optimizer == "sgd" else "optimizer.adam"
            states = STATE_BYTES.get(optimizer, 12) if optimizer != "muon" else 12
            node(op, Category.OPTIMIZER, layer, kind,
                 flops=ADAM_FLOPS_PER_ELEMENT * adam_elements,
                 read=adam_elements * (states + gbytes),
                 written=adam_elements * (states + pbytes))
        if plan.quantized_layer(templates.get(layer) if layer is not None else None, layer) \
                and not frozen_stored_quantized:  # (the adapters are bf16)
            full = cast.dense + cast.expert  # every weight of the rank is cast, unsharded
            node("precision.weight_cast", Category.ELEMENTWISE, layer, kind, flops=3 * full,
                 read=full * pbytes,
                 written=plan.copies * plan.quantized_bytes(full,
                                                           plan.gemm_dtype or "float8_e4m3fn"),
                 attrs={QUANTIZE_ATTR: True, "recipe": plan.recipe})
        if (train.zero in (1, 2)) and not train.fsdp:
            for full_elements, grp, shard in ((group.dense, dense_group, dense_shard),
                                              (group.expert, expert_group, expert_shard)):
                if full_elements and shard > 1:
                    nodes.append(collective_node(
                        len(nodes), "all_gather", grp, parallel, full_elements * pbytes,
                        phase=Phase.OPTIMIZER, layer_index=layer, layer_kind=kind,
                        module_path=f"optimizer.{kind or 'outer'}", overlap="next_step",
                        dtype=plan.activation_dtype))

    trainable = inventory.trainable or inventory
    for rep, count in counts.items():
        group = inventory.layers.get(rep)
        if group is None:
            continue
        adapters = trainable.layers.get(rep, ParamGroup(group.key, rep, 0, 0))
        template = templates.get(rep)
        kind = template.kind if template else None
        indices = [i for i in (template.indices if template else (rep,)) if i in stage_layers]
        if rep not in indices:
            indices = [rep, *indices[1:]]
        new_templates[rep] = LayerTemplate(kind or "layer", rep, tuple(indices[:count]) or (rep,))
        step(rep, kind, adapters, count, frozen=group)
    if first:
        step(None, None, trainable.embedding, 1)
    if last:
        head = trainable.head
        if parallel.pp > 1 and trainable.tied_head:
            head = evolve(head, dense=head.dense + trainable.tied_head)
        step(None, None, head, 1)
    return OpGraph(phase=Phase.OPTIMIZER, nodes=nodes, templates=new_templates,
                   meta={"optimizer": optimizer, "zero": train.zero, "fsdp": train.fsdp,
                         "offload_optimizer": train.offload_optimizer})
