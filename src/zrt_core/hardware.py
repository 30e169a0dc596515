"""Hardware specs: the datasheet numbers every prediction rests on.

A :class:`HardwareSpec` is a frozen value loaded from YAML by :meth:`HardwareSpec.from_yaml`.
Units live in field names: ``_tflops`` is 10^12 dense (no 2:4 sparsity) operations per
second, ``_gb_per_s`` is 10^9 **bytes** per second (a datasheet's "400 Gb/s NIC" is 50),
``_gb`` is 10^9 bytes, ``_mb`` 10^6 bytes, ``_us`` microseconds, ``_w`` watts.
Interconnect bandwidth is per device and per direction (H100 NVLink4: "900 GB/s" total
bidirectional → 450).

A *device* is what one rank runs on: a GPU, or one die of a multi-die NPU that the vendor's
runtime exposes as its own device (Ascend 910C: two per package).

The YAML format (every key below, nothing else; a repeated key is an error too)::

    id: nvidia_h100_sxm              # lower-case letters, digits, _
    name: NVIDIA H100 SXM5 80GB
    vendor: nvidia
    aliases: [h100]                  # lower-case; resolve to the id
    source: "datasheet ..."
    compute:            # dense peak, TFLOP/s (int8: TOP/s); omit or null = not supported
      fp32: 66.9        # fp32, bf16 and fp16 are required
      tf32: 494.7
      bf16: 989.4
      fp16: 989.4
      fp8: 1978.9
      fp4: null
      int8: 1978.9
      power_limited_clock: 1.0   # optional: a training step's clock over the datasheet's,
                                 # relative to the die's reference SKU (power_limited_clock())
    memory:
      capacity_gb: 80                # the vendor's headline figure
      bandwidth_gb_per_s: 3350
      caches: [{name: l2, capacity_mb: 50, bandwidth_gb_per_s: 12000}]   # bandwidth optional
    interconnect:       # innermost first; devices grow (each >= 2); the outermost has null
      - {name: nvlink, bandwidth_gb_per_s: 450, latency_us: 3, devices: 8, efficiency: 0.8}
      - {name: infiniband, bandwidth_gb_per_s: 50, latency_us: 6, devices: null}
    # optional per tier, what its switches reduce in the network (docs/collectives.md):
    #   nvls_efficiency: 0.61   NVLink SHARP (NCCL's NVLS) on an NVSwitch tier: the fraction
    #                           of bandwidth_gb_per_s its all-reduce moves S bytes at
    #   sharp: true             SHARP on an InfiniBand tier, enabled for NCCL (CollNet)
    # optional per tier: all_to_all_efficiency, the fraction of bandwidth_gb_per_s NCCL's
    # all-to-all crossing the tier moves at (default: efficiency; docs/collectives.md)
    power_w: 700                     # board power (TDP)
    price_per_device_hour_usd: null  # a public on-demand price, or omit
    checkpoint_write_gb_per_s: 6.25  # what one device writes to storage (optional)
    efficiency: {matmul: 0.8, memory: 0.85, launch_overhead_us: 4}   # see Efficiency

Every error names the file and the field (``h100.yaml: memory.bandwidth_gb_per_s must be
> 0``), so a vendor fixing a pack never has to guess.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import evolve, field, frozen

from zrt_core._data import Fields, load_yaml
from zrt_core.errors import SpecError

#: dtype names (as in OpGraph tensors) mapped onto the compute field that prices them.
_DTYPE_TO_COMPUTE = {
    "float32": "tf32",
    "tf32": "tf32",
    "fp32": "fp32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "mxfp8": "fp8",
    "float4_e2m1fn_x2": "fp4",
    "fp4": "fp4",
    "nvfp4": "fp4",
    "mxfp4": "fp4",
    "int8": "int8",
    "int4": "int8",
}

COMPUTE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")


@frozen
class ComputeSpec:
    """Dense peak throughput per dtype, TFLOP/s (int8 in TOP/s). None: not supported."""

    fp32_tflops: float
    bf16_tflops: float
    fp16_tflops: float
    tf32_tflops: float | None = None
    fp8_tflops: float | None = None
    fp4_tflops: float | None = None
    int8_tops: float | None = None
    #: 10^12 exponentials per second of the special-function units (MUFU.EX2): the rate
    #: softmax's exp runs at inside attention, its third roofline beside tensor FLOPs and
    #: bytes (docs/cost-model.md "Attention's exponentials"). None: not bounded.
    exp_tera_per_s: float | None = None
    #: The SM clock a power-limited, GEMM-dense step (training) sustains, over the one the
    #: datasheet peaks assume, relative to the SKU the die's efficiency fractions were
    #: measured on (1 there): :func:`power_limited_clock` gives it from board power and SMs
    #: (docs/cost-model.md, "The power-limited clock"). Serving keeps the datasheet peaks.
    power_limited_clock: float = 1.0

    def power_limited(self) -> ComputeSpec:
        """Every rate (tensor, vector and exponentials) at :attr:`power_limited_clock`;
        the spec itself where that is 1."""
        from attrs import fields

        k = self.power_limited_clock
        if k == 1.0:
            return self
        rates = {f.name: getattr(self, f.name) for f in fields(ComputeSpec)
                 if f.name != "power_limited_clock"}
        return evolve(self, power_limited_clock=1.0,
                      **{name: None if v is None else v * k for name, v in rates.items()})

    def peak_tflops(self, dtype: str) -> float:
        """Peak for a dtype name; an unsupported low precision falls back to the next wider.

        fp4 without fp4 units runs at fp8 rate (or bf16); fp8 without fp8 units at bf16; int8
        without int8 units at fp16. That is how frameworks run such weights (upcast).
        """
        key = _DTYPE_TO_COMPUTE.get(dtype)
        if key is None:
            raise SpecError(f"no compute rate for dtype {dtype!r}",
                            f"use one of {', '.join(sorted(_DTYPE_TO_COMPUTE))}")
        chain = {
            "fp4": ("fp4", "fp8", "bf16"),
            "fp8": ("fp8", "bf16"),
            "int8": ("int8", "fp16"),
            "tf32": ("tf32", "fp32"),
        }.get(key, (key,))
        for k in chain:
            value = self.get(k)
            if value:
                return value
        raise SpecError(f"hardware has no {key} compute rate")

    def get(self, key: str) -> float | None:
        return getattr(self, "int8_tops" if key == "int8" else f"{key}_tflops")

    def supports(self, key: str) -> bool:
        return bool(self.get(key))


@frozen
class CacheTier:
    """One on-chip cache level (L2, ...): capacity and, where published, bandwidth."""

    name: str
    capacity_mb: float
    bandwidth_gb_per_s: float | None = None


@frozen
class MemorySpec:
    """Device memory (HBM): the vendor's capacity figure and peak bandwidth, plus caches."""

    capacity_gb: float
    bandwidth_gb_per_s: float
    caches: tuple[CacheTier, ...] = ()

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_gb * 1e9


