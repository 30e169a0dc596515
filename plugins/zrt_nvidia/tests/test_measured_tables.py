"""The measured tables this pack ships: they load, name known hardware, and price nodes."""

from __future__ import annotations

import pytest
from attrs import evolve
from zrt_nvidia.plugin import MEASURED_TABLES, OPT_IN_TABLES

from zrt_core.cost.backend import PriceSource
from zrt_core.cost.pricing import build_backends
from zrt_core.ir.graph import OpNode, TensorMeta
from zrt_core.plugins import get_plugin_manager


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager()


def test_every_table_loads_and_names_an_installed_hardware_id(host):
    tables = [t for t in host.measured_tables if t.name.split("/")[0].startswith("nvidia_")]
    assert len(MEASURED_TABLES) == 3 and len(OPT_IN_TABLES) == 2
    assert [t.name for t in tables if t.opt_in] == ["nvidia_h200/zrt_profile",
                                                    "nvidia_h100_sxm/zrt_profile"]
    assert len(tables) == 5
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
    """The pack's spec for isolated-kernel timings (``matmul_sustained`` 1, no 16-bit
    term of its own)."""
    return evolve(spec, efficiency=evolve(spec.efficiency, matmul_sustained=1.0,
                                          matmul_sustained_16bit=None))


def test_h100_bf16_gemm_row_is_an_exact_hit(host):
    backend = build_backends(_isolated(host.hardware_spec("nvidia_h100_sxm")), host)[0]
    cost = backend.price(_mm(4096, 4096, 4096, "bfloat16"))
    # OpenXLA: 783328793548203 FLOP/s -> 137438953472 / that = 175.4550 us
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(175.4550e-6, rel=1e-6)


def test_a_measured_gemm_inside_a_workload_runs_at_the_sustained_rate(host):
    spec = host.hardware_spec("nvidia_h100_sxm")
    assert (spec.efficiency.matmul_sustained, spec.efficiency.matmul_sustained_16bit) == (
        0.89, 0.75)
    cost = build_backends(spec, host)[0].price(_mm(4096, 4096, 4096, "bfloat16"))
    # a bf16 GEMM: the row's 175.4550 us at the 16-bit 0.75 of its rate
    assert cost.time_s == pytest.approx(175.4550e-6 / 0.75, rel=1e-6)
    assert cost.detail["sustained"] == 0.75
    h800 = host.hardware_spec("nvidia_h800")
    fp8 = build_backends(h800, host)[0].price(_mm(4096, 7168, 4096, "float8_e4m3fn"))
    # an fp8 GEMM: DeepGEMM's 184.4464 us at the die's 0.89
    assert fp8.time_s == pytest.approx(184.4464e-6 / 0.89, rel=1e-6)
    assert fp8.detail["sustained"] == 0.89


def test_h800_fp8_gemm_row_is_an_exact_hit(host):
    backend = build_backends(_isolated(host.hardware_spec("nvidia_h800")), host)[0]
    cost = backend.price(_mm(4096, 7168, 4096, "float8_e4m3fn"))
    # DeepGEMM: 1304 TFLOPS at m=4096, n=4096, k=7168 -> 240518168576 / 1.304e15 = 184.4464 us
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(184.4464e-6, rel=1e-6)


def _price(backends, node: OpNode):
    return next(c for c in (b.price(node) for b in backends) if c is not None)


@pytest.mark.parametrize(("n", "k"), [(1024, 8192), (8192, 1024), (3584, 8192), (8192, 3584),
                                      (16032, 8192)])
def test_decode_gemm_time_never_falls_as_the_batch_grows(host, n, k):
    """Llama-3-70B's per-rank decode GEMMs at tp 8 (q, o, gate/up, down, LM head) at batch
    1..512: the weights stream once whatever the batch, so time must not fall.

    Issue 8: the OpenXLA table (m, n, k from 256 to 4096) priced m=32 and m=64 by borrowing
    the achieved fraction of 256-row batched rows near in (ln FLOPs, ln bytes): the q GEMM
    (n 1024, k 8192) took 20.88 us at batch 32 and 15.39 us at batch 64, so a tp8 decode
    step fell from 22.66 to 20.99 ms. Below the table's m range the roofline prices it:
    17.40 MB of weights at 3.35 TB/s × 0.88 = 5.90 us plus the 5.5 us floor."""
    backends = build_backends(host.hardware_spec("nvidia_h100_sxm"), host)
    times = [_price(backends, _mm(m, k, n, "bfloat16")).time_s
             for m in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512)]
    assert times == sorted(times)
    if (n, k) == (1024, 8192):
        at_32 = _price(backends, _mm(32, k, n, "bfloat16"))
        assert at_32.source == PriceSource.ROOFLINE
        # (32·8192 + 8192·1024 + 32·1024)·2 = 17,367,040 bytes
        assert at_32.time_s == pytest.approx(17_367_040 / (3.35e12 * 0.88) + 5.5e-6, rel=1e-3)


def test_the_opt_in_h200_table_prices_only_when_named(host):
    from zrt_core.cost.measured import MeasuredBackend
    from zrt_core.profile.tables import backends_with_tables, load_table_rows

    h200 = _isolated(host.hardware_spec("nvidia_h200"))
    # no default table measures the H200: its estimates stay on the roofline
    assert MeasuredBackend.for_hardware(h200, host) is None
    rows = load_table_rows("nvidia_h200/zrt_profile", "nvidia_h200", host)
    # the fifth run's four profiles with the grid: 263 distinct kernels (the CSV's header)
    assert len(rows) == 263 and all(r.source.startswith("zrt profile 2026-11-27 on NVIDIA H200")
                                    for r in rows)
    backend = backends_with_tables(h200, host, "nvidia_h200/zrt_profile")[0]
    cost = backend.price(_mm(4096, 4096, 4096, "bfloat16"))
    # the table's row: 4096 x 4096 x 4096 bf16 (TN, weights cycled) in 173.4 us on the H200
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(173.4e-6, rel=1e-9)


def test_the_opt_in_h100_table_is_priced_before_the_default_ones_when_named(host):
    from zrt_core.profile.tables import backends_with_tables, load_table_rows

    h100 = _isolated(host.hardware_spec("nvidia_h100_sxm"))
    rows = load_table_rows("nvidia_h100_sxm/zrt_profile", "nvidia_h100_sxm", host)
    # 122 rows of the Llama profiles and 59 of Qwen3-MoE's that the Llama ones lacked, less
    # the 46 whose times were the host's issue (the CSV's header)
    assert len(rows) == 135 and all(
        r.source.startswith("zrt profile 2026-11-27 on NVIDIA H100 80GB HBM3") for r in rows)
    node = _mm(4096, 4096, 4096, "bfloat16")
    backend = backends_with_tables(h100, host, "nvidia_h100_sxm/zrt_profile")[0]
    # the table's row: 4096 x 4096 x 4096 bf16 (TN, weights cycled) in 177.5 us on the H100,
    # not the default OpenXLA row's 175.455 us (test_h100_bf16_gemm_row_is_an_exact_hit)
    cost = backend.price(node)
    assert cost.source == PriceSource.MEASURED
    assert cost.time_s == pytest.approx(177.5e-6, rel=1e-9)
