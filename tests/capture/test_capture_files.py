"""What ``zrt capture --out`` writes besides the op lists: the per-phase op workbook (six
styled sheets), the fused graph JSON and ONNX, ``fusion_rules.json`` and a DOT file per layer
kind — on a hand-built graph with one rule (exact counts) and on a captured tiny Llama.

Whole-model counts of :func:`_raw` (its one layer stands for layers 0-2, so each layer op
runs 3 times):
raw   ops 1 + 3·4 + 1 = 14; FLOPs 3·(512 + 0 + 32 + 32) + 1,024 = 2,752;
      bytes 352 + 3·(256 + 0 + 192 + 192) + 448 = 2,720
fused (view, mul, add → one node): ops 1 + 3·2 + 1 = 8; FLOPs unchanged 2,752;
      bytes 352 + 3·(256 + 192) + 448 = 2,144 — the fused node reads the mm's output once
      (64) and the embedding's (64), and writes only its result (64): 192 instead of 384.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest

from zrt_core.capture import workbook as workbook_mod
from zrt_core.capture.dot import OUTSIDE_IN, OUTSIDE_OUT, layer_dot, layers_by_kind
from zrt_core.capture.export import ExportError, export_graphs, prepare_out_dir
from zrt_core.capture.fusion_records import fusion_records
from zrt_core.cli.main import main
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode, TensorMeta
from zrt_core.transforms.fusion import FusionRule, FusionRulePack, fuse

openpyxl = pytest.importorskip("openpyxl")


def _t(shape, tid, dtype="bfloat16", param=None):
    return TensorMeta(shape=shape, dtype=dtype, tensor_id=tid, param=param)


_LAYER = dict(module_path="model.layers.0.mlp", module_class="MLP", layer_index=0,
              layer_kind="dense")


def _raw(phase: str = "prefill") -> OpGraph:
    """Embedding; in layer 0: mm → view → mul(x, x) → add(·, embedding); the head."""
    nodes = [
        OpNode(id=0, op="aten.embedding.default", category="embedding", phase=phase,
               inputs=[_t((16, 8), 100, param="embed"), _t((1, 4), 1, "int64")],
               outputs=[_t((1, 4, 8), 2)], module_path="model.embed_tokens",
               module_class="Embedding", bytes_read=288, bytes_written=64,
               formula="embedding"),
        OpNode(id=1, op="aten.mm.default", category="matmul", phase=phase,
               inputs=[_t((4, 8), 2), _t((8, 8), 101, param="w")], outputs=[_t((4, 8), 3)],
               flops=512, bytes_read=192, bytes_written=64, formula="mm", **_LAYER),
        OpNode(id=2, op="aten.view.default", category="view", phase=phase,
               inputs=[_t((4, 8), 3)], outputs=[_t((1, 4, 8), 4)], zero_cost=True, **_LAYER),
        OpNode(id=3, op="aten.mul.Tensor", category="elementwise", phase=phase,
               inputs=[_t((1, 4, 8), 4), _t((1, 4, 8), 4)], outputs=[_t((1, 4, 8), 5)],
               flops=32, bytes_read=128, bytes_written=64, formula="mul", **_LAYER),
        OpNode(id=4, op="aten.add.Tensor", category="elementwise", phase=phase,
               inputs=[_t((1, 4, 8), 5), _t((1, 4, 8), 2)], outputs=[_t((1, 4, 8), 6)],
               flops=32, bytes_read=128, bytes_written=64, formula="add", **_LAYER),
        OpNode(id=5, op="aten.mm.default", category="matmul", phase=phase,
               inputs=[_t((4, 8), 6), _t((8, 16), 102, param="head")],
               outputs=[_t((4, 16), 7)], module_path="lm_head", module_class="Linear",
               flops=1024, bytes_read=320, bytes_written=128, formula="mm"),
    ]
    return OpGraph(phase=phase, nodes=nodes,
                   edges=[(0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (4, 5)],
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))],
                   meta={"model": "tiny", "batch": 1, "seq_len": 4})


PACK = FusionRulePack(name="test", platform="generic", rules=[FusionRule.from_mapping({
    "name": "mul_add", "scope": {"module_class": "MLP"},
    "ops": ["aten.mul.Tensor", "aten.add.Tensor"], "match": "sequence",
    "kernel": "test kernel", "category": "elementwise", "op": "fused.mul_add"}, "test")])


def _export(tmp_path, phases=("prefill",), **kwargs):
    raw = {p: _raw(p) for p in phases}
    fused = {p: fuse(g, [PACK]) for p, g in raw.items()}
    result = export_graphs(tmp_path, raw, fused=fused, platform="generic", model="tiny",
                           config={"hidden_size": 8, "rope_parameters": {"rope_theta": 1e4},
                                   "note": "=1+1\x07"},
                           analytic_flops={"prefill": 2_752}, **kwargs)
    return raw, fused, result


# -- fusion provenance ------------------------------------------------------------------


def test_fusion_records_name_rule_and_raw_nodes():
    raw = _raw()
    fused = fuse(raw, [PACK])
    [record] = fusion_records(raw, fused)
    # The fused node's id is the next above every raw id (0-5); the view serving only the
    # mul is absorbed with it.
    assert (record.pack, record.rule, record.fused_node, record.fused_op) == \
        ("test", "mul_add", 6, "fused.mul_add")
    assert record.raw_nodes == (2, 3, 4)
    assert record.raw_ops == ("aten.view.default", "aten.mul.Tensor", "aten.add.Tensor")
    assert (record.kernel, record.layer_index, record.runs) == ("test kernel", 0, 3)


def test_records_follow_a_fused_member_down_to_raw_nodes():
    """A graph fused twice: the second pass's node holds the first pass's fused node; the
    record still names raw ids."""
    raw = _raw()
    once = fuse(raw, [PACK])
    second = FusionRulePack(name="more", platform="generic", rules=[FusionRule.from_mapping({
        "name": "mm_then", "scope": {"module_class": "MLP"},
        "ops": ["aten.mm.default", "fused.mul_add"], "match": "sequence",
        "kernel": "k2", "category": "matmul", "op": "fused.mm_mul_add"}, "test")])
    twice = fuse(once, [second])
    records = {r.rule: r for r in fusion_records(raw, twice)}
    assert list(records) == ["mm_then"]
    assert records["mm_then"].raw_nodes == (1, 2, 3, 4)


# -- the workbook -----------------------------------------------------------------------


def test_workbook_sheets_rows_and_styles(tmp_path):
    _export(tmp_path, onnx=False)
    wb = openpyxl.load_workbook(tmp_path / "prefill.ops.xlsx")
    assert wb.sheetnames == ["Model Config", "Fused Operators", "Raw Operator Sequence",
                             "Summary", "By Layer", "Fusion Rules"]
    rows = {ws.title: list(ws.iter_rows(values_only=True)) for ws in wb}
    # Model Config: header + phase + 3 meta keys (model, batch, seq_len) + 4 fusion rows
    # (platform, packs, nodes before, after) + 3 config keys = 12
    # Fused Operators: header + 6 raw − 3 fused + 1 = 5; Raw: header + 6 = 7;
    # Summary: header + raw + fused = 3; By Layer: header + 3 kinds = 4;
    # Fusion Rules: header + 1 fused node = 2
    assert {k: len(v) for k, v in rows.items()} == {
        "Model Config": 12, "Fused Operators": 5, "Raw Operator Sequence": 7, "Summary": 3,
        "By Layer": 4, "Fusion Rules": 2}
    columns = {"Model Config": workbook_mod.CONFIG_COLUMNS,
               "Fused Operators": workbook_mod.FUSED_COLUMNS,
               "Raw Operator Sequence": workbook_mod.RAW_COLUMNS,
               "Summary": workbook_mod.SUMMARY_COLUMNS,
               "By Layer": workbook_mod.BY_LAYER_COLUMNS,
               "Fusion Rules": workbook_mod.RULE_COLUMNS}
    for ws in wb:
        assert rows[ws.title][0] == columns[ws.title]
        header = ws["A1"]
        assert header.font.b and header.font.color.rgb.endswith(workbook_mod.HEADER_FONT)
        assert header.fill.fgColor.rgb.endswith(workbook_mod.HEADER_FILL)
        last = openpyxl.utils.get_column_letter(len(columns[ws.title]))
        assert ws.auto_filter.ref == f"A1:{last}{len(rows[ws.title])}"
        # the op lists keep id and op in view when scrolling right
        assert ws.freeze_panes == ("C2" if ws.title in ("Fused Operators",
                                   "Raw Operator Sequence", "Fusion Rules") else "A2")

    config = {(r[0], r[1]): r[2] for r in rows["Model Config"][1:]}
    assert config[("capture", "phase")] == "prefill" and config[("capture", "batch")] == 1
    assert config[("fusion", "platform")] == "generic"
    assert config[("fusion", "packs")] == "test"
    assert (config[("fusion", "nodes_before")], config[("fusion", "nodes_after")]) == (6, 4)
    assert config[("config", "rope_parameters")] == '{"rope_theta": 10000.0}'
    # the user's text stays text (no formula), less the control character a cell refuses
    assert config[("config", "note")] == "=1+1"
    note = next(r for r in wb["Model Config"].iter_rows() if r[1].value == "note")
    assert note[2].data_type == "s"  # a formula reads back as "=1+1" too, typed "f"

    summary = {r[0]: r for r in rows["Summary"][1:]}
    assert summary["raw"][1:5] == (14, 2_752, 2_720, 2_752)
    assert summary["fused"][1:5] == (8, 2_752, 2_144, 2_752)
    assert summary["raw"][5] == 0 and summary["fused"][8] is None  # gap 0; fused: no time

    by_layer = {r[0]: r[1:] for r in rows["By Layer"][1:]}
    # dense: 3 layers; ops 3·4 → 3·2; bytes 3·640 = 1,920 → 3·448 = 1,344
    assert by_layer["dense"] == (3, 12, 6, 1_728, 1_728, 1_920, 1_344)
    assert by_layer["(before layers)"] == (0, 1, 1, 0, 0, 352, 352)

    fused_ops = rows["Fused Operators"]
    col = workbook_mod.FUSED_COLUMNS.index
    assert [r[0] for r in fused_ops[1:]] == [0, 1, 6, 5]
    fused_row = fused_ops[3]
    assert fused_row[col("fusion_rule")] == "test/mul_add"
    assert fused_row[col("raw_ops")] == 3 and fused_row[col("raw_ids")] == "2,3,4"
    assert fused_row[col("runs")] == 3 and fused_row[col("bytes_read")] == 128

    raw_ops = rows["Raw Operator Sequence"]
    into = {r[0]: r[workbook_mod.RAW_COLUMNS.index("fused_into")] for r in raw_ops[1:]}
    assert into == {0: None, 1: None, 2: 6, 3: 6, 4: 6, 5: None}

    [rule] = rows["Fusion Rules"][1:]
    assert rule[:10] == ("test", "mul_add", "test kernel", 6, "fused.mul_add", 0, "dense",
                         "model.layers.0.mlp", 3, 3)
    assert rule[10] == "2,3,4"


def test_fused_graph_json_round_trip_and_provenance_file(tmp_path):
    raw, fused, result = _export(tmp_path, phases=("prefill", "decode"), onnx=False)
    for phase in ("prefill", "decode"):
        back = OpGraph.loads((tmp_path / f"{phase}.fused.graph.json").read_text())
        assert back == fused[phase]
        assert back.totals() == fused[phase].totals()
        assert OpGraph.loads((tmp_path / f"{phase}.graph.json").read_text()) == raw[phase]
    data = json.loads((tmp_path / "fusion_rules.json").read_text())
    assert (data["model"], data["platform"], data["packs"]) == ("tiny", "generic", ["test"])
    assert data["phases"]["decode"] == {"raw_nodes": 6, "fused_nodes": 4, "fusions": 1}
    assert [(f["phase"], f["pack"], f["rule"], f["fused_node"], f["raw_nodes"])
            for f in data["fusions"]] == [("prefill", "test", "mul_add", 6, [2, 3, 4]),
                                          ("decode", "test", "mul_add", 6, [2, 3, 4])]
    names = sorted(p.name for p in result.files)
    assert names == sorted([
        "fusion_rules.json", "ops.xlsx",
        *(f"{p}.{suffix}" for p in ("prefill", "decode")
          for suffix in ("graph.json", "fused.graph.json", "ops.csv", "ops.xlsx",
                         "layer-dense.dot"))])


def test_without_fused_graphs_the_fused_files_are_skipped_with_a_note(tmp_path):
    result = export_graphs(tmp_path, {"prefill": _raw()}, onnx=False)
    assert sorted(p.name for p in result.files) == [
        "ops.xlsx", "prefill.graph.json", "prefill.layer-dense.dot", "prefill.ops.csv"]
    assert "no fused graphs given" in result.notes[0]


def test_onnx_of_both_graphs(tmp_path):
    onnx = pytest.importorskip("onnx")
    _export(tmp_path, onnx=True)
    raw = onnx.load(str(tmp_path / "prefill.onnx")).graph
    fused = onnx.load(str(tmp_path / "prefill.fused.onnx")).graph
    assert len(raw.node) == 6 and len(fused.node) == 4
    node = fused.node[2]
    assert node.op_type == "fused_mul_add" and node.domain == "zrt"
    attrs = {a.name: a for a in node.attribute}
    assert attrs["fusion_rule"].s == b"test/mul_add" and attrs["fused_ops"].i == 3
    assert attrs["runs"].i == 3


# -- DOT --------------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(->|[{}\[\];,=])|("(?:[^"\\]|\\.)*")|([A-Za-z_][A-Za-z0-9_]*'
                    r'|-?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)))')


class _Dot:
    """A strict reader of the DOT language's statements (graph, attribute, node, edge and
    subgraph statements; quoted and plain IDs) — enough to prove a file well-formed and
    count what it declares, without graphviz."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text.rstrip()):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"bad DOT at {pos}: {text[pos:pos + 20]!r}")
            self.tokens.append(m.group(1) or m.group(2) or m.group(3))
            pos = m.end()
        self.i = 0
        self.nodes: dict[str, dict[str, str]] = {}
        self.edges: list[tuple[str, str]] = []
        self.clusters: dict[str, list[str]] = {}
        self.attrs: dict[str, str] = {}
        self.cluster_attrs: dict[str, dict[str, str]] = {}
        self._expect("digraph")
        if self._peek() != "{":
            self._id()
        self._block(None)
        if self.i != len(self.tokens):
            raise ValueError("text after the graph's closing brace")

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _next(self) -> str:
        if self.i >= len(self.tokens):
            raise ValueError("unexpected end of DOT")
        self.i += 1
        return self.tokens[self.i - 1]

    def _expect(self, token: str) -> None:
        got = self._next()
        if got != token:
            raise ValueError(f"expected {token!r}, got {got!r}")

    def _id(self) -> str:
        token = self._next()
        if token in "{}[];,=" or token == "->":
            raise ValueError(f"expected an ID, got {token!r}")
        return token[1:-1].replace('\\"', '"') if token.startswith('"') else token

    def _attr_list(self) -> dict[str, str]:
        out = {}
        while self._peek() == "[":
            self._next()
            while self._peek() != "]":
                key = self._id()
                self._expect("=")
                out[key] = self._id()
                if self._peek() in (",", ";"):
                    self._next()
            self._next()
        return out

    def _block(self, cluster: str | None) -> None:
        self._expect("{")
        while self._peek() != "}":
            token = self._peek()
            if token in ("graph", "node", "edge"):
                self._next()
                self._attr_list()
            elif token == "subgraph":
                self._next()
                name = self._id()
                self.clusters[name] = []
                self.cluster_attrs[name] = {}
                self._block(name)
            else:
                first = self._id()
                if self._peek() == "=":
                    self._next()
                    scope = self.attrs if cluster is None else self.cluster_attrs[cluster]
                    scope[first] = self._id()
                else:
                    chain = [first]
                    while self._peek() == "->":
                        self._next()
                        chain.append(self._id())
                    attrs = self._attr_list()
                    if len(chain) == 1:
                        if first in self.nodes:
                            raise ValueError(f"node {first} declared twice")
                        self.nodes[first] = attrs
                        if cluster is not None:
                            self.clusters[cluster].append(first)
                    else:
                        self.edges.extend(itertools.pairwise(chain))
            if self._peek() == ";":
                self._next()
        self._next()