@frozen
class InterconnectTier:
    """One level of the network.

    :param devices: how many devices one domain of this tier holds (8 for an NVLink node,
        72 for an NVL72 rack); None for the outermost tier, which is unbounded.
    :param bandwidth_gb_per_s: unidirectional bandwidth per device, GB/s.
    :param latency_us: one message's start-up latency (the α of an α-β model).
    :param efficiency: achievable fraction of ``bandwidth_gb_per_s`` for large collectives
        (NCCL bus bandwidth over link bandwidth).
    :param nvls_efficiency: the tier's switches reduce (NVLink SHARP, NCCL's NVLS): the
        fraction of ``bandwidth_gb_per_s`` at which an NVLS all-reduce moves its ``S`` bytes
        per device and direction (nccl-tests' algorithm bandwidth over the link rate); None:
        no in-switch reduction.
    :param sharp: the tier's switches reduce for NCCL's CollNet (SHARP on InfiniBand, with
        the SHARP plugin and ``NCCL_COLLNET_ENABLE=1``).
    :param all_to_all_efficiency: the fraction of ``bandwidth_gb_per_s`` NCCL's
        all-to-all (every rank's send/recv with every member: Megatron-Core's ``alltoall``
        token dispatcher, Ulysses) moves its traffic across this tier at inside a training
        step (docs/collectives.md); None: ``efficiency``, the ring collectives' rate. The
        deduplicating MoE dispatchers (DeepEP, HybridEP) keep ``efficiency``.
    """

    name: str
    bandwidth_gb_per_s: float
    latency_us: float
    devices: int | None
    efficiency: float = 0.8
    nvls_efficiency: float | None = None
    sharp: bool = False
    all_to_all_efficiency: float | None = None


