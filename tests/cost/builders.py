"""A round-number device for cost tests, and builders for hand-made nodes.

The device ("toy"): bf16 1000 TFLOP/s, fp8 2000, fp32 (CUDA cores) 50; HBM 2000 GB/s.
Efficiency: matmul 0.8, fp8 0.5, attention 0.5 / backward 0.25, memory 0.5 (so 1000 GB/s
achievable), vector 0.5 (25 TFLOP/s), launch 2 us, GEMM extra 1 us, 4 parallel units,
128x128 GEMM tiles, K overhead 128, attention tiles 128 and KV overhead 128.
Network, innermost first: 4 devices at 100 GB/s x 0.5, 1 us; 16 devices at 40 GB/s x 0.5,
5 us; the rest at 10 GB/s x 1.0, 10 us.
"""

from __future__ import annotations

from collections.abc import Sequence

from zrt_core.hardware import (
    ComputeSpec,
    Efficiency,
    HardwareSpec,
    InterconnectTier,
    MemorySpec,
)
from zrt_core.ir.graph import OpNode, TensorMeta


def make_toy(**efficiency: object) -> HardwareSpec:
    base = dict(matmul=0.8, matmul_fp8=0.5, attention=0.5, attention_backward=0.25,
                memory=0.5, vector=0.5, launch_overhead_us=2.0, matmul_overhead_us=1.0,
                parallel_units=4, matmul_tile_m=128, matmul_tile_n=128, matmul_k_overhead=128,
                attention_tile_q=128, attention_kv_overhead=128)
    base.update(efficiency)
    return HardwareSpec(
        id="toy",
        name="Toy accelerator",
        vendor="test",
        compute=ComputeSpec(fp32_tflops=50, bf16_tflops=1000, fp16_tflops=1000,
                            fp8_tflops=2000, int8_tops=2000),
        memory=MemorySpec(capacity_gb=80, bandwidth_gb_per_s=2000),
        interconnect=[
            InterconnectTier(name="t0", bandwidth_gb_per_s=100, latency_us=1, devices=4,
                             efficiency=0.5),
            InterconnectTier(name="t1", bandwidth_gb_per_s=40, latency_us=5, devices=16,
                             efficiency=0.5),
            InterconnectTier(name="t2", bandwidth_gb_per_s=10, latency_us=10, devices=None,
                             efficiency=1.0),
        ],
        efficiency=Efficiency(**base),
    )



def tensor(*shape: int, dtype: str = "bfloat16", param: str | None = None) -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, param=param)


_ids = iter(range(1, 10**9))


def op_node(op: str, category: str, inputs: Sequence[TensorMeta],
            outputs: Sequence[TensorMeta], *, flops: int = 0, phase: str = "prefill",
            bytes_read: int | None = None, bytes_written: int | None = None,
            formula: str | None = "test", layer_index: int | None = None,
            zero_cost: bool = False, **attrs: object) -> OpNode:
    """A node whose bytes default to its tensors read and written once."""
    return OpNode(
        id=next(_ids), op=op, category=category, phase=phase, inputs=inputs, outputs=outputs,
        flops=flops,
        bytes_read=sum(t.nbytes for t in inputs) if bytes_read is None else bytes_read,
        bytes_written=sum(t.nbytes for t in outputs) if bytes_written is None else bytes_written,
        formula=formula, layer_index=layer_index, zero_cost=zero_cost, attrs=attrs)


def mm_node(m: int, k: int, n: int, *, dtype: str = "bfloat16", weight_dtype: str | None = None,
            **kw: object) -> OpNode:
    """``aten.mm``: [m, k] @ [k, n] with FLOPs 2mnk."""
    return op_node("aten.mm.default", "matmul",
                   [tensor(m, k, dtype=dtype), tensor(k, n, dtype=weight_dtype or dtype,
                                                      param="w")],
                   [tensor(m, n, dtype="bfloat16" if dtype.startswith("float8") else dtype)],
                   flops=2 * m * n * k, **kw)