def test_layer_dot_is_valid_and_counts_the_layer(tmp_path):
    raw = _raw()
    fused = fuse(raw, [PACK])
    assert layers_by_kind(raw) == {"dense": 0}
    dot = _Dot(layer_dot(raw, 0, records=fusion_records(raw, fused)))
    # the layer's 4 ops and the two outside pseudo-nodes
    assert sorted(dot.nodes) == sorted(["n1", "n2", "n3", "n4", OUTSIDE_IN, OUTSIDE_OUT])
    # inside: 1→2, 2→3, 3→4; from outside: the embedding feeds n1 and n4; n4 feeds the head
    assert sorted(dot.edges) == sorted([("n1", "n2"), ("n2", "n3"), ("n3", "n4"),
                                        (OUTSIDE_IN, "n1"), (OUTSIDE_IN, "n4"),
                                        ("n4", OUTSIDE_OUT)])
    assert dot.clusters == {"cluster_f6": ["n2", "n3", "n4"]}
    assert dot.nodes["n3"]["label"] == "#3 mul.Tensor\\nmlp\\n32 FLOPs"
    assert all(a in dot.nodes and b in dot.nodes for a, b in dot.edges)
    assert dot.attrs["label"] == "prefill layer 0 (dense) · 4 ops"
    assert dot.cluster_attrs["cluster_f6"]["label"] == "test/mul_add → fused.mul_add #6"