#: Attention kernel generations older than a device's own (``zrt run --train --attention``):
#: the :class:`Efficiency` fields of each one's forward and backward rate.
ATTENTION_GENERATIONS = {"flash2": ("attention_fa2", "attention_fa2_backward"),
                         "flash1": ("attention_fa1", "attention_fa1_backward")}


@frozen
class Efficiency:
    """Achievable fractions of peak, global per hardware and op class (never per model).

    :param matmul: large bf16/fp16 GEMMs, fraction of dense peak.
    :param matmul_fp8: large fp8 GEMMs (None: same as ``matmul``).
    :param matmul_fp4: large fp4 GEMMs (None: same as ``matmul_fp8``).
    :param attention: FlashAttention-style forward, fraction of dense peak.
    :param attention_backward: its backward (None: same as ``attention``).
    :param attention_fa2: the forward of FlashAttention-2's kernels (flash-attn 2.x, and
        PyTorch SDPA's flash backend) on this device, where a publication gives it
        (``--attention flash2``; ``attention`` is the device's own best fused kernel:
        cuDNN / FlashAttention-3 on Hopper); None: not published, refused.
    :param attention_fa2_backward: its backward (None: not published).
    :param attention_fa1: the forward of FlashAttention 1.x's kernels (flash-attn 1.0.x,
        ``--attention flash1``); None: not published, refused.
    :param attention_fa1_backward: its backward (None: not published).
    :param memory: memory-bound kernels, fraction of HBM bandwidth.
    :param launch_overhead_us: fixed cost added to every kernel.
    :param matmul_int8: large int8 GEMMs (None: same as ``matmul_fp8``).
    :param vector: arithmetic of non-GEMM kernels, fraction of the fp32 (CUDA-core) peak.
    :param matmul_sustained: the fraction of its isolated-benchmark rate a GEMM sustains
        inside a whole workload (every unit busy under the power limit, collectives' kernels
        beside it); applied to roofline and measured-table GEMM prices alike. Fitted per
        hardware on whole-step records (docs/cost-model.md); 1 where none separates it.
    :param matmul_sustained_16bit: the same for 16-bit (bf16, fp16) GEMMs, where a die's
        16-bit and low-precision GEMMs keep different fractions of their isolated rates
        inside workloads (None: ``matmul_sustained``). Fitted on whole-step bf16 records
        (docs/calibration.md, "16-bit GEMMs on Hopper").
    :param matmul_unaligned_8b: the rate of a GEMM whose rows (leading dimensions) are
        aligned to 4 or 8 bytes but not 16, as a fraction of the aligned GEMM's: the kernels
        cuBLAS runs without 16-byte strides load narrower vectors; measured per GPU
        (``benchmarks/gpu_alignment.py``, docs/cost-model.md); 1: not modelled.
    :param matmul_unaligned_2b: the same for rows aligned to 2 bytes or less (an odd
        dimension in a 16-bit type).
    :param matmul_memory: the fraction of the memory bandwidth a GEMM's operands stream at
        (None: ``memory``): a CPU BLAS packs a skinny GEMM's weight panel at well under
        copy speed; fitted by ``zrt calibrate`` on its skinny GEMMs (docs/cost-model.md,
        "Weight streaming").
    :param matmul_memory_k_overhead: elements' worth of streaming each weight row (of k
        elements) pays beyond its own: a GEMM's memory time counts ``n · k0`` more weight
        elements (per group of a grouped one); 0: none. Fitted by ``zrt calibrate`` with
        ``matmul_memory`` over skinny GEMMs of several weights (docs/cost-model.md,
        "Weight streaming"); a CPU BLAS's 4-row GEMM streams rows of 512 elements at 0.72
        of the rate of rows of 2,048.
    :param attention_decode_memory: the fraction of the memory bandwidth a decode
        attention (a few queries over a KV cache) streams its cache at (None: ``memory``);
        fitted by ``zrt calibrate`` on PyTorch's SDPA of one query (docs/cost-model.md).
    :param matmul_row_overhead: rows' worth of work a GEMM pays beyond its own rows: it
        runs at ``m / (m + this)`` of the rate (a CPU BLAS packs the weight panel once per
        call, work that grows with ``n × k`` as the rows' does); ``zrt calibrate``'s fit
        picks it or a row tile, whichever describes the timings better (docs/cost-model.md,
        "Row overhead"); 0: not modelled.
    :param matmul_group_rows_overhead: a grouped GEMM run as one GEMM per group (PyTorch's
        CPU ``_grouped_mm``, transformers' expert loop) runs at ``m / (m + this)`` of the
        dense rate of the same FLOPs, ``m`` its mean rows per group: each group's GEMM pays
        a fixed cost worth this many rows; measured by ``zrt calibrate``
        (docs/cost-model.md, "Grouped GEMMs"); 0: not modelled.
    :param matmul_overhead_us: a GEMM's fixed cost on top of ``launch_overhead_us``
        (pipeline fill and epilogue of a tensor-core kernel).
    :param parallel_units: output tiles a kernel computes at once (SMs on NVIDIA, cube
        cores on Ascend); 0 turns wave quantisation off.
    :param matmul_tile_m: GEMM output tile rows (for wave and padding losses).
    :param matmul_tile_n: GEMM output tile columns.
    :param matmul_k_overhead: a tile's fixed cost, in K elements, of its main loop.
    :param attention_tile_q: query rows per FlashAttention tile.
    :param attention_kv_overhead: a tile's fixed cost, in key positions, of its KV loop.
    :param attention_d_overhead: softmax work per tile in head-dim units: attention runs at
        ``attention`` × (d/(d + this)) / (128/(128 + this)) for head dim d; 0 ignores d.
    :param host_launch_us: host (CPU) time per kernel launch of an eager training step —
        PyTorch's dispatch, the module code around it and the driver call; a property of
        the machine's host CPU, fitted per CPU type (docs/moe-training.md); 0: not modelled.
    :param expert_kernel_us: device time each per-expert kernel of a training MoE layer
        adds beyond its work when launched eagerly (TransformerEngine's ``GroupedLinear``
        loops of one cuBLAS GEMM and one cast per expert over four streams; not charged when
        replayed from a CUDA graph); fitted on the MoE training records
        (docs/moe-training.md); 0: not modelled.
    :param comm_overlap_sms: SMs a collective's kernels hold while the collective runs
        beside computation (NCCL runs one resident CTA per channel, TransformerEngine's
        userbuffers a configured ``num_sm``): the compute beside it runs on the other
        ``parallel_units`` meanwhile. Training only (serving runs collectives on the
        compute stream); ``--fit-overlap`` fits it on the training records, and the NVIDIA
        packs ship 0 until that fit passes cross-validation (docs/overlap-rules.md); 0: not
        modelled.
    :param eager_host_us: host time per op of an eager PyTorch forward — Python module code,
        autograd recording, dispatch and the launch — measured by ``zrt calibrate`` on a
        small eager decoder (docs/profile.md); ``zrt diff`` runs the host beside the device
        (a GPU) or before each op (a CPU); 0: not modelled.
    :param eager_host_backward_us: the same per op of the backward (the C++ autograd engine).
    :param eager_host_infer_us: the same per op of a forward without autograd
        (``torch.no_grad``: prefill); 0: ``eager_host_us``.
    :param eager_host_decode_us: the same per op of a decode step (one token over a KV
        cache, without autograd); 0: ``eager_host_infer_us``.
    :param eager_host_fixed_us: host time once per training forward that no op stands for
        (model-level Python: masks, outputs); ``eager_host_backward_fixed_us``,
        ``eager_host_infer_fixed_us`` and ``eager_host_decode_fixed_us`` the same for the
        backward, an inference forward and a decode step.
        ``zrt calibrate`` fits the per-op and fixed costs on four depths of its probe.
    :param serving_host_request_us: host time per scheduled request of one iteration of a
        serving engine's executor loop on this machine's host CPU (TensorRT-LLM's PyTorch
        ``PyExecutor``: scheduling, input preparation, sampling and response handling, in
        Python, per request); its overlap scheduler runs that work beside the previous
        iteration's GPU work, so an iteration takes at least this × its requests
        (docs/inference-model.md); 0: not modelled.

    docs/cost-model.md gives the formulas and how each value was chosen.
    """

    matmul: float = 0.75
    matmul_fp8: float | None = None
    matmul_memory: float | None = None
    attention_decode_memory: float | None = None
    matmul_fp4: float | None = None
    attention: float = 0.55
    attention_backward: float | None = None
    attention_fa2: float | None = None
    attention_fa2_backward: float | None = None
    attention_fa1: float | None = None
    attention_fa1_backward: float | None = None
    memory: float = 0.8
    launch_overhead_us: float = 3.0
    matmul_int8: float | None = None
    vector: float = 0.5
    matmul_overhead_us: float = 0.0
    matmul_sustained: float = 1.0
    matmul_sustained_16bit: float | None = None
    matmul_unaligned_8b: float = 1.0
    matmul_unaligned_2b: float = 1.0
    parallel_units: int = 0
    matmul_tile_m: int = 128
    matmul_row_overhead: int = 0
    matmul_group_rows_overhead: int = 0
    matmul_memory_k_overhead: int = 0
    matmul_tile_n: int = 128
    matmul_k_overhead: int = 128
    attention_tile_q: int = 128
    attention_kv_overhead: int = 256
    attention_d_overhead: int = 0
    host_launch_us: float = 0.0
    expert_kernel_us: float = 0.0
    comm_overlap_sms: int = 0
    eager_host_us: float = 0.0
    eager_host_backward_us: float = 0.0
    eager_host_infer_us: float = 0.0
    eager_host_decode_us: float = 0.0
    eager_host_fixed_us: float = 0.0
    eager_host_backward_fixed_us: float = 0.0
    eager_host_infer_fixed_us: float = 0.0
    eager_host_decode_fixed_us: float = 0.0
    serving_host_request_us: float = 0.0

    def attention_rates(self, kernel: str) -> tuple[float, float] | None:
        """``(forward, backward)`` fraction of peak of the attention kernel generation
        ``kernel`` (:data:`ATTENTION_GENERATIONS`): ``flash`` is the device's own fused
        kernel (``attention`` / ``attention_backward``); ``flash2`` / ``flash1`` the older
        generations where the pack rates them, None where it does not."""
        if kernel == "flash":
            return self.attention, (self.attention_backward
                                    if self.attention_backward is not None else self.attention)
        fields = ATTENTION_GENERATIONS.get(kernel)
        if fields is None:
            return None
        forward, backward = (getattr(self, f) for f in fields)
        if forward is None:
            return None
        return forward, backward if backward is not None else forward

    def gemm_sustained(self, compute: str) -> float:
        """The fraction of its isolated rate a GEMM computing at ``compute`` (a compute
        key: ``bf16``, ``fp8``...) keeps inside a workload: ``matmul_sustained_16bit`` for
        bf16/fp16 where set, else ``matmul_sustained``."""
        if self.matmul_sustained_16bit is not None and compute in ("bf16", "fp16"):
            return self.matmul_sustained_16bit
        return self.matmul_sustained


