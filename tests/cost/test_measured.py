"""Measured tables: CSV validation, exact hits, interpolation, refusal to extrapolate.

Peaks on the toy device (conftest.py): bf16 1e15 FLOP/s, HBM 2e12 B/s (tables compare with
raw peaks, not efficiencies).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from zrt_core.cost.backend import PriceSource
from zrt_core.cost.measured import MAX_DISTANCE, MeasuredBackend, MeasuredTable, load_csv
from zrt_core.errors import SpecError

from .builders import mm_node, op_node, tensor

HEADER = "hardware_id,op,dtype,b,m,n,k,h,h_kv,s_q,s_kv,d,causal,flops,bytes,time_us,source\n"
# 2048^3 GEMM: F = 17179869184, bytes 3*2048^2*2 = 25165824; peak roofline
# max(F/1e15, B/2e12) = 1.7179869184e-5 s, measured 34.359738368 us -> half of it.
ROW_2048 = "toy,gemm,bfloat16,1,2048,2048,2048,,,,,,,,,34.359738368,test 2048\n"
# 4096^3 GEMM: F = 137438953472 -> 1.37438953472e-4 s ideal, measured at 0.8 of it.
ROW_4096 = "toy,gemm,bfloat16,1,4096,4096,4096,,,,,,,,,171.79869184,test 4096\n"
ROW_ATTN = "toy,attention_fwd,bfloat16,2,,,,8,8,1024,1024,128,0,,,50,fa test\n"


def write(tmp_path: Path, body: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body, encoding="utf-8")
    return path


@pytest.fixture
def backend(toy, tmp_path):
    rows = load_csv(write(tmp_path, ROW_2048 + ROW_4096 + ROW_ATTN), hardware_id="toy")
    return MeasuredBackend(toy, rows)


def test_exact_row_prices_the_node(backend):
    cost = backend.price(mm_node(2048, 2048, 2048))
    assert (cost.source, cost.rule, cost.backend) == (PriceSource.MEASURED, "gemm_exact",
                                                      "measured")
    assert cost.time_s == pytest.approx(34.359738368e-6, rel=1e-12)
    assert (cost.detail["line"], cost.detail["source"]) == (2, "test 2048")


def test_exact_attention_row(backend, node):
    q = tensor(2, 8, 1024, 128)
    cost = backend.price(node("aten._scaled_dot_product_flash_attention.default", "attention",
                              [q, q, q], [q], flops=4 * 2 * 8 * 1024 * 1024 * 128))
    assert (cost.source, cost.rule) == (PriceSource.MEASURED, "attention_fwd_exact")
    assert cost.time_s == pytest.approx(50e-6)


def test_between_rows_interpolates_the_achieved_fraction(backend):
    cost = backend.price(mm_node(2048, 4096, 2048))  # m=2048, k=4096, n=2048
    # node: F = 2*2048*2048*4096 = 34359738368, bytes (2*8388608 + 4194304)*2 = 41943040;
    # ideal max(F/1e15, B/2e12) = 3.4359738368e-5.
    # distances in (ln F, ln B): to 2048^3 hypot(ln 2, ln(41943040/25165824));
    # to 4096^3 hypot(ln 4, ln(100663296/41943040)); weights 1/d, fractions 0.5 and 0.8.
    d_a = math.hypot(math.log(2), math.log(41943040 / 25165824))
    d_b = math.hypot(math.log(4), math.log(100663296 / 41943040))
    w_a, w_b = 1 / d_a, 1 / d_b
    fraction = math.exp((w_a * math.log(0.5) + w_b * math.log(0.8)) / (w_a + w_b))
    assert (cost.source, cost.rule) == (PriceSource.INTERPOLATED, "gemm_interpolated")
    assert cost.time_s == pytest.approx(3.4359738368e-5 / fraction, rel=1e-12)
    assert [n["line"] for n in cost.detail["neighbours"]] == [2, 3]
    assert cost.detail["neighbours"][0]["distance"] == pytest.approx(d_a, rel=1e-12)


def test_same_work_in_another_shape_takes_that_rows_fraction(toy, tmp_path):
    rows = load_csv(write(tmp_path, "toy,gemm,bfloat16,1,1024,4096,2048,,,,,,,,,100,x\n"))
    cost = MeasuredBackend(toy, rows).price(mm_node(4096, 2048, 1024))  # m,n swapped
    # same FLOPs and bytes, distance 0: the time of that row
    assert cost.source == PriceSource.INTERPOLATED
    assert cost.time_s == pytest.approx(100e-6, rel=1e-12)


def test_far_outside_the_table_is_left_to_the_roofline(backend):
    # 256^3 is 512x fewer FLOPs than the smallest row: ln 512 > ln 4
    assert math.log(512) > MAX_DISTANCE
    assert backend.price(mm_node(256, 256, 256)) is None


def test_a_gemm_outside_the_measured_shapes_is_left_to_the_roofline(backend):
    # m=1024 is below the rows' m/n range (2048..4096) though near in work: F =
    # 2·1024·2048·4096 = 17179869184 (the 2048^3 row's), bytes (1024·4096 + 4096·2048 +
    # 1024·2048)·2 = 29360128, ln(29360128/25165824) = 0.15 < ln 4 from that row
    assert math.log(29360128 / 25165824) < MAX_DISTANCE
    assert backend.price(mm_node(1024, 4096, 2048)) is None
    # k=1024 below the rows' k range (2048..4096) likewise
    assert backend.price(mm_node(4096, 1024, 4096)) is None


def test_other_dtype_or_uncovered_op_is_not_priced(backend, node):
    assert backend.price(mm_node(2048, 2048, 2048, dtype="float16")) is None
    x = tensor(64, 64)
    assert backend.price(node("aten.add.Tensor", "elementwise", [x, x], [x])) is None
    assert backend.price(node("aten.view.default", "view", [x], [x])) is None


def test_graph_op_rows_are_keyed_by_flops_and_bytes(toy, tmp_path, node):
    rows = load_csv(write(tmp_path, "toy,aten.add.Tensor,bfloat16,,,,,,,,,,,0,24576,7.5,x\n"))
    x = tensor(64, 64)  # 8192 bytes; add reads two, writes one: 24576
    cost = MeasuredBackend(toy, rows).price(node("aten.add.Tensor", "elementwise", [x, x], [x]))
    assert (cost.rule, cost.time_s) == ("aten.add.Tensor_exact", pytest.approx(7.5e-6))


def test_factory_needs_a_table_for_the_hardware(toy, host_with_table):
    assert MeasuredBackend.for_hardware(toy, host_with_table(hardware_id="toy")) is not None
    assert MeasuredBackend.for_hardware(toy, host_with_table(hardware_id="other")) is None


@pytest.fixture
def host_with_table(tmp_path):
    from zrt_core import hookimpl
    from zrt_core.plugins import get_plugin_manager

    hosts = []

    def make(hardware_id: str):
        path = write(tmp_path, ROW_2048.replace("toy,", f"{hardware_id},", 1),
                     name=f"{hardware_id}.csv")

        class Plugin:
            @hookimpl
            def zrt_measured_tables(self):
                return [MeasuredTable(name=f"{hardware_id}/gemm", hardware_id=hardware_id,
                                      path=str(path))]

        host = get_plugin_manager(autoload=False)
        host.register(Plugin(), name="tables")
        hosts.append(host)
        return host

    return make


@pytest.mark.parametrize(("body", "message"), [
    ("", "empty measured table"),
    ("hardware_id,op,dtype,time_us,source,colour\n", "line 1: unknown column 'colour'"),
    ("hardware_id,op,dtype,time_us\n", "line 1: missing column 'source'"),
    ("hardware_id,op,dtype,m,m,n,k,time_us,source\n", "line 1: column 'm' appears twice"),
])
def test_bad_headers(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(SpecError, match=f"bad.csv: {message}"):
        load_csv(path)


@pytest.mark.parametrize(("row", "message"), [
    ("toy,gemm,bfloat16,1,x,2,2,,,,,,,,,1,s\n", "line 2: m must be a positive integer"),
    ("toy,gemm,bfloat17,1,2,2,2,,,,,,,,,1,s\n", "line 2: unknown dtype 'bfloat17'"),
    ("toy,gemm,bfloat16,1,2,2,,,,,,,,,,1,s\n", "line 2: op 'gemm' needs k"),
    ("toy,gemm,bfloat16,1,2,2,2,,,,,,,,,0,s\n", "line 2: time_us must be a finite number > 0"),
    ("toy,gemm,bfloat16,1,2,2,2,,,,,,,,,1,\n", "line 2: source is empty"),
    ("toy,aten.add.Tensor,bfloat16,,,,,,,,,,,,,1,s\n", "line 2: op 'aten.add.Tensor' is not an "
                                                      "op class, so it needs bytes"),
    ("toy,attention_fwd,bfloat16,1,,,,8,8,64,64,64,maybe,,,1,s\n", "line 2: causal must be"),
    ("toy,gemm,bfloat16,1,2,2,2,,,,,,,,,1\n", "line 2: 16 cells for 17 columns"),
    ("other,gemm,bfloat16,1,2,2,2,,,,,,,,,1,s\n", "line 2: hardware_id 'other' in a table for"),
    (ROW_2048 + ROW_2048, "line 3: same op, dtype and shape as line 2"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    with pytest.raises(SpecError, match=f"t.csv: {message}"):
        load_csv(write(tmp_path, row), hardware_id="toy")


def test_comments_and_blank_lines_are_skipped(tmp_path):
    rows = load_csv(write(tmp_path, "# measured by hand\n\n" + ROW_2048))
    # header is line 1, the comment line 2, the blank line 3: the row is line 4
    assert [r.line for r in rows] == [4]


def test_node_without_a_shape_falls_through(backend, node):
    scalar_out = node("fused.matmul_thing", "matmul", [tensor(4, 4)], [])
    assert backend.price(scalar_out) is None


def test_missing_table_file_is_an_error(tmp_path):
    table = MeasuredTable(name="x/gemm", hardware_id="x", path=str(tmp_path / "nope.csv"))
    with pytest.raises(SpecError, match="measured table 'x/gemm': cannot read"):
        table.load()


def test_op_node_helper_counts_bytes_once():
    x = tensor(2, 2)
    n = op_node("aten.add.Tensor", "elementwise", [x, x], [x])
    assert (n.bytes_read, n.bytes_written) == (16, 8)


def test_weight_only_quantised_gemm_is_left_to_the_roofline(backend):
    # bf16 x int4 moves a quarter of the weight bytes of the bf16 row with the same shape
    assert backend.price(mm_node(2048, 2048, 2048, weight_dtype="int4")) is None
