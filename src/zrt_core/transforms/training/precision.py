"""Mixed precision: the precision recipe's plan (FP8 / MXFP8 / NVFP4 GEMMs, amax, casts)
and the transform that applies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from attrs import evolve, field, frozen

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
from zrt_core.transforms.quant import is_router
from zrt_core.transforms.training.common import (
    _FLOAT_DTYPES,
    INPUT_GRAD,
    QUANTIZE_ATTR,
    WEIGHT_GRAD,
    _next_id,
)

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.transforms.base import TransformContext


# -- mixed precision ----------------------------------------------------------------------------


@frozen
class PrecisionPlan:
    """What a precision recipe runs on a given device.

    :param requested: the recipe asked for (``bf16``, ``fp8``, ``mxfp8``, ``nvfp4``...).
    :param recipe: the recipe that runs (after falling back where the device lacks units).
    :param activation_dtype: dtype of captured activations and weights (bf16 or fp16).
    :param gemm_dtype: dtype of the forward GEMM operands; None keeps ``activation_dtype``.
    :param grad_dtype: dtype of the output gradients fed to backward GEMMs.
    :param block: elements per scale (32 for MXFP8, 16 for NVFP4; 0 per-tensor scaling).
    :param scale_bytes: bytes of one scale.
    :param amax_pass: the recipe reads each tensor once more to find its amax before casting
        (per-tensor current scaling; NVFP4's per-tensor fp32 second-level scale); delayed
        scaling takes it from history, MXFP8's block scales need none.
    :param hadamard: NVFP4's random Hadamard transform on the weight-gradient GEMM's inputs:
        the column-wise copy of every activation and output gradient is cast from ``H·x``
        (16 × 16 blocks) in a kernel of its own, which reads the tensor once more and does
        a 16-point transform per value (32 FLOPs).
    :param high_precision_layers: decoder-layer indices whose linear layers stay in
        ``activation_dtype`` (Megatron's ``--first-last-layers-bf16`` with
        ``--num-layers-at-start-in-bf16`` / ``--num-layers-at-end-in-bf16``).
    :param note: why the recipe differs from the one asked for, if it does.
    :param columnwise_copy: each cast tensor and weight gets a second, column-wise copy
        for the backward GEMMs. MXFP8 and NVFP4 always write one (their block scales run
        along the other dimension). Per-tensor FP8 writes one (TE's ``cast_transpose``)
        only where FP8 GEMMs take the TN layout alone: on datacenter Blackwell (SM 10.x)
        ``nvte_is_non_tn_fp8_gemm_supported()`` is true, and TE's ``Float8Quantizer`` /
        ``Float8CurrentScalingQuantizer`` create no transpose
        (``create_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()``,
        ``pytorch/csrc/quantizer.cpp``); the backward GEMMs read the row-wise copy.
    """

    requested: str
    recipe: str
    activation_dtype: str
    gemm_dtype: str | None = None
    grad_dtype: str | None = None
    block: int = 0
    scale_bytes: int = 0
    amax_pass: bool = False
    note: str = ""
    hadamard: bool = False
    high_precision_layers: frozenset[int] = field(default=frozenset(), converter=frozenset)
    columnwise_copy: bool = True

    @property
    def low_precision(self) -> bool:
        return self.gemm_dtype is not None

    @property
    def copies(self) -> int:
        """Low-precision copies of each cast tensor and weight: row-wise, and column-wise
        where :attr:`columnwise_copy`."""
        return 1 + int(self.columnwise_copy)

    @property
    def cast_reads(self) -> int:
        """Times a cast reads its bf16 tensor: the cast itself, the amax pass, the
        column-wise Hadamard cast."""
        return 1 + int(self.amax_pass) + int(self.hadamard)

    def reads(self, amax_fused: bool) -> int:
        """:attr:`cast_reads`, less the amax pass where the tensor's producer computed its
        amax as it wrote it (TransformerEngine's norm and activation kernels under
        current scaling: ``create_unquantized_tensor_with_amax`` then
        ``quantize_with_amax``)."""
        return self.cast_reads - int(self.amax_pass and amax_fused)

    def quantized_layer(self, template: LayerTemplate | None, index: int | None) -> bool:
        """Whether the linear layers of a layer template run in the recipe's dtype (a
        template stands for layers that are all kept in high precision or none is, after
        :func:`split_layer_templates`)."""
        if not self.low_precision or index is None:
            return False
        if not self.high_precision_layers:
            return True
        indices = template.indices if template is not None else (index,)
        return not all(i in self.high_precision_layers for i in indices)

    def quantized_bytes(self, elements: int, dtype: str) -> float:
        """Bytes of ``elements`` values in ``dtype`` with their block scales."""
        scales = (elements / self.block) * self.scale_bytes if self.block else 0.0
        return elements * dtype_bytes(dtype) + scales


def precision_plan(precision: str, hardware: HardwareSpec, *,
                   high_precision_layers: Iterable[int] = ()) -> PrecisionPlan:
    """Resolve a training precision on a device (docs/training-model.md, "Precision").

    - ``fp16`` / ``bf16`` / ``fp32``: GEMMs in that dtype (fp32 runs at the TF32 rate).
    - ``fp8``: TransformerEngine's default ``DelayedScaling`` recipe, hybrid format — E4M3
      activations and weights, E5M2 gradients; per-tensor scales from the amax history.
    - ``fp8_cs``: ``Float8CurrentScaling`` (Megatron's ``--fp8-recipe tensorwise``,
      Megatron-Bridge's ``fp8_cs``, the default of its performance recipes): the same
      formats, each tensor's scale from its own amax, computed by a pass over the tensor
      before the cast (``Float8CurrentScalingQuantizer``: ``nvte_compute_amax`` then the
      cast), and no amax history to reduce at the end of the autocast region.
    - ``mxfp8``: ``MXFP8BlockScaling`` — E4M3 everywhere with one E8M0 scale per 32
      values, row- and column-wise copies. A Blackwell tensor-core feature: on a device
      without it (taken as one without fp4 units) it falls back to ``fp8`` with a note.
    - ``nvfp4``: ``NVFP4BlockScaling`` (TransformerEngine; NVIDIA, "Pretraining Large
      Language Models with NVFP4", 2025) — E2M1 with one E4M3 scale per 16 values and a
      per-tensor fp32 scale (an amax pass before each cast), 16 × 16 block scales for
      weights, stochastic rounding of gradients, a random Hadamard transform on the
      weight-gradient GEMM's inputs; needs fp4 units, else falls back to ``mxfp8`` (and on
      to ``fp8``) with a note.
    - a device without fp8 units runs any fp8/fp4 recipe in bf16, with a note.

    ``high_precision_layers``: decoder layers whose linear layers stay bf16 (Megatron's
    ``first_last_layers_bf16``), for the low-precision recipes.
    """
    compute = hardware.compute
    if precision in ("bf16", "fp32"):
        return PrecisionPlan(precision, precision, "bfloat16" if precision == "bf16"
                             else "float32")
    if precision == "fp16":
        return PrecisionPlan(precision, precision, "float16")
    notes = []
    recipe = precision
    if recipe == "nvfp4" and not compute.supports("fp4"):
        notes.append(f"{hardware.id} has no fp4 tensor cores: nvfp4 runs as mxfp8")
        recipe = "mxfp8"
    if recipe == "mxfp8" and not compute.supports("fp4"):
        notes.append(f"{hardware.id} has no MX block-scaled tensor cores (Blackwell): "
                     "mxfp8 runs as fp8 with per-tensor delayed scaling")
        recipe = "fp8"
    if not compute.supports("fp8"):
        notes.append(f"{hardware.id} has no fp8 tensor cores: {precision} runs in bf16")
        return PrecisionPlan(precision, "bf16", "bfloat16", note="; ".join(notes))
    note = "; ".join(notes)
    keep = frozenset(high_precision_layers)
    if recipe in ("fp8", "fp8_cs"):
        # datacenter Blackwell (taken, as for MX above, as a device with fp4 units) runs
        # FP8 GEMMs in every layout: no transposed copy (PrecisionPlan.columnwise_copy)
        return PrecisionPlan(precision, "fp8", "bfloat16", gemm_dtype="float8_e4m3fn",
                             grad_dtype="float8_e5m2", note=note, high_precision_layers=keep,
                             amax_pass=recipe == "fp8_cs",
                             columnwise_copy=not compute.supports("fp4"))
    if recipe == "mxfp8":
        return PrecisionPlan(precision, "mxfp8", "bfloat16", gemm_dtype="mxfp8",
                             grad_dtype="mxfp8", block=32, scale_bytes=1, note=note,
                             high_precision_layers=keep)
    if recipe == "nvfp4":
        return PrecisionPlan(precision, "nvfp4", "bfloat16", gemm_dtype="nvfp4",
                             grad_dtype="nvfp4", block=16, scale_bytes=1, amax_pass=True,
                             hadamard=True, note=note, high_precision_layers=keep)
    raise SpecError(f"unknown training precision {precision!r}",
                    "use fp32, bf16, fp16, fp8, fp8_cs, mxfp8 or nvfp4")


@frozen
class Precision:
    """Low-precision GEMMs as TransformerEngine runs them (fp8, mxfp8, nvfp4).

    The linear layers inside decoder layers (TE ``Linear``/``LayerNormLinear``/
    ``GroupedLinear``: every GEMM that reads a weight, its input- and weight-gradient GEMMs)
    take the recipe's dtype; attention, the embedding and the LM head stay in bf16 (Megatron's
    output layer is not a TE module). Each distinct activation or output-gradient tensor
    feeding such GEMMs gets one cast kernel (``precision.quantize``, category elementwise,
    ``attrs["quantize"] = True``): it reads the bf16 tensor (twice with an amax pass) and
    writes the row-wise low-precision copy with its scales, and the column-wise one where
    the plan keeps it (TE's fused ``cast_transpose``; :attr:`PrecisionPlan.columnwise_copy`).
    Weights are cast once per step (TE caches them
    across micro-batches), in the optimizer graph. Saved GEMM inputs are the low-precision
    copies, so activation memory shrinks accordingly.
    """

    plan: PrecisionPlan
    forward: OpGraph | None = None
    name: str = "precision"

    def apply(self, graph: OpGraph, ctx: TransformContext) -> OpGraph:
        """With ``forward`` (the graph a backward came from), the tensors the forward
        touched are saved activations (cast there), the rest output gradients; without
        it, what no backward node produced counts as saved."""
        plan = self.plan
        if not plan.low_precision:
            return graph
        backward = graph.phase == Phase.TRAIN_BACKWARD
        next_id = _next_id(graph)
        casts: dict[int, OpNode] = {}  # source tensor id -> its cast node
        out: list[OpNode] = []
        edges = list(graph.edges)
        producers = {t.tensor_id: n.id for n in graph.nodes for t in n.outputs
                     if t.tensor_id is not None}
        by_id = {n.id: n for n in graph.nodes}
        forward_ids = None
        if backward and self.forward is not None:
            # every tensor the forward touched (a layer template's input comes from an
            # unrecorded stand-in): gradients never appear there
            forward_ids = {t.tensor_id for n in self.forward.nodes
                           for m in (n, *n.fused_from) for t in (*m.inputs, *m.outputs)
                           if t.tensor_id is not None}
        for n in graph.nodes:
            if not _is_linear_gemm(n, backward) or not plan.quantized_layer(
                    graph.templates.get(n.layer_index), n.layer_index):
                out.append(n)
                continue
            inputs = []
            extra_read = 0.0
            for t in n.inputs:
                if len(t.shape) < 2 or t.dtype not in _FLOAT_DTYPES:
                    inputs.append(t)
                    continue
                if forward_ids is not None:
                    grad_side = backward and t.param is None and t.tensor_id not in forward_ids
                else:
                    grad_side = backward and t.param is None and not _saved(t, producers)
                dtype = plan.grad_dtype if grad_side else plan.gemm_dtype
                assert dtype is not None
                extra_read += plan.quantized_bytes(t.numel, dtype) - t.numel * dtype_bytes(dtype)
                if t.param is None and t.tensor_id is not None and t.tensor_id not in casts \
                        and (backward is False or grad_side):
                    cast = self._cast(next_id, n, t, dtype,
                                      amax_fused=_amax_fused(t, producers, by_id))
                    next_id += 1
                    casts[t.tensor_id] = cast
                    out.append(cast)
                    if t.tensor_id in producers:
                        edges.append((producers[t.tensor_id], cast.id))
                if t.param is None and t.tensor_id in casts:
                    edges.append((casts[t.tensor_id].id, n.id))
                inputs.append(evolve(t, dtype=dtype))
            read = sum(t.nbytes for t in inputs) + int(extra_read)
            out.append(evolve(n, inputs=tuple(inputs), bytes_read=read,
                              attrs={**n.attrs, "precision": plan.recipe}))
        meta = {**graph.meta, "precision": plan.recipe}
        return evolve(graph.with_nodes(out, edges), meta=meta)

    def _cast(self, node_id: int, consumer: OpNode, t: TensorMeta, dtype: str, *,
              amax_fused: bool = False) -> OpNode:
        plan = self.plan
        elements = t.numel
        read = elements * dtype_bytes(t.dtype) * plan.reads(amax_fused)
        # the row-wise copy and (PrecisionPlan.columnwise_copy) the column-wise one, each
        # with its scales
        written = plan.copies * plan.quantized_bytes(elements, dtype)
        flops = 3 * elements  # scale, round, (and amax) per value
        columnwise = {"copies": plan.copies}
        if plan.hadamard:
            flops += 32 * elements  # a 16-point Hadamard transform per value
            columnwise.update(hadamard_read=elements * dtype_bytes(t.dtype),
                              hadamard_flops=32 * elements)
        return OpNode(
            id=node_id, op="precision.quantize", category=Category.ELEMENTWISE,
            phase=consumer.phase, inputs=(t,),
            outputs=(TensorMeta(shape=t.shape, dtype=dtype),),
            module_path=consumer.module_path, module_class=consumer.module_class,
            layer_index=consumer.layer_index, layer_kind=consumer.layer_kind, flops=flops,
            bytes_read=int(read), bytes_written=int(written), formula="precision.quantize",
            attrs={QUANTIZE_ATTR: True, "recipe": plan.recipe, "dtype": dtype,
                   CASTS_ATTR: columnwise})


#: A cast's column-wise share (:func:`rowwise_only`): the copies it writes, and the read and
#: FLOPs of NVFP4's Hadamard transform, which only the column-wise copy takes.
CASTS_ATTR = "cast_copies"


def rowwise_only(node: OpNode) -> OpNode:
    """A cast that writes the row-wise copy alone: what TransformerEngine does for a GEMM
    whose weight is frozen. ``Linear`` sets the input quantizer's column-wise usage to
    ``backward_needs_input = is_grad_enabled and weight.requires_grad`` and, in backward,
    drops the output gradient's column-wise usage when ``not requires_wgrad`` (and no bias):
    the column-wise copies only feed the weight-gradient GEMM
    (``transformer_engine/pytorch/module/linear.py``). NVFP4's Hadamard transform goes
    with them. Other nodes are returned as they are."""
    parts = node.attrs.get(CASTS_ATTR)
    if node.op != "precision.quantize" or not parts or (
            parts.get("copies", 1) == 1 and not parts.get("hadamard_read")):
        return node
    copies = int(parts.get("copies", 1))
    return evolve(node, bytes_written=node.bytes_written // copies,
                  bytes_read=node.bytes_read - int(parts.get("hadamard_read", 0)),
                  flops=node.flops - int(parts.get("hadamard_flops", 0)),
                  attrs={**node.attrs, CASTS_ATTR: {"copies": 1}})


#: What TransformerEngine's activation kernels (and their backward, the fused dact) are named
#: in a graph: their output's amax comes from the kernel that writes it.
_ACTIVATIONS = ("swiglu", "geglu", "silu", "gelu", "relu", "sigmoid", "glu")


def _amax_fused(t: TensorMeta, producers: Mapping[int | None, int],
                by_id: Mapping[int, OpNode]) -> bool:
    """Whether ``t`` (seen through views) is written by a norm or an activation kernel,
    which compute its amax as they write it (current scaling needs no pass of its own)."""
    seen = 0
    node = by_id.get(producers.get(t.tensor_id, -1))
    while node is not None and node.category == Category.VIEW and node.inputs and seen < 16:
        node = by_id.get(producers.get(node.inputs[0].tensor_id, -1))
        seen += 1
    if node is None:
        return False
    if node.category == Category.NORM:
        return True
    return node.category == Category.ELEMENTWISE and any(
        a in node.op.lower() for a in _ACTIVATIONS)


def _saved(t: TensorMeta, producers: Mapping[int | None, int]) -> bool:
    """In a backward graph, a tensor no backward node produced is a saved activation."""
    return t.tensor_id is not None and t.tensor_id not in producers


def _is_linear_gemm(n: OpNode, backward: bool) -> bool:
    """A linear layer's GEMM (TE ``Linear``/``GroupedLinear``): not a convolution (Mamba's
    depthwise conv1d is ``nn.Conv1d`` / ``causal_conv1d`` in bf16), not a MoE router
    (Megatron-Core's ``TopKRouter`` is ``F.linear`` in the model's dtype, or
    ``--moe-router-dtype``)."""
    if (n.category != Category.MATMUL or n.layer_index is None or "convolution" in n.op
            or is_router(n)):
        return False
    if backward:
        return n.attrs.get("grad") in (WEIGHT_GRAD, INPUT_GRAD)
    return any(t.param is not None for t in n.inputs)