@functools.lru_cache(maxsize=64)
def _power_limited(spec: HardwareSpec) -> HardwareSpec:
    return evolve(spec, compute=spec.compute.power_limited())


def power_limited_clock(spec: HardwareSpec, reference: HardwareSpec) -> float:
    """The clock ``spec`` sustains under its power limit over its datasheet's, relative to
    ``reference`` (a SKU of the same die whose efficiency fractions were measured).

    Dynamic power is C·V²·f and, through the DVFS range, the voltage rises about with the
    clock, so a die of N SMs busy with tensor work draws P ∝ N·f³ and holds f ∝ (P/N)^(1/3)
    at its board limit (measured on H100 and H200: back-to-back GEMMs hold 700 W at
    1290-1455 MHz against 1965 MHz between memory-bound ops, docs/profile.md). The
    datasheet's bf16 peak is N × the per-SM rate × its boost clock, so over the reference::

        (N / N_ref)^(2/3) · (P / P_ref)^(1/3) / (bf16 / bf16_ref)

    B200 (148 SMs, 1.0 kW, 2,250 TFLOP/s) against itself is 1; GB200 (148, 1.2 kW, 2,500)
    0.956; GB300 (160, 1.4 kW, 2,500) 1.061. Both specs need ``power_w`` and
    ``efficiency.parallel_units``, and the same per-SM bf16 rate per clock (one die).
    """
    for s in (spec, reference):
        if not s.power_w or not s.efficiency.parallel_units:
            raise SpecError(f"{s.id}: power_limited_clock needs power_w and "
                            "efficiency.parallel_units",
                            "give the board power and the SM count in the pack")
    units = spec.efficiency.parallel_units / reference.efficiency.parallel_units
    power = spec.power_w / reference.power_w  # type: ignore[operator]
    return units ** (2 / 3) * power ** (1 / 3) / (
        spec.compute.bf16_tflops / reference.compute.bf16_tflops)