def test_dot_reader_rejects_malformed_text():
    with pytest.raises(ValueError):
        _Dot('digraph "g" { n1 -> ; }')
    with pytest.raises(ValueError):
        _Dot('digraph "g" { n1 [label="x"]; ')
    with pytest.raises(ValueError):
        _Dot('digraph "g" { n1 [label="a \\" b"]; n1 [label=x]; }')


# -- the output directory ---------------------------------------------------------------


def test_out_that_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="is a file, not a directory"):
        prepare_out_dir(blocker)
    with pytest.raises(ExportError, match="cannot create or write the output directory"):
        prepare_out_dir(blocker / "sub")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_out_that_cannot_be_written():
    # /proc refuses new directories even to root
    with pytest.raises(ExportError, match="cannot create or write the output directory"):
        prepare_out_dir("/proc/zrt-capture-out")


# -- the command ------------------------------------------------------------------------

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "tie_word_embeddings": False}


def _config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    return d


@pytest.mark.parametrize("bad", ["file", "file/sub", "/proc/zrt-capture-out"])
def test_bad_out_is_one_line_before_capturing(tmp_path, capsys, bad):
    (tmp_path / "file").write_text("x")
    out = bad if bad.startswith("/") else str(tmp_path / bad)
    assert main(["capture", str(_config_dir(tmp_path)), "--seq-len", "8", "--out", out]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("zrt: error: ") and captured.err.count("\n") == 1
    assert out in captured.err and captured.out == ""  # nothing captured nor printed


@pytest.mark.needs("zrt-fusion-rules")  # the fused graphs use the installed rule packs
@pytest.mark.parametrize("platform", ["cuda", "generic"])
def test_capture_out_writes_every_file_consistently(tmp_path, capsys, platform):
    out = tmp_path / "out"
    assert main(["capture", str(_config_dir(tmp_path)), "--seq-len", "8", "--phases",
                 "prefill,train_backward", "--platform", platform, "--out", str(out)]) == 0
    data = json.loads((out / "fusion_rules.json").read_text())
    assert data["platform"] == platform
    assert data["packs"] == (["cuda", "generic"] if platform == "cuda" else ["generic"])
    for phase in ("prefill", "train_backward"):
        raw = OpGraph.loads((out / f"{phase}.graph.json").read_text())
        fused = OpGraph.loads((out / f"{phase}.fused.graph.json").read_text())
        # fusion keeps the FLOPs and removes nodes and bytes
        assert fused.totals().flops == raw.totals().flops
        assert len(fused.nodes) < len(raw.nodes) and fused.totals().bytes < raw.totals().bytes
        made = [n for n in fused.nodes if n.fused_from]
        mine = [f for f in data["fusions"] if f["phase"] == phase]
        assert [f["fused_node"] for f in mine] == [n.id for n in made]
        assert {f"{f['pack']}/{f['rule']}" for f in mine} <= \
            {f"{p}/{r}" for p, r in (k.split("/") for k in fused.meta["fusion"]["fused"])}
        raw_ids = [i for f in mine for i in f["raw_nodes"]]
        assert len(raw_ids) == len(set(raw_ids)) and set(raw_ids) <= {n.id for n in raw.nodes}
        # every raw node is either kept in the fused graph or inside exactly one fused node
        kept = {n.id for n in fused.nodes if not n.fused_from}
        assert kept | set(raw_ids) == {n.id for n in raw.nodes} and not kept & set(raw_ids)

        wb = openpyxl.load_workbook(out / f"{phase}.ops.xlsx", read_only=True)
        lengths = {ws.title: sum(1 for _ in ws.iter_rows()) for ws in wb}
        assert lengths["Fused Operators"] == 1 + len(fused.nodes)
        assert lengths["Raw Operator Sequence"] == 1 + len(raw.nodes)
        assert lengths["Fusion Rules"] == 1 + len(made)
        assert lengths["By Layer"] == 1 + 3  # before the layers, dense, after the layers

        dot = _Dot((out / f"{phase}.layer-dense.dot").read_text())
        layer = [n for n in raw.nodes if n.layer_index == 0]
        assert len(dot.nodes) == len(layer) + 2  # and the two outside pseudo-nodes
        inner = {(a, b) for a, b in raw.edges
                 if {a, b} <= {n.id for n in layer}}
        assert len([e for e in dot.edges if OUTSIDE_IN not in e and OUTSIDE_OUT not in e]) \
            == len(inner)
        in_layer = [f for f in mine if f["layer_index"] == 0]
        assert len(dot.clusters) == len(in_layer) > 0
    assert f"to {out}" in capsys.readouterr().out
