"""The measured tables this pack ships: they load, name known hardware, and price nodes."""

from __future__ import annotations

import pytest
from attrs import evolve
from zrt_nvidia.plugin import MEASURED_TABLES

from zrt_core.cost.backend import PriceSource
from zrt_core.cost.pricing import build_backends
from zrt_core.ir.graph import OpNode, TensorMeta
from zrt_core.plugins import get_plugin_manager


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager()


def test_every_table_loads_and_names_an_installed_hardware_id(host):
    tables = [t for t in host.measured_tables if t.name.split("/")[0].startswith("nvidia_")]
    assert len(tables) == len(MEASURED_TABLES) == 3
    for table in tables:
        rows = table.load()
        assert rows, table.name
        assert table.hardware_id in host.hardware
        assert all(r.source for r in rows)


def _mm(m: int, k: int, n: int, dtype: str) -> OpNode:
    a, b = TensorMeta((m, k), dtype), TensorMeta((k, n), dtype, param="w")
    out = TensorMeta((m, n), "bfloat16")
    return OpNode(id=1, op="aten.mm.default", category="matmul", phase="prefill",
                  inputs=[a, b], outputs=[out], flops=2 * m * n * k,
                  bytes_read=a.nbytes + b.nbytes, bytes_written=out.nbytes, formula="mm")


def _isolated(spec):
    """The pack's spec for isolated-kernel timings (``matmul_sustained`` 1)."""
    return evolve(spec, efficiency=evolve(spec.efficiency, matmul_sustained=1.0))


def test_h100_bf16_gemm_row_is_an_exact_hit(host):
    backend = build_backends(_isolated(host.hardware_spec("nvidia_h100_sxm")), host)[0]
    cost = backend.price(_mm(4096, 4096, 4096, "bfloat16"))
    # OpenXLA: 783328793548203 FLOP/s -> 137438953472 / that = 175.4550 us
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(175.4550e-6, rel=1e-6)


def test_a_measured_gemm_inside_a_workload_runs_at_the_sustained_rate(host):
    spec = host.hardware_spec("nvidia_h100_sxm")
    assert spec.efficiency.matmul_sustained == 0.89
    cost = build_backends(spec, host)[0].price(_mm(4096, 4096, 4096, "bfloat16"))
    # the row's 175.4550 us at 0.89 of its rate
    assert cost.time_s == pytest.approx(175.4550e-6 / 0.89, rel=1e-6)
    assert cost.detail["sustained"] == 0.89


def test_h800_fp8_gemm_row_is_an_exact_hit(host):
    backend = build_backends(_isolated(host.hardware_spec("nvidia_h800")), host)[0]
    cost = backend.price(_mm(4096, 7168, 4096, "float8_e4m3fn"))
    # DeepGEMM: 1304 TFLOPS at m=4096, n=4096, k=7168 -> 240518168576 / 1.304e15 = 184.4464 us
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(184.4464e-6, rel=1e-6)