def _efficiency_keys() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The YAML keys of ``efficiency``: fractions of peak in (0, 1], ``*_us`` overheads, and
    counts (fields with an integer default: tile sizes, parallel units).

    Read from :class:`Efficiency` itself, so a field added there is accepted in YAML at once.
    """
    from attrs import fields

    counts = tuple(f.name for f in fields(Efficiency)
                   if isinstance(f.default, int) and not isinstance(f.default, bool))
    names = tuple(f.name for f in fields(Efficiency) if f.name not in counts)
    return (tuple(n for n in names if not n.endswith("_us")),
            tuple(n for n in names if n.endswith("_us")), counts)


_ALIAS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


@frozen
class HardwareSpec:
    """One device type and the machine it sits in.

    :param id: the stable id (``nvidia_h100_sxm``), as validation records name hardware.
    :param aliases: short names (``h100``) that resolve to this id.
    :param interconnect: tiers innermost first; devices per tier grow; the last is unbounded.
    :param power_w: board power (TDP), watts.
    :param price_per_device_hour_usd: an on-demand cloud price, when the pack gives one.
    :param checkpoint_write_gb_per_s: what one device can write to checkpoint storage, GB/s
        (its share of the node's storage network), when the pack gives it (docs/goodput.md).
    :param source_file: the YAML the spec came from (empty when built in code).
    """

    id: str
    name: str
    vendor: str
    compute: ComputeSpec
    memory: MemorySpec
    interconnect: tuple[InterconnectTier, ...] = field(converter=tuple)
    power_w: float | None = None
    price_per_device_hour_usd: float | None = None
    aliases: tuple[str, ...] = field(default=(), converter=tuple)
    efficiency: Efficiency = field(factory=Efficiency)
    source: str = ""
    source_file: str = ""
    checkpoint_write_gb_per_s: float | None = None

    def __attrs_post_init__(self) -> None:
        _check_tiers(self.interconnect, self.source_file or self.id)

    @property
    def devices_per_node(self) -> int:
        """Devices in the innermost tier's domain (an NVLink node, an NVL72 rack; on a
        multi-die NPU modelled per die, the dies of one package)."""
        first = self.interconnect[0].devices if self.interconnect else None
        return first or 1

    @property
    def scale_up_tier(self) -> InterconnectTier:
        """The largest bounded tier: one scale-up domain (an NVLink node, an NVL72 rack, a
        UB supernode). With a single, unbounded tier, that tier."""
        bounded = [t for t in self.interconnect if t.devices is not None]
        return bounded[-1] if bounded else self.interconnect[-1]

    @property
    def scale_up_devices(self) -> int:
        """Devices in one scale-up domain (1 when the only tier is the unbounded network)."""
        return self.scale_up_tier.devices or 1

    def power_limited(self) -> HardwareSpec:
        """This device as a GEMM-dense training step runs it, held at its board power limit:
        every compute rate times ``compute.power_limited_clock``. The same object where
        that is 1, and one object per spec otherwise (price caches key on it)."""
        if self.compute.power_limited_clock == 1.0:
            return self
        return _power_limited(self)

    def without_in_network(self, *, nvls: bool = True, sharp: bool = True) -> HardwareSpec:
        """This spec with the tiers' in-network reduction turned off: NVLink SHARP when
        ``nvls`` (a run with ``NCCL_NVLS_ENABLE=0``, an engine's own all-reduce kernels),
        SHARP when ``sharp``. Unchanged (the same object) when there is nothing to remove."""
        tiers = tuple(evolve(t, nvls_efficiency=None if nvls else t.nvls_efficiency,
                             sharp=t.sharp and not sharp) for t in self.interconnect)
        if tiers == self.interconnect:
            return self
        return evolve(self, interconnect=tiers)

    def tier_for(self, group_size: int) -> InterconnectTier:
        """The innermost tier whose domain holds ``group_size`` consecutive devices."""
        for tier in self.interconnect:
            if tier.devices is None or group_size <= tier.devices:
                return tier
        return self.interconnect[-1]

    @classmethod
    def from_yaml(cls, path: str | Path) -> HardwareSpec:
        """Load a spec; an unknown key, a bad value or a malformed tier list names the field."""
        path = Path(path)
        return cls.from_mapping(load_yaml(path), source_file=str(path))

    @classmethod
    def from_mapping(cls, data: Any, *, source_file: str = "<mapping>") -> HardwareSpec:
        top = Fields(
            data,
            f"{source_file}: ",
            {"id", "name", "vendor", "aliases", "source", "compute", "memory", "interconnect",
             "power_w", "price_per_device_hour_usd", "efficiency",
             "checkpoint_write_gb_per_s"},
        )
        hw_id = top.str("id", required=True)
        assert hw_id is not None
        if not set(hw_id) <= _ALIAS_CHARS - {"-", "."}:
            raise SpecError(f"{source_file}: id {hw_id!r} must be lower-case letters, digits and _",
                            "ids look like nvidia_h100_sxm; put short names under aliases")

        c = Fields(top.mapping("compute"), f"{source_file}: compute",
                   set(COMPUTE_DTYPES) | {"exp_tera_per_s", "power_limited_clock"})
        compute = ComputeSpec(
            fp32_tflops=c.number("fp32", required=True, positive=True),
            bf16_tflops=c.number("bf16", required=True, positive=True),
            fp16_tflops=c.number("fp16", required=True, positive=True),
            tf32_tflops=c.number("tf32", positive=True),
            fp8_tflops=c.number("fp8", positive=True),
            fp4_tflops=c.number("fp4", positive=True),
            int8_tops=c.number("int8", positive=True),
            exp_tera_per_s=c.number("exp_tera_per_s", positive=True),
            power_limited_clock=c.number("power_limited_clock", 1.0, positive=True),
        )

        m = Fields(top.mapping("memory"), f"{source_file}: memory",
                   {"capacity_gb", "bandwidth_gb_per_s", "caches"})
        caches = []
        for i, raw in enumerate(m.list("caches")):
            cf = Fields(raw, f"{source_file}: memory.caches[{i}]",
                        {"name", "capacity_mb", "bandwidth_gb_per_s"})
            caches.append(CacheTier(
                name=cf.str("name", required=True),
                capacity_mb=cf.number("capacity_mb", required=True, positive=True),
                bandwidth_gb_per_s=cf.number("bandwidth_gb_per_s", positive=True),
            ))
        memory = MemorySpec(
            capacity_gb=m.number("capacity_gb", required=True, positive=True),
            bandwidth_gb_per_s=m.number("bandwidth_gb_per_s", required=True, positive=True),
            caches=tuple(caches),
        )

        tiers = []
        raw_tiers = top.list("interconnect")
        if not raw_tiers:
            raise SpecError(f"{source_file}: interconnect is required (at least one tier)")
        for i, raw in enumerate(raw_tiers):
            tf = Fields(raw, f"{source_file}: interconnect[{i}]",
                        {"name", "bandwidth_gb_per_s", "latency_us", "devices", "efficiency",
                         "nvls_efficiency", "sharp", "all_to_all_efficiency"})
            sharp = tf.raw("sharp", False)
            if not isinstance(sharp, bool):
                raise SpecError(f"{tf.path('sharp')} must be true or false, got {sharp!r}",
                                "true where the fabric's switches reduce for NCCL (SHARP)")
            tiers.append(InterconnectTier(
                name=tf.str("name", required=True),
                bandwidth_gb_per_s=tf.number("bandwidth_gb_per_s", required=True, positive=True),
                latency_us=tf.number("latency_us", required=True, non_negative=True),
                devices=tf.integer("devices", positive=True),
                efficiency=tf.number("efficiency", 0.8, positive=True, at_most=1.0),
                nvls_efficiency=tf.number("nvls_efficiency", positive=True, at_most=1.0),
                sharp=sharp,
                all_to_all_efficiency=tf.number("all_to_all_efficiency", positive=True,
                                                at_most=1.0),
            ))

        fractions, overheads, counts = _efficiency_keys()
        e = Fields(top.mapping("efficiency"), f"{source_file}: efficiency",
                   set(fractions) | set(overheads) | set(counts))
        defaults = Efficiency()
        eff_kwargs: dict[str, Any] = {
            k: e.number(k, getattr(defaults, k), positive=True, at_most=1.0) for k in fractions
        }
        for k in overheads:
            eff_kwargs[k] = e.number(k, getattr(defaults, k), non_negative=True)
        for k in counts:
            eff_kwargs[k] = e.integer(k, getattr(defaults, k), positive=True)
        if eff_kwargs["comm_overlap_sms"] and \
                not eff_kwargs["comm_overlap_sms"] < eff_kwargs["parallel_units"]:
            raise SpecError(
                f"{source_file}: efficiency.comm_overlap_sms "
                f"({eff_kwargs['comm_overlap_sms']}) must be fewer than parallel_units "
                f"({eff_kwargs['parallel_units']})",
                "give the SMs (units) the device has as parallel_units, or leave "
                "comm_overlap_sms out")

        aliases = top.list("aliases")
        for i, a in enumerate(aliases):
            if not isinstance(a, str) or not a or not set(a) <= _ALIAS_CHARS:
                raise SpecError(
                    f"{source_file}: aliases[{i}] must be a lower-case name "
                    f"(letters, digits, _ - .), got {a!r}")
        return cls(
            id=hw_id,
            name=top.str("name", required=True),
            vendor=top.str("vendor", required=True),
            compute=compute,
            memory=memory,
            interconnect=tiers,
            power_w=top.number("power_w", positive=True),
            price_per_device_hour_usd=top.number("price_per_device_hour_usd", positive=True),
            aliases=aliases,
            efficiency=Efficiency(**eff_kwargs),
            source=top.str("source", "") or "",
            source_file=source_file,
            checkpoint_write_gb_per_s=top.number("checkpoint_write_gb_per_s", positive=True),
        )

    def to_json(self) -> dict[str, Any]:
        from attrs import asdict

        return asdict(self, recurse=True, value_serializer=_serialise)


def _serialise(_inst: Any, _field: Any, value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def _check_tiers(tiers: tuple[InterconnectTier, ...], where: str) -> None:
    if not tiers:
        raise SpecError(f"{where}: interconnect needs at least one tier")
    previous = 0
    for i, tier in enumerate(tiers):
        last = i == len(tiers) - 1
        if tier.devices is None and not last:
            raise SpecError(
                f"{where}: interconnect[{i}].devices is null but it is not the outermost tier",
                "only the last tier may be unbounded",
            )
        if tier.devices is not None:
            if tier.devices < 2:
                raise SpecError(
                    f"{where}: interconnect[{i}].devices must be at least 2, got {tier.devices}",
                    "a tier links devices; drop a one-device tier",
                )
            if last:
                raise SpecError(
                    f"{where}: interconnect[{i}].devices must be null on the outermost tier",
                    "the outermost tier is unbounded",
                )
            if tier.devices <= previous:
                raise SpecError(
                    f"{where}: interconnect[{i}].devices ({tier.devices}) must be larger than "
                    f"the tier inside it ({previous})",
                    "list tiers innermost first, each holding more devices",
                )
            previous = tier.devices
        if tier.bandwidth_gb_per_s <= 0:
            raise SpecError(f"{where}: interconnect[{i}].bandwidth_gb_per_s must be > 0")


def spec_summary(spec: HardwareSpec) -> Mapping[str, Any]:
    """One flat row for listings (``zrt hw list``)."""
    return {
        "id": spec.id,
        "name": spec.name,
        "vendor": spec.vendor,
        "bf16_tflops": spec.compute.bf16_tflops,
        "fp8_tflops": spec.compute.fp8_tflops,
        "fp4_tflops": spec.compute.fp4_tflops,
        "hbm_gb": spec.memory.capacity_gb,
        "hbm_gb_per_s": spec.memory.bandwidth_gb_per_s,
        "scale_up": spec.scale_up_tier.name,
        "scale_up_devices": spec.scale_up_devices,
        "scale_up_gb_per_s": spec.scale_up_tier.bandwidth_gb_per_s,
        "scale_out_gb_per_s": spec.interconnect[-1].bandwidth_gb_per_s,
        "power_w": spec.power_w,
        "price_per_device_hour_usd": spec.price_per_device_hour_usd,
        "aliases": list(spec.aliases),
    }


def load_specs(directory: str | Path) -> list[HardwareSpec]:
    """Every ``*.yaml`` spec in a directory, sorted by file name: what a pack's hook returns.

    :raises SpecError: the directory holds no spec (a pack whose YAML files were left out of
        its wheel would otherwise contribute nothing, silently), or a file is malformed.
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise SpecError(f"{directory}: no hardware specs (*.yaml) found",
                        "check that the pack's YAML files are installed as package data")
    return [HardwareSpec.from_yaml(f) for f in files]
