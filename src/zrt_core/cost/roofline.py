"""The built-in roofline backend: prices every node from its FLOPs, bytes and shapes.

time = max(FLOPs / achievable compute, bytes / achievable HBM bandwidth) + fixed overhead

"Achievable" is the hardware's ``efficiency`` section (global per hardware and op class)
times a shape factor for tensor-core kernels. The derivation, step by step:

GEMM (category ``matmul``: mm, addmm, bmm, linear, _grouped_mm, fused matmuls)
    A GEMM kernel splits the ``m × n`` output of each of ``batch`` products into
    ``tile_m × tile_n`` tiles; ``parallel_units`` tiles run at once (one per SM), so

        tiles     = batch · ⌈m/tile_m⌉ · ⌈n/tile_n⌉
        split     = min(units // tiles, k // k_overhead) when tiles < units, else 1
                    (cuBLAS splits K to fill the machine; each slice keeps ≥ k_overhead)
        waves     = ⌈tiles · split / units⌉
        wave      = tiles · split / (waves · units)       idle SMs in the last wave
        padding   = m·n / (⌈m/tile_m⌉·tile_m · ⌈n/tile_n⌉·tile_n)   partial edge tiles
        k_loop    = k_slice / (k_slice + k_overhead · rate/rate_bf16)
                    per-tile prologue and epilogue: a fixed time, so worth twice the K
                    elements at fp8's twice-bf16 rate
        shape     = wave · padding · k_loop
        compute_s = FLOPs / (peak[dtype] · efficiency.matmul[dtype] · shape · sustained)

    ``sustained`` (``efficiency.matmul_sustained``) is the fraction of the benchmarked rate a
    GEMM keeps inside a whole workload; 1 unless fitted on whole-step records.

    A grouped GEMM marked ``expert_streams`` = S (training's TransformerEngine
    ``GroupedLinear``: one cuBLAS GEMM per expert, issued round-robin over S streams;
    :mod:`zrt_core.transforms.training.experts`) runs as ⌈G/S⌉ rounds of S concurrent
    per-expert GEMMs: each round's wave and split-K factors are those of S GEMMs' tiles,
    not of all G groups' at once; each round pays the GEMM fixed cost once (the concurrent
    launches overlap), and each of the G GEMMs launched eagerly (not replayed from a CUDA
    graph) adds ``efficiency.expert_kernel_us``. The
    casts feeding it (marked with the groups) run one per group the same way: their bytes
    at HBM speed, one launch per round and ``expert_kernel_us`` per kernel.

    With H100 numbers (132 units, 128×128 tiles, k_overhead 128, 0.86, 5.5 µs fixed) this
    reproduces OpenXLA's 192 published H100 bf16 GEMM timings (256..4096 per dimension) to
    9% RMS, and to 2% on GEMMs of 20 GFLOP and more (docs/cost-model.md). The dtype is the
    wider operand: weight-only int4/int8 runs at the activation rate, while the node's
    bytes carry the narrow weights.
Attention (category ``attention``: fused SDPA / FlashAttention nodes)
    FLOPs from the node; bytes are the node's tensors once (Q, K, V, O; plus dO, dQ, dK,
    dV backward): FlashAttention's I/O, the s×s scores never reach HBM. Forward and
    backward have their own efficiency (set at head dim 128); the shape factor is the KV
    loop ``s/(s + kv_overhead)`` over the mean visible keys per query (halved by a causal
    mask, capped by a window), times the wave loss over ``b · h · ⌈s_q / tile_q⌉`` tiles
    (key tiles backward), times the head-dim factor ``(d/(d + d0)) / (128/(128 + d0))``:
    softmax work per tile does not shrink with d. With H100 numbers (0.66 / 0.58, 256,
    d0 = 40) this reproduces FlashAttention-3's 24 published points to 5% RMS. A node
    marked with an older kernel generation (``attention_kernel``: ``flash2``, ``flash1``)
    runs at that generation's published rate from the pack instead (``attention_fa2``...),
    with the same shape factors. Decode
    (``s_q ≤ 16``) is priced without shape loss and is memory-bound on the KV cache.
    Softmax's exponentials run on the special-function units, not the tensor cores: one
    per visible pair and query head (``b · h · pairs``, forward and backward, which
    recomputes P), at ``compute.exp_tera_per_s``; the kernel takes
    ``max(tensor FLOPs time, exps / exp rate, bytes time)``. The FLOPs-per-exp ratio is
    4d forward (10d backward), so the bound bites at small head dims, at fp8's doubled
    tensor rate, and on Blackwell (5 T exp/s under 2.5 PFLOP/s) far more than on
    Blackwell Ultra (10.7) or Hopper (3.9 under 0.99); it never binds on the FA3 points.
Everything else (norms, elementwise, softmax, reductions, optimizer, embedding, copies)
    compute at ``vector`` × the fp32 CUDA-core peak, bytes at ``memory`` × HBM bandwidth.
Views and metadata ops (``zero_cost``) are free; collectives go to
:func:`zrt_core.cost.collectives.collective_cost`.

Every :class:`NodeCost` names its rule and carries the numbers it used in ``detail``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from zrt_core.cost.backend import NodeCost, PriceSource
from zrt_core.cost.collectives import collective_cost
from zrt_core.cost.errors import CostError
from zrt_core.cost.opdims import (
    ATTENTION_KERNEL_ATTR,
    EXPERT_EAGER_ATTR,
    EXPERT_GROUPS_ATTR,
    EXPERT_STREAMS_ATTR,
    FULL_ROW_ALIGNMENT,
    AttentionDims,
    GemmDims,
    attention_dims,
    gemm_compute_dtype,
    gemm_dims,
    gemm_row_alignment,
    is_backward,
    op_base,
)
from zrt_core.hardware import _DTYPE_TO_COMPUTE
from zrt_core.ir.graph import Category, OpNode, dtype_bytes

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.plugins import PluginHost

NAME = "roofline"
PRIORITY = -1000
#: Queries per call at or below which attention is decode: no tile to fill, KV-cache bound.
DECODE_MAX_QUERIES = 16
#: Fallback chains when a device lacks a precision's units (as ``ComputeSpec.peak_tflops``).
_CHAINS = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "int8": ("int8", "fp16"),
           "tf32": ("tf32", "fp32")}


class RooflineBackend:
    """Prices any node on one hardware spec; built once per spec, pure arithmetic per node."""

    name = NAME

    def __init__(self, hardware: HardwareSpec) -> None:
        self.hardware = hardware
        eff = hardware.efficiency
        self.eff = eff
        self.hbm_bytes_per_s = hardware.memory.bandwidth_gb_per_s * 1e9 * eff.memory
        #: a GEMM's operand traffic (efficiency.matmul_memory; else as any kernel's)
        self.gemm_bytes_per_s = (hardware.memory.bandwidth_gb_per_s * 1e9 * eff.matmul_memory
                                 if eff.matmul_memory else self.hbm_bytes_per_s)
        #: a decode attention's KV cache (efficiency.attention_decode_memory; else as above)
        self.decode_kv_bytes_per_s = (
            hardware.memory.bandwidth_gb_per_s * 1e9 * eff.attention_decode_memory
            if eff.attention_decode_memory else self.hbm_bytes_per_s)
        self.vector_flops_per_s = hardware.compute.fp32_tflops * 1e12 * eff.vector
        self.launch_s = eff.launch_overhead_us * 1e-6
        self.gemm_fixed_s = self.launch_s + eff.matmul_overhead_us * 1e-6
        self.expert_kernel_s = eff.expert_kernel_us * 1e-6
        fp8 = eff.matmul_fp8 if eff.matmul_fp8 is not None else eff.matmul
        self._matmul_eff = {
            "fp32": eff.matmul, "tf32": eff.matmul, "bf16": eff.matmul, "fp16": eff.matmul,
            "fp8": fp8,
            "fp4": eff.matmul_fp4 if eff.matmul_fp4 is not None else fp8,
            "int8": eff.matmul_int8 if eff.matmul_int8 is not None else fp8,
        }
        self._attention_eff = eff.attention_rates("flash")
        self._rates: dict[str, tuple[str, float]] = {}
        self._bf16_flops_per_s = hardware.compute.bf16_tflops * 1e12
        exp_tera = hardware.compute.exp_tera_per_s
        self.exp_per_s = exp_tera * 1e12 if exp_tera else 0.0

    @classmethod
    def for_hardware(cls, hardware: HardwareSpec, host: PluginHost | None = None
                     ) -> RooflineBackend:
        """The ``CostBackendSpec`` factory: the roofline serves every hardware."""
        return cls(hardware)

    # -- dispatch --------------------------------------------------------------------

    def price(self, node: OpNode) -> NodeCost:
        if node.zero_cost or node.category == Category.VIEW:
            return NodeCost(time_s=0.0, backend=NAME, rule="zero_cost", source=PriceSource.FREE,
                            bound="free")
        category = node.category
        if category == Category.COLLECTIVE:
            return self.collective(node)
        if category == Category.MATMUL:
            return self.gemm(node)
        if category == Category.ATTENTION:
            return self.attention(node)
        return self.memory_bound(node)

    # -- rates -------------------------------------------------------------------------

    def rate(self, dtype: str) -> tuple[str, float]:
        """(compute key actually used, peak FLOP/s) for a dtype, walking the fallbacks."""
        hit = self._rates.get(dtype)
        if hit is not None:
            return hit
        wanted = _DTYPE_TO_COMPUTE.get(dtype, "fp32")
        compute = self.hardware.compute
        for key in _CHAINS.get(wanted, (wanted,)):
            value = compute.get(key)
            if value:
                hit = (key, value * 1e12)
                break
        else:
            hit = ("fp32", compute.fp32_tflops * 1e12)
        self._rates[dtype] = hit
        return hit

    # -- rules -------------------------------------------------------------------------

    def gemm(self, node: OpNode) -> NodeCost:
        dims = gemm_dims(node)
        dtype = gemm_compute_dtype(node)
        key, peak = self.rate(dtype)
        efficiency = self._matmul_eff[key]
        flops = node.flops or (dims.flops if dims is not None else 0)
        nbytes, bytes_from = _node_bytes(node)
        detail: dict[str, Any] = {"dtype": dtype, "compute": key, "peak_tflops": peak / 1e12,
                                  "efficiency": efficiency, "flops": flops, "bytes": nbytes,
                                  "hbm_efficiency": self.eff.matmul_memory or self.eff.memory}
        if bytes_from != "node":
            detail["bytes_from"] = bytes_from
        streams = node.attrs.get(EXPERT_STREAMS_ATTR)
        sustained = self.eff.gemm_sustained(key)
        if dims is not None and dims.grouped and streams:
            return self._expert_loop(node, dims, int(streams), flops, peak, efficiency,
                                     nbytes, detail, sustained,
                                     eager=bool(node.attrs.get(EXPERT_EAGER_ATTR, True)))
        if dims is not None:
            shape, parts = self.gemm_shape_efficiency(dims, peak / self._bf16_flops_per_s)
            detail.update(parts)
            rule = "grouped_gemm" if dims.grouped else "gemm"
            aligned, align = self.row_alignment_efficiency(node, dims)
            if aligned != 1.0:
                detail.update(row_alignment_bytes=align, row_alignment_efficiency=aligned)
                shape *= aligned
        else:
            shape, rule = 1.0, "gemm_unshaped"
        if sustained != 1.0:
            detail["sustained"] = sustained
        compute_s = flops / (peak * efficiency * shape * sustained) if flops else 0.0
        nbytes += self.weight_row_extra_bytes(node, dims, detail)
        return self._finish(rule, compute_s, nbytes / self.gemm_bytes_per_s, self.gemm_fixed_s,
                            detail)

    def weight_row_extra_bytes(self, node: OpNode, dims: GemmDims | None,
                               detail: dict[str, Any]) -> float:
        """The weight streaming's per-row work (``efficiency.matmul_memory_k_overhead``
        k0) as bytes: ``n · k0`` more weight elements for each of the GEMM's ``batch``
        products (groups), at the weight's element size (the right operand's; the compute
        dtype's without one). 0 without k0 or dims (docs/cost-model.md, "Weight
        streaming")."""
        k0 = self.eff.matmul_memory_k_overhead
        if not k0 or dims is None:
            return 0.0
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        elem = dtype_bytes(weight.dtype if weight is not None else gemm_compute_dtype(node))
        extra = dims.batch * dims.n * k0 * elem
        detail["weight_row_extra_bytes"] = extra
        return extra

    def _expert_loop(self, node: OpNode, dims: GemmDims, streams: int, flops: float,
                     peak: float, efficiency: float, nbytes: float, detail: dict[str, Any],
                     sustained: float, *, eager: bool = True) -> NodeCost:
        """A grouped GEMM run as one GEMM per group over ``streams`` streams (module
        docstring): ⌈G/S⌉ rounds, each priced with the shape factor of its own GEMMs."""
        groups = dims.batch
        s = max(1, min(streams, groups))
        full, rest = divmod(groups, s)
        per_gemm = flops / groups if groups else 0.0
        ratio = peak / self._bf16_flops_per_s
        compute_s = 0.0
        parts: dict[str, Any] = {}
        for count, rounds in ((s, full), (rest, 1 if rest else 0)):
            if not rounds:
                continue
            shape, p = self.gemm_shape_efficiency(
                GemmDims(batch=count, m=dims.m, n=dims.n, k=dims.k, grouped=True), ratio)
            parts = parts or p
            compute_s += rounds * count * per_gemm / (peak * efficiency * shape * sustained)
        rounds = math.ceil(groups / s)
        detail.update(parts)
        per_kernel_s = self.expert_kernel_s if eager else 0.0
        detail.update(batch=groups, expert_gemms=groups, streams=s, rounds=rounds,
                      expert_kernel_us=per_kernel_s * 1e6)
        if sustained != 1.0:
            detail["sustained"] = sustained
        fixed_s = rounds * self.gemm_fixed_s + groups * per_kernel_s
        return self._finish("expert_gemm_loop", compute_s,
                            (nbytes + self.weight_row_extra_bytes(node, dims, detail))
                            / self.gemm_bytes_per_s, fixed_s, detail)

    def row_overhead(self, dims: GemmDims) -> int:
        """Rows' worth of work each GEMM (each group's, in a grouped one) pays beyond its
        own rows: the pack's ``matmul_group_rows_overhead`` for a grouped GEMM where it is
        set (measured against the dense GEMM of the same FLOPs), else its
        ``matmul_row_overhead`` (docs/cost-model.md, "Row overhead", "Grouped GEMMs")."""
        eff = self.eff
        if dims.grouped and eff.matmul_group_rows_overhead:
            return eff.matmul_group_rows_overhead
        return eff.matmul_row_overhead

    def row_alignment_efficiency(self, node: OpNode, dims: GemmDims) -> tuple[float, int]:
        """The GEMM's rate over an aligned one's, by the bytes its rows are aligned to
        (:func:`~zrt_core.cost.opdims.gemm_row_alignment`), and those bytes: 1 at 16,
        ``matmul_unaligned_8b`` at 4 or 8, ``matmul_unaligned_2b`` below (a pack without
        the fractions reads no alignment: 1 and 16)."""
        eff = self.eff
        if eff.matmul_unaligned_8b == 1.0 and eff.matmul_unaligned_2b == 1.0:
            return 1.0, FULL_ROW_ALIGNMENT
        align = gemm_row_alignment(node, dims)
        if align >= FULL_ROW_ALIGNMENT:
            return 1.0, align
        return (eff.matmul_unaligned_8b if align >= 4 else eff.matmul_unaligned_2b), align

    def gemm_shape_efficiency(self, dims: GemmDims, rate_vs_bf16: float = 1.0
                              ) -> tuple[float, dict[str, Any]]:
        """The wave × padding × K-loop factor of the derivation in the module docstring.

        :param rate_vs_bf16: the dtype's peak over bf16's: a tile's fixed cost is time, so
            at twice the rate (fp8) it is worth twice the K elements.
        """
        eff = self.eff
        tm, tn, units = eff.matmul_tile_m, eff.matmul_tile_n, eff.parallel_units
        k0 = eff.matmul_k_overhead * rate_vs_bf16
        rows, cols = math.ceil(dims.m / tm), math.ceil(dims.n / tn)
        tiles = dims.batch * rows * cols
        split = 1
        if units and tiles < units:
            split = max(1, min(units // tiles, int(dims.k // k0)))
        if units:
            waves = math.ceil(tiles * split / units)
            wave = tiles * split / (waves * units)
        else:
            waves, wave = 1, 1.0
        padding = dims.m * dims.n / (rows * tm * cols * tn)
        k_slice = dims.k / split
        k_loop = k_slice / (k_slice + k0)
        shape = wave * padding * k_loop
        parts = {"m": dims.m, "n": dims.n, "k": dims.k, "batch": dims.batch,
                 "tiles": tiles, "split_k": split, "waves": waves,
                 "wave_efficiency": wave, "padding_efficiency": padding,
                 "k_overhead": k0, "k_loop_efficiency": k_loop}
        m0 = self.row_overhead(dims)
        if m0:
            parts.update(row_overhead=m0, row_efficiency=dims.m / (dims.m + m0))
            shape *= parts["row_efficiency"]
        parts["shape_efficiency"] = shape
        return shape, parts

    def attention(self, node: OpNode) -> NodeCost:
        dims = attention_dims(node)
        backward = is_backward(node)
        dtype = _first_dtype(node)
        key, peak = self.rate(dtype)
        kernel = node.attrs.get(ATTENTION_KERNEL_ATTR)
        if kernel:
            rates = self.eff.attention_rates(str(kernel))
            if rates is None:
                raise CostError(f"{self.hardware.id} has no published rate for attention "
                                f"kernel {kernel}", "price it with the device's own kernel "
                                "(--attention flash) or give the rate in the pack")
            efficiency = rates[1 if backward else 0]
        else:
            efficiency = self._attention_eff[1 if backward else 0]
        flops = node.flops
        if not flops and dims is not None:
            flops = dims.backward_flops if backward else dims.forward_flops
        nbytes, bytes_from = _node_bytes(node)
        detail: dict[str, Any] = {"dtype": dtype, "compute": key, "peak_tflops": peak / 1e12,
                                  "efficiency": efficiency, "flops": flops, "bytes": nbytes,
                                  "hbm_efficiency": self.eff.memory, "backward": backward}
        if kernel:
            detail["kernel"] = kernel
        if bytes_from != "node":
            detail["bytes_from"] = bytes_from
        shape = 1.0
        if dims is None:
            rule = "attention_unshaped"
        elif dims.s_q <= DECODE_MAX_QUERIES:
            rule = "decode_attention"
            detail.update(b=dims.b, h=dims.h, h_kv=dims.h_kv, s_q=dims.s_q, s_kv=dims.s_kv,
                          d=dims.d)
        else:
            rule = "flash_attention_bwd" if backward else "flash_attention_fwd"
            shape, parts = self.attention_shape_efficiency(dims, backward)
            detail.update(parts)
        compute_s = flops / (peak * min(1.0, efficiency * shape)) if flops else 0.0
        if dims is not None and self.exp_per_s:
            # softmax's exponentials: one per visible (query, key) pair and query head,
            # forward and backward alike (the backward recomputes P = exp(S - LSE)), at the
            # special-function units' peak; a third roofline beside the tensor FLOPs and bytes
            exps = dims.b * dims.h * dims.pairs
            exp_s = exps / self.exp_per_s
            detail.update(exps=exps, exp_tera_per_s=self.exp_per_s / 1e12,
                          tensor_s=compute_s, exp_s=exp_s, exp_bound=exp_s > compute_s)
            compute_s = max(compute_s, exp_s)
        stream = self.hbm_bytes_per_s
        if rule == "decode_attention" and self.eff.attention_decode_memory:
            stream = self.decode_kv_bytes_per_s
            detail["hbm_efficiency"] = self.eff.attention_decode_memory
        return self._finish(rule, compute_s, nbytes / stream, self.launch_s, detail)

    def attention_shape_efficiency(self, dims: AttentionDims, backward: bool
                                   ) -> tuple[float, dict[str, Any]]:
        """KV-loop × wave factor of a FlashAttention kernel (module docstring)."""
        eff = self.eff
        visible = dims.visible_keys
        kv_loop = visible / (visible + eff.attention_kv_overhead)
        # Forward parallelises over query tiles, backward over key tiles.
        seq = dims.s_kv if backward else dims.s_q
        tiles = dims.b * dims.h * math.ceil(seq / eff.attention_tile_q)
        units = eff.parallel_units
        if units:
            waves = math.ceil(tiles / units)
            wave = tiles / (waves * units)
        else:
            waves, wave = 1, 1.0
        # Softmax work per tile does not shrink with the head dim, the matmuls do: relative
        # to head dim 128 (where ``attention`` is set), d/(d + d0) over 128/(128 + d0).
        d0 = eff.attention_d_overhead
        head = (dims.d / (dims.d + d0)) / (128 / (128 + d0)) if d0 else 1.0
        shape = kv_loop * wave * head
        return shape, {"b": dims.b, "h": dims.h, "h_kv": dims.h_kv, "s_q": dims.s_q,
                       "s_kv": dims.s_kv, "d": dims.d, "causal": dims.causal,
                       "visible_keys": visible, "kv_loop_efficiency": kv_loop,
                       "tiles": tiles, "waves": waves, "wave_efficiency": wave,
                       "head_dim_factor": head, "shape_efficiency": shape}

    def memory_bound(self, node: OpNode) -> NodeCost:
        nbytes, bytes_from = _node_bytes(node)
        detail: dict[str, Any] = {"category": node.category, "flops": node.flops,
                                  "bytes": nbytes, "hbm_efficiency": self.eff.memory,
                                  "vector_efficiency": self.eff.vector}
        if bytes_from != "node":
            detail["bytes_from"] = bytes_from
        compute_s = node.flops / self.vector_flops_per_s if node.flops else 0.0
        streams, groups = node.attrs.get(EXPERT_STREAMS_ATTR), node.attrs.get(
            EXPERT_GROUPS_ATTR)
        if streams and groups:
            # one kernel per group over ``streams`` streams (TE's per-expert casts): a
            # launch per round of concurrent kernels, ``expert_kernel_us`` per kernel
            rounds = math.ceil(groups / max(1, min(int(streams), groups)))
            per_kernel_s = self.expert_kernel_s if node.attrs.get(EXPERT_EAGER_ATTR, True) \
                else 0.0
            detail.update(expert_kernels=groups, streams=streams, rounds=rounds,
                          expert_kernel_us=per_kernel_s * 1e6)
            return self._finish("expert_loop_memory_bound", compute_s,
                                nbytes / self.hbm_bytes_per_s,
                                rounds * self.launch_s + groups * per_kernel_s, detail)
        return self._finish("memory_bound", compute_s, nbytes / self.hbm_bytes_per_s,
                            self.launch_s, detail)

    def collective(self, node: OpNode) -> NodeCost:
        attrs = node.attrs
        kind = attrs.get("collective") or op_base(node.op)
        missing = [k for k in ("group_size", "span", "bytes") if attrs.get(k) is None]
        if missing:
            raise CostError(
                f"collective node {node.id} ({node.op}) lacks attrs {', '.join(missing)}",
                "the parallel transforms set group_size, span and bytes on collective nodes "
                "(docs/architecture.md)")
        routing = attrs.get("routing")
        return collective_cost(kind, attrs["bytes"], int(attrs["group_size"]),
                               int(attrs["span"]), self.hardware, attrs.get("algorithm"),
                               routing=tuple(routing) if routing is not None else None)

    # -- helpers -------------------------------------------------------------------------

    @staticmethod
    def _finish(rule: str, compute_s: float, memory_s: float, overhead_s: float,
                detail: dict[str, Any]) -> NodeCost:
        if compute_s == 0.0 and memory_s == 0.0:
            bound = "latency"
        else:
            bound = "compute" if compute_s >= memory_s else "memory"
        return NodeCost(time_s=max(compute_s, memory_s) + overhead_s, backend=NAME, rule=rule,
                        source=PriceSource.ROOFLINE, compute_s=compute_s, memory_s=memory_s,
                        overhead_s=overhead_s, bound=bound, detail=detail)


def _node_bytes(node: OpNode) -> tuple[int, str]:
    """The node's bytes; a node without a formula falls back to its tensors read once."""
    if node.bytes or node.formula is not None:
        return node.bytes, "node"
    read = sum(t.nbytes for t in node.inputs)
    written = sum(t.nbytes for t in node.outputs if not t.is_view)
    return read + written, "tensors"


def _first_dtype(node: OpNode) -> str:
    for t in node.inputs:
        if len(t.shape) == 4:
            return t.dtype
    if node.inputs:
        return node.inputs[0].dtype
    return node.outputs[0].dtype if node.outputs else "bfloat16"
