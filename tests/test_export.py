"""export_graphs writes files that read back to the same graph and the same totals."""

from __future__ import annotations

import csv

import pytest

from zrt_core.capture import export as export_mod
from zrt_core.capture.export import (
    ExportError,
    export_capture,
    export_graphs,
    layer_kind_rows,
    summarize,
)
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode, TensorMeta


def _t(shape, tid, dtype="bfloat16", param=None):
    return TensorMeta(shape=shape, dtype=dtype, tensor_id=tid, param=param)


def _graph(phase="prefill") -> OpGraph:
    """Embedding, one captured dense layer standing for layers 0–2, and the head."""
    nodes = [
        OpNode(id=0, op="aten.embedding.default", category="embedding", phase=phase,
               inputs=[_t((16, 8), 100, param="embed"), _t((1, 4), 1, "int64")],
               outputs=[_t((1, 4, 8), 2)], flops=0, bytes_read=300, bytes_written=64,
               formula="embedding"),
        OpNode(id=1, op="aten.mm.default", category="matmul", phase=phase,
               inputs=[_t((4, 8), 2), _t((8, 8), 101, param="w")], outputs=[_t((4, 8), 3)],
               module_path="model.layers.0.mlp", layer_index=0, layer_kind="dense",
               flops=512, bytes_read=192, bytes_written=64, formula="mm"),
        OpNode(id=2, op="aten.view.default", category="view", phase=phase,
               inputs=[_t((4, 8), 3)], outputs=[_t((1, 4, 8), 4)], layer_index=0,
               layer_kind="dense", zero_cost=True),
        OpNode(id=3, op="aten.weird.default", category="other", phase=phase,
               inputs=[_t((1, 4, 8), 4)], outputs=[_t((1, 4, 8), 5)], layer_index=0,
               layer_kind="dense", bytes_read=64, bytes_written=64),
        OpNode(id=4, op="aten.mm.default", category="matmul", phase=phase,
               inputs=[_t((1, 8), 5), _t((8, 16), 102, param="head")],
               outputs=[_t((1, 16), 6)], flops=256, bytes_read=288, bytes_written=32,
               formula="mm"),
    ]
    return OpGraph(phase=phase, nodes=nodes,
                   edges=[(0, 1), (1, 2), (2, 3), (3, 4)],
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))],
                   meta={"model": "tiny", "batch": 1, "seq_len": 4})


# Whole-model totals of _graph(): the 3 layer ops run 3 times each.
# ops 1 + 3·3 + 1 = 11; FLOPs 3·512 + 256 = 1,792;
# bytes 364 + 3·(256 + 0 + 128) + 320 = 1,836
OPS, FLOPS, BYTES = 11, 1_792, 1_836


def test_summary_counts_every_layer():
    [s] = summarize({"prefill": _graph()}, analytic_flops={"prefill": 1_600},
                    capture_s={"prefill": 0.25})
    assert (s.ops, s.flops, s.bytes) == (OPS, FLOPS, BYTES)
    assert s.missing_formulas == ("aten.weird.default",)
    assert s.gap == pytest.approx((1_792 - 1_600) / 1_600)  # 0.12
    assert s.gap_flagged
    assert s.to_json()["gap_over_threshold"] is True and s.to_json()["capture_s"] == 0.25


def test_layer_kind_rows():
    rows = {r.kind: r for r in layer_kind_rows(_graph())}
    assert list(rows) == ["(before layers)", "dense", "(after layers)"]
    assert (rows["dense"].layers, rows["dense"].ops, rows["dense"].flops) == (3, 9, 1_536)
    assert (rows["(after layers)"].ops, rows["(after layers)"].bytes) == (1, 320)


def test_files_read_back(tmp_path):
    graphs = {"prefill": _graph("prefill"), "decode": _graph("decode")}
    result = export_graphs(tmp_path / "out", graphs, model="tiny",
                           analytic_flops={"prefill": 1_792, "decode": None}, onnx=False)
    out = tmp_path / "out"
    names = sorted(p.name for p in result.files)
    # without fused graphs: no fused files nor per-phase workbooks (tests/capture/
    # test_capture_files.py covers those); a DOT file per phase for its one layer kind
    assert names == ["decode.graph.json", "decode.layer-dense.dot", "decode.ops.csv",
                     "ops.xlsx", "prefill.graph.json", "prefill.layer-dense.dot",
                     "prefill.ops.csv"]
    back = OpGraph.loads((out / "prefill.graph.json").read_text())
    assert back == graphs["prefill"]
    assert back.totals().flops == FLOPS

    with (out / "prefill.ops.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5
    assert rows[1]["op"] == "aten.mm.default" and rows[1]["runs"] == "3"
    assert rows[1]["input_shapes"] == "4x8;8x8" and rows[1]["flops"] == "512"
    assert sum(int(r["runs"]) * int(r["flops"]) for r in rows) == FLOPS

    from openpyxl import load_workbook

    wb = load_workbook(out / "ops.xlsx", read_only=True)
    assert wb.sheetnames == ["summary", "per_layer", "ops_prefill", "ops_decode"]
    summary = [list(r) for r in wb["summary"].iter_rows(values_only=True)]
    header = summary.index(list(export_mod.SUMMARY_COLUMNS))
    prefill, decode = summary[header + 1], summary[header + 2]
    assert prefill[:6] == ["prefill", OPS, FLOPS, BYTES, 1_792, 0]
    assert prefill[7] == "aten.weird.default"
    assert decode[4] is None and decode[5] is None
    per_layer = list(wb["per_layer"].iter_rows(values_only=True))
    assert ("prefill", "dense", 3, 9, 1_536, 3 * 384) in per_layer
    ops = list(wb["ops_decode"].iter_rows(values_only=True))
    assert len(ops) == 1 + 5 and ops[0] == export_mod.OP_COLUMNS


def test_onnx_export_structure(tmp_path):
    onnx = pytest.importorskip("onnx")
    result = export_graphs(tmp_path, {"prefill": _graph()}, model="tiny", onnx=True)
    assert tmp_path / "prefill.onnx" in result.files
    model = onnx.load(str(tmp_path / "prefill.onnx"))
    g = model.graph
    assert [n.op_type for n in g.node] == ["aten_embedding_default", "aten_mm_default",
                                           "aten_view_default", "aten_weird_default",
                                           "aten_mm_default"]
    assert all(n.domain == "zrt" for n in g.node)
    # Graph inputs: the weights and token ids nobody produces; output: the logits.
    assert sorted(i.name for i in g.input) == ["t1", "t100", "t101", "t102"]
    assert [o.name for o in g.output] == ["t6"]
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*g.input, *g.output, *g.value_info)}
    assert shapes["t3"] == [4, 8] and shapes["t6"] == [1, 16]
    runs = {a.name: a.i for a in g.node[1].attribute if a.name in ("runs", "flops")}
    assert runs == {"runs": 3, "flops": 512}


def test_onnx_skipped_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(export_mod, "_onnx_module", lambda: None)
    result = export_graphs(tmp_path, {"prefill": _graph()})
    assert not (tmp_path / "prefill.onnx").exists()
    assert any("ONNX export skipped" in note for note in result.notes)
    with pytest.raises(ExportError, match="needs the onnx package"):
        export_graphs(tmp_path, {"prefill": _graph()}, onnx=True)


def test_export_capture_uses_result_fields(tmp_path):
    from types import SimpleNamespace

    check = SimpleNamespace(analytic=1_000)
    result = SimpleNamespace(graphs={"prefill": _graph()}, model="tiny",
                             timings_s={"build": 0.5, "prefill": 1.5},
                             flops_checks={"prefill": check})
    export_capture(result, tmp_path, onnx=False)
    from openpyxl import load_workbook

    rows = list(load_workbook(tmp_path / "ops.xlsx", read_only=True)["summary"]
                .iter_rows(values_only=True))
    assert rows[0] == ("model", "tiny")
    prefill = next(r for r in rows if r and r[0] == "prefill")
    assert prefill[6] == "YES" and prefill[8] == 1.5  # 1,792 vs 1,000: +79%


def test_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="cannot create or write the output directory"):
        export_graphs(blocker / "sub", {"prefill": _graph()}, onnx=False)
