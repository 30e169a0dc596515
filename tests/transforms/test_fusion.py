"""The fusion engine: rule packs from YAML, matching inside module scopes, fused nodes with
boundary bytes, on hand-built graphs and on small captured llama / gpt2 / qwen3-moe graphs.

Byte counts are exact; each assertion carries its arithmetic (bf16 = 2 bytes, fp32 = 4,
int64 = 8).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from zrt_core.errors import SpecError
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode, TensorMeta
from zrt_core.transforms import fusion
from zrt_core.transforms.fusion import (
    Fusion,
    FusionRule,
    FusionRulePack,
    OpToken,
    fuse,
    packs_for_platform,
)

# -- building graphs by hand ----------------------------------------------------------------


def t(tid: int | None, shape: tuple[int, ...] = (4, 8), dtype: str = "bfloat16", *,
      param: str | None = None, view: bool = False) -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, is_view=view, tensor_id=tid, param=param)


class Builder:
    """Nodes in execution order; edges follow tensor ids; bytes as the default formula
    (every input read, every non-view output written); FLOPs = output elements."""

    def __init__(self, phase: str = "prefill") -> None:
        self.phase = phase
        self.nodes: list[OpNode] = []
        self.edges: list[tuple[int, int]] = []
        self.writer: dict[int, int] = {}

    def op(self, op: str, category: str, inputs: list[TensorMeta], outputs: list[TensorMeta],
           path: str, cls: str, *, layer: int | None = 0, view: bool = False,
           attrs: dict[str, Any] | None = None) -> int:
        nid = len(self.nodes)
        read = 0 if view else sum(x.nbytes for x in inputs)
        written = 0 if view else sum(x.nbytes for x in outputs if not x.is_view)
        flops = 0 if view else sum(x.numel for x in outputs)
        self.nodes.append(OpNode(
            id=nid, op=op, category=category, phase=self.phase, inputs=inputs,
            outputs=outputs, module_path=path, module_class=cls, layer_index=layer,
            layer_kind=None if layer is None else "dense", flops=flops, bytes_read=read,
            bytes_written=written, formula=None if view else "test", zero_cost=view,
            attrs=attrs or {}))
        for x in inputs:
            if x.tensor_id in self.writer:
                self.edges.append((self.writer[x.tensor_id], nid))
        for x in outputs:
            if x.tensor_id is not None:
                self.writer[x.tensor_id] = nid
        return nid

    def graph(self, layers: tuple[int, ...] = (0,)) -> OpGraph:
        templates = [LayerTemplate("dense", i, (i,)) for i in layers]
        return OpGraph(phase=self.phase, nodes=self.nodes, edges=self.edges,
                       templates=templates)


def pack(yaml_text: str, tmp_path: Path, name: str = "test.yaml") -> FusionRulePack:
    path = tmp_path / name
    path.write_text(textwrap.dedent(yaml_text))
    return FusionRulePack.from_yaml(path)


def by_rule(graph: OpGraph, rule: str) -> list[OpNode]:
    return [n for n in graph.nodes if n.attrs.get("fusion_rule") == rule]


def assert_valid(graph: OpGraph) -> None:
    """Unique ids, every edge between present nodes and pointing forward."""
    position = {n.id: i for i, n in enumerate(graph.nodes)}
    assert len(position) == len(graph.nodes)
    for a, b in graph.edges:
        assert position[a] < position[b], (a, b)


RMS_NORM_PACK = """\
    name: test
    platform: cuda
    rules:
      - name: rms_norm
        scope: {module_class: "*RMSNorm"}
        phases: [forward]
        match: connected
        ops: [aten._to_copy, aten.pow, aten.mean, aten.rsqrt, aten.mul]
        requires: [aten.mean, aten.rsqrt]
        op: fused.rms_norm
        category: norm
        kernel: test_rms_norm
"""


def rms_norm_graph(b: Builder, first_tensor: int, layer: int = 0) -> None:
    """HF's RMSNorm on x [4, 8] bf16 in ``model.layers.<layer>``, then a consumer outside.

    Tensor ids from ``first_tensor``: x, x32, x², mean, rstd, x·rstd, bf16, y, detach.
    """
    k = first_tensor
    norm = f"model.layers.{layer}.input_layernorm"
    b.op("aten.embedding.default", "embedding", [t(k + 20, (16, 8), param="emb"),
                                                  t(k + 21, (4,), "int64")],
         [t(k)], "model.embed_tokens", "Embedding", layer=None)
    b.op("aten._to_copy.default", "copy", [t(k)], [t(k + 1, dtype="float32")], norm,
         "LlamaRMSNorm", layer=layer)
    b.op("aten.pow.Tensor_Scalar", "elementwise", [t(k + 1, dtype="float32")],
         [t(k + 2, dtype="float32")], norm, "LlamaRMSNorm", layer=layer)
    b.op("aten.mean.dim", "reduction", [t(k + 2, dtype="float32")],
         [t(k + 3, (4, 1), "float32")], norm, "LlamaRMSNorm", layer=layer)
    b.op("aten.rsqrt.default", "elementwise", [t(k + 3, (4, 1), "float32")],
         [t(k + 4, (4, 1), "float32")], norm, "LlamaRMSNorm", layer=layer)
    b.op("aten.detach.default", "view", [t(k + 4, (4, 1), "float32")],
         [t(k + 8, (4, 1), "float32", view=True)], norm, "LlamaRMSNorm", layer=layer,
         view=True)
    b.op("aten.mul.Tensor", "elementwise", [t(k + 1, dtype="float32"),
                                            t(k + 4, (4, 1), "float32")],
         [t(k + 5, dtype="float32")], norm, "LlamaRMSNorm", layer=layer)
    b.op("aten._to_copy.default", "copy", [t(k + 5, dtype="float32")], [t(k + 6)], norm,
         "LlamaRMSNorm", layer=layer)
    b.op("aten.mul.Tensor", "elementwise", [t(k + 22, (8,), param="norm.weight"), t(k + 6)],
         [t(k + 7)], norm, "LlamaRMSNorm", layer=layer)
    b.op("aten.mm.default", "matmul", [t(k + 7), t(k + 23, (8, 8), param="q.weight")],
         [t(k + 9)], f"model.layers.{layer}.self_attn.q_proj", "Linear", layer=layer)


# -- hand-built graphs ------------------------------------------------------------------------


def test_connected_rms_norm_fuses_with_boundary_bytes(tmp_path):
    b = Builder()
    rms_norm_graph(b, 0)
    g = b.graph()
    out = fuse(g, [pack(RMS_NORM_PACK, tmp_path)])
    (fused,) = by_rule(out, "test/rms_norm")
    # the seven norm ops and the detach autograd keeps of rstd (a sink hanging off a member)
    assert [n.id for n in fused.fused_from] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert fused.id == 10  # fresh: one above the largest id (9)
    assert [n.id for n in out.nodes] == [0, 10, 9]
    assert out.edges == ((0, 10), (10, 9))
    assert fused.op == "fused.rms_norm" and fused.category == "norm"
    assert fused.module_path == "model.layers.0.input_layernorm"
    assert fused.module_class == "LlamaRMSNorm" and fused.layer_index == 0
    assert fused.attrs["fusion_rule"] == "test/rms_norm"
    assert fused.attrs["kernel"] == "test_rms_norm"
    assert fused.flops == sum(n.flops for n in g.nodes[1:9])
    # read: x 4·8·2 = 64, weight 8·2 = 16 → 80 (unfused the members read 688)
    assert fused.bytes_read == 80
    # written: y 4·8·2 = 64, rstd 4·1·4 = 16 (kept for backward through the detach) → 80
    assert fused.bytes_written == 80
    assert [x.tensor_id for x in fused.inputs] == [0, 22]
    assert [x.tensor_id for x in fused.outputs] == [4, 7]
    assert out.meta["fusion"]["fused"] == {"test/rms_norm": 1}
    assert out.meta["fusion"]["nodes_before"] == 10 and out.meta["fusion"]["nodes_after"] == 3
    assert_valid(out)


def test_fusing_twice_changes_nothing(tmp_path):
    b = Builder()
    rms_norm_graph(b, 0)
    packs = [pack(RMS_NORM_PACK, tmp_path)]
    once = fuse(b.graph(), packs)
    assert fuse(once, packs) is once


def test_a_graph_nothing_matches_is_returned_as_is(tmp_path):
    b = Builder()
    rms_norm_graph(b, 0)
    g = b.graph()
    backward_only = pack(RMS_NORM_PACK.replace("[forward]", "[backward]"), tmp_path)
    assert fuse(g, [backward_only]) is g


def test_requires_keeps_a_partial_pattern_unfused(tmp_path):
    b = Builder()
    rms_norm_graph(b, 0)
    g = b.graph()
    needs_erf = pack(RMS_NORM_PACK.replace("[aten.mean, aten.rsqrt]", "[aten.erf]"), tmp_path)
    assert fuse(g, [needs_erf]) is g


ROPE_PACK = """\
    name: test
    platform: cuda
    rules:
      - name: rope
        scope: {module_class: "*Attention"}
        match: sequence
        ops: [aten.mul, aten.neg, aten.cat, aten.mul, aten.add]
        op: fused.rotary_embedding
        category: elementwise
        kernel: test_rope
"""


def rope(b: Builder, x: int, cos: int, sin: int, k: int) -> None:
    """x·cos + cat(−x[16:], x[:16])·sin on x [2, 32] in one attention module."""
    attn = ("model.layers.0.self_attn", "LlamaAttention")
    b.op("aten.mul.Tensor", "elementwise", [t(x, (2, 32)), t(cos, (1, 32))],
         [t(k, (2, 32))], *attn)
    b.op("aten.slice.Tensor", "view", [t(x, (2, 32))], [t(k + 1, (2, 16), view=True)], *attn,
         view=True)
    b.op("aten.slice.Tensor", "view", [t(x, (2, 32))], [t(k + 2, (2, 16), view=True)], *attn,
         view=True)
    b.op("aten.neg.default", "elementwise", [t(k + 2, (2, 16))], [t(k + 3, (2, 16))], *attn)
    b.op("aten.cat.default", "copy", [t(k + 3, (2, 16)), t(k + 1, (2, 16))],
         [t(k + 4, (2, 32))], *attn)
    b.op("aten.mul.Tensor", "elementwise", [t(k + 4, (2, 32)), t(sin, (1, 32))],
         [t(k + 5, (2, 32))], *attn)
    b.op("aten.add.Tensor", "elementwise", [t(k, (2, 32)), t(k + 5, (2, 32))],
         [t(k + 6, (2, 32))], *attn)


def rope_graph(shared_cos: bool = True) -> Builder:
    """q and k projections (nodes 0, 1), RoPE on q (2-8) and on k (9-15), attention (16)."""
    b = Builder()
    attn = ("model.layers.0.self_attn", "LlamaAttention")
    b.op("aten.mm.default", "matmul", [t(1, (2, 8)), t(2, (8, 32), param="q.weight")],
         [t(4, (2, 32))], "model.layers.0.self_attn.q_proj", "Linear")
    b.op("aten.mm.default", "matmul", [t(1, (2, 8)), t(3, (8, 32), param="k.weight")],
         [t(5, (2, 32))], "model.layers.0.self_attn.k_proj", "Linear")
    rope(b, 4, 90, 91, 10)
    rope(b, 5, 90 if shared_cos else 92, 91 if shared_cos else 93, 20)
    b.op("zrt.attention.default", "attention", [t(16, (2, 32)), t(26, (2, 32))],
         [t(30, (2, 32))], *attn)
    return b


def test_sequence_matches_each_run_once_and_absorbs_the_views(tmp_path):
    g = rope_graph().graph()
    out = fuse(g, [pack(ROPE_PACK, tmp_path)])
    q, k = by_rule(out, "test/rope")
    # members: mul, slice, slice, neg, cat, mul, add (nodes 2-8 and 9-15)
    assert [n.id for n in q.fused_from] == [2, 3, 4, 5, 6, 7, 8]
    assert [n.id for n in k.fused_from] == [9, 10, 11, 12, 13, 14, 15]
    # read: q 2·32·2 = 128 (the mul reads it whole, the slices its halves: read once),
    # cos and sin 1·32·2 = 64 each → 256; written: the sum 2·32·2 = 128
    assert (q.bytes_read, q.bytes_written) == (256, 128)
    assert q.flops == sum(n.flops for n in g.nodes[2:9])
    assert [n.op for n in out.nodes] == ["aten.mm.default", "aten.mm.default",
                                          "fused.rotary_embedding", "fused.rotary_embedding",
                                          "zrt.attention.default"]
    assert_valid(out)


def test_sequence_tokens_take_quantifiers_and_check_dataflow(tmp_path):
    # q and k share nothing here, so a run from q's ops into k's is not one region: the
    # greedy match backs off to the longest run that is connected
    g = rope_graph(shared_cos=False).graph()
    greedy = pack("""\
        name: test
        platform: generic
        rules:
          - name: chain
            scope: {module_class: "*Attention"}
            match: sequence
            ops: ["aten.mul", "aten.neg?", "aten.cat|aten.add", "category:elementwise*"]
            min_ops: 3
            op: fused.chain
            category: elementwise
            kernel: test_chain
    """, tmp_path)
    out = fuse(g, [greedy])
    first, second = by_rule(out, "test/chain")
    assert [n.id for n in first.fused_from if not n.zero_cost] == [2, 5, 6, 7, 8]
    assert [n.id for n in second.fused_from if not n.zero_cost] == [9, 12, 13, 14, 15]
    shared = fuse(rope_graph(shared_cos=True).graph(), [greedy])
    # with cos shared, q's ops and k's mul and neg read common tensors: one greedy run of 7
    (joined,) = by_rule(shared, "test/chain")
    assert [n.id for n in joined.fused_from if not n.zero_cost] == [2, 5, 6, 7, 8, 9, 12]


ATTENTION_PACK = """\
    name: test
    platform: cuda
    rules:
      - name: attention_kvcache
        scope: {module_class: "*Attention"}
        phases: [decode]
        match: sequence
        ops: [aten.cat, aten.cat, zrt.attention]
        anchor: zrt.attention
        category: attention
        kernel: flash_attn_with_kvcache
"""


def test_an_anchor_keeps_its_op_attrs_and_input_order(tmp_path):
    b = Builder("decode")
    attn = ("model.layers.0.self_attn", "LlamaAttention")
    # cache [1, 2, 16, 8] and one new row per KV head, query [1, 4, 1, 8], all bf16
    b.op("aten.cat.default", "copy", [t(1, (1, 2, 16, 8)), t(2, (1, 2, 1, 8))],
         [t(3, (1, 2, 17, 8))], *attn)
    b.op("aten.cat.default", "copy", [t(4, (1, 2, 16, 8)), t(5, (1, 2, 1, 8))],
         [t(6, (1, 2, 17, 8))], *attn)
    b.op("zrt.attention.default", "attention",
         [t(7, (1, 4, 1, 8)), t(3, (1, 2, 17, 8)), t(6, (1, 2, 17, 8))],
         [t(8, (1, 1, 4, 8)), t(9, (1, 4, 1), "float32")], *attn,
         attrs={"is_causal": True, "scale": 0.35})
    out = fuse(b.graph(), [pack(ATTENTION_PACK, tmp_path)])
    (fused,) = out.nodes
    assert fused.op == "zrt.attention.default" and fused.category == "attention"
    assert fused.attrs["is_causal"] is True and fused.attrs["scale"] == 0.35
    assert fused.attrs["kernel"] == "flash_attn_with_kvcache"
    # q, K, V as the attention sees them (K and V exist only inside: no tensor id), then
    # what the region reads from outside
    assert [(x.shape, x.tensor_id) for x in fused.inputs] == [
        ((1, 4, 1, 8), 7), ((1, 2, 17, 8), None), ((1, 2, 17, 8), None),
        ((1, 2, 16, 8), 1), ((1, 2, 1, 8), 2), ((1, 2, 16, 8), 4), ((1, 2, 1, 8), 5)]
    # read: cache 2 × 2·16·8·2 = 1024, new rows 2 × 2·1·8·2 = 64, q 4·8·2 = 64 → 1152
    # (unfused: the cats read 1088 and rewrite 1088, attention reads 1152)
    assert fused.bytes_read == 1152
    # written: out 4·8·2 = 64, lse 4·4 = 16 → 80
    assert fused.bytes_written == 80


def test_backward_ops_fuse_under_the_forward_module_and_keep_sequence_numbers(tmp_path):
    b = Builder("train_backward")
    norm = ("model.norm", "LlamaRMSNorm")
    # dy [4, 8] bf16 from outside; saved x (bf16) and rstd [4, 1] fp32 from the forward
    b.op("aten.mm.default", "matmul", [t(1, (4, 8)), t(2, (8, 8), param="head.weight")],
         [t(3)], "lm_head", "Linear", layer=None)
    b.op("aten.mul.Tensor", "elementwise", [t(3), t(4, (8,), param="norm.weight")], [t(5)],
         *norm, layer=None, attrs={"fwd_seq_nr": 9})
    b.op("aten.mul.Tensor", "elementwise", [t(3), t(50)], [t(6)], *norm, layer=None,
         attrs={"fwd_seq_nr": 9})
    b.op("aten.sum.dim_IntList", "reduction", [t(6)], [t(7, (1, 8))], *norm, layer=None,
         attrs={"fwd_seq_nr": 9})
    b.op("aten.view.default", "view", [t(7, (1, 8))], [t(8, (8,), view=True)], *norm,
         layer=None, view=True)
    b.op("aten.detach.default", "view", [t(8, (8,))], [t(9, (8,), view=True)], "model.norm",
         "AccumulateGrad", layer=None, view=True)
    b.op("aten.mul.Tensor", "elementwise", [t(5), t(51, (4, 1), "float32")],
         [t(10, dtype="float32")], *norm, layer=None, attrs={"fwd_seq_nr": 7})
    b.op("aten._to_copy.default", "copy", [t(10, dtype="float32")], [t(11)], *norm,
         layer=None, attrs={"fwd_seq_nr": 6})
    b.op("aten.mm.default", "matmul", [t(11), t(12, (8, 8), param="w")], [t(13)],
         "model.layers.0.mlp.down_proj", "Linear")
    packs = [pack("""\
        name: test
        platform: cuda
        rules:
          - name: rms_norm_backward
            scope: {module_class: "*RMSNorm"}
            phases: [backward]
            match: connected
            ops: [category:elementwise, aten.sum, aten._to_copy]
            requires: [aten.sum]
            op: fused.rms_norm_backward
            category: norm
            kernel: test_rms_norm_bwd
    """, tmp_path)]
    out = fuse(b.graph(), packs)
    (fused,) = by_rule(out, "test/rms_norm_backward")
    # the weight gradient's view and AccumulateGrad's detach hang off the sum: absorbed
    assert [n.id for n in fused.fused_from] == [1, 2, 3, 4, 5, 6, 7]
    assert fused.module_class == "LlamaRMSNorm"
    assert fused.attrs["fwd_seq_nr"] == 6 and fused.attrs["fwd_seq_nrs"] == (6, 7, 9)
    # read: dy 4·8·2 = 64, weight 8·2 = 16, saved x 64, rstd 4·1·4 = 16 → 160
    assert fused.bytes_read == 160
    # written: dx 4·8·2 = 64, dweight 1·8·2 = 16 (read by nothing here: a result) → 80
    assert fused.bytes_written == 80
    assert [n.id for n in out.nodes] == [0, 9, 8]
    forward_only = [pack(RMS_NORM_PACK, tmp_path, "fwd.yaml")]
    assert fuse(b.graph(), forward_only).nodes == b.graph().nodes


def test_a_region_that_would_wrap_an_outside_op_is_not_fused(tmp_path):
    b = Builder()
    norm = ("model.layers.0.norm", "LlamaRMSNorm")
    b.op("aten.mul.Tensor", "elementwise", [t(1)], [t(2)], *norm)
    # an op of another module between two of the norm's ops: fusing them would need the
    # fused node both before and after it
    b.op("aten.neg.default", "elementwise", [t(2)], [t(3)], "model.layers.0.other", "Other")
    b.op("aten.add.Tensor", "elementwise", [t(2), t(3)], [t(4)], *norm)
    g = b.graph()
    packs = [pack("""\
        name: test
        platform: generic
        rules:
          - name: pointwise
            scope: {module_class: "*RMSNorm"}
            phases: [all]
            match: connected
            ops: [category:elementwise]
            min_ops: 2
            op: fused.pointwise
            category: elementwise
            kernel: test
    """, tmp_path)]
    assert fuse(g, packs) is g


def test_a_rule_can_fuse_an_earlier_rules_node_and_keeps_the_original_ops(tmp_path):
    b = Builder()
    # the residual add feeding the norm (node 0, in the decoder layer's own scope)
    b.op("aten.add.Tensor", "elementwise", [t(30), t(31)], [t(0)], "model.layers.0",
         "LlamaDecoderLayer")
    rms_norm_graph(b, 0)
    del b.nodes[1]  # rms_norm_graph's embedding: the add produces x instead
    b.nodes = [n if i == 0 else OpNode(**{**n.to_json(), "id": i, "inputs": n.inputs,
                                          "outputs": n.outputs, "attrs": n.attrs})
               for i, n in enumerate(b.nodes)]
    b.edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (1, 6), (4, 6), (6, 7), (7, 8),
               (8, 9)]
    # the next residual add reads the sum again
    b.writer = {0: 0, 9: 9}
    b.op("aten.add.Tensor", "elementwise", [t(0), t(9)], [t(12)], "model.layers.0",
         "LlamaDecoderLayer")
    composite = pack(RMS_NORM_PACK + """\
      - name: add_rms_norm
        scope: {module_class: "*DecoderLayer", descendants: true}
        phases: [inference]
        match: sequence
        ops: [aten.add, fused.rms_norm]
        op: fused.add_rms_norm
        category: norm
        kernel: test_add_rms_norm
    """, tmp_path)
    g = b.graph()
    assert [n.op.split(".")[1] for n in g.nodes] == [
        "add", "_to_copy", "pow", "mean", "rsqrt", "detach", "mul", "_to_copy", "mul", "mm",
        "add"]
    out = fuse(g, [composite])
    (fused,) = by_rule(out, "test/add_rms_norm")
    assert [n.id for n in fused.fused_from] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert not by_rule(out, "test/rms_norm")
    assert out.meta["fusion"]["fused"] == {"test/add_rms_norm": 1}
    # read: two addends 2 × 4·8·2 = 128, weight 16 → 144; written: the sum (read again by
    # the next residual add) 64, y 64, rstd 16 → 144
    assert (fused.bytes_read, fused.bytes_written) == (144, 144)
    assert [n.id for n in out.nodes] == [11, 9, 10]
    assert_valid(out)


def test_regions_stay_inside_one_layer(tmp_path):
    b = Builder()
    b.op("aten.mul.Tensor", "elementwise", [t(1)], [t(2)], "model.norm", "LlamaRMSNorm",
         layer=0)
    b.op("aten.mul.Tensor", "elementwise", [t(2)], [t(3)], "model.norm", "LlamaRMSNorm",
         layer=1)
    g = b.graph(layers=(0, 1))
    packs = [pack("""\
        name: test
        platform: generic
        rules:
          - name: pointwise
            scope: {module_class: "*RMSNorm"}
            match: connected
            ops: [aten.mul]
            min_ops: 2
            op: fused.pointwise
            category: elementwise
            kernel: test
    """, tmp_path)]
    assert fuse(g, packs) is g


def layered_graph(layers: int, odd_layer: int | None = None) -> OpGraph:
    b = Builder()
    for layer in range(layers):
        rms_norm_graph(b, 100 * layer, layer)
        if layer == odd_layer:  # one more op in this layer's norm: a different signature
            norm = f"model.layers.{layer}.input_layernorm"
            b.op("aten.neg.default", "elementwise", [t(100 * layer + 9)],
                 [t(100 * layer + 10)], norm, "LlamaRMSNorm", layer=layer)
    return b.graph(layers=tuple(range(layers)))


@pytest.mark.parametrize("odd_layer", [None, 2])
def test_layers_matched_once_give_the_graph_matching_every_layer_gives(tmp_path, odd_layer):
    g = layered_graph(4, odd_layer)
    packs = [pack(RMS_NORM_PACK, tmp_path)]
    engine = fusion._Engine(g)
    engine.plan_replicas()
    # layer 0 is matched; the identical layers copy its fusions
    assert sorted(engine.replica_of) == ([1, 3] if odd_layer == 2 else [1, 2, 3])
    replicated = fuse(g, packs)
    every_layer = fusion._Engine(g)
    for rule in packs[0].rules:
        every_layer.apply_rule(packs[0], rule)
    assert replicated == every_layer.result(["test"])
    fused = by_rule(replicated, "test/rms_norm")
    assert [n.module_path for n in fused] == [f"model.layers.{i}.input_layernorm"
                                              for i in range(4)]
    assert {(n.bytes_read, n.bytes_written) for n in fused} == {(80, 80)}


def test_two_regions_that_would_feed_each_other_are_not_both_fused(tmp_path):
    b = Builder()
    a_scope, b_scope = ("m.a", "ANorm"), ("m.b", "BNorm")
    b.op("aten.mul.Tensor", "elementwise", [t(1)], [t(2)], *a_scope)   # a1
    b.op("aten.mul.Tensor", "elementwise", [t(9)], [t(3)], *b_scope)   # b1
    b.op("aten.add.Tensor", "elementwise", [t(1), t(3)], [t(4)], *a_scope)  # a2 ← b1
    b.op("aten.add.Tensor", "elementwise", [t(9), t(2)], [t(5)], *b_scope)  # b2 ← a1
    g = b.graph()
    packs = [pack("""\
        name: test
        platform: generic
        rules:
          - name: pointwise
            scope: {module_class: "*Norm"}
            match: connected
            ops: [category:elementwise]
            min_ops: 2
            op: fused.pointwise
            category: elementwise
            kernel: test
    """, tmp_path)]
    out = fuse(g, packs)
    # {a1, a2} fuse first; {b1, b2} would then be a cycle with it
    (fused,) = by_rule(out, "test/pointwise")
    assert [n.id for n in fused.fused_from] == [0, 2]
    assert [n.id for n in out.nodes] == [1, 4, 3]
    assert_valid(out)


# -- rule files ---------------------------------------------------------------------------


GOOD_RULE = {
    "name": "r", "scope": {"module_class": "*Norm"}, "match": "sequence",
    "ops": ["aten.mul"], "op": "fused.x", "category": "norm", "kernel": "k",
}


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, "test.yaml: rules[0]: unknown key 'colour'"),
    ({"category": "normal"}, "test.yaml: rules[0].category: unknown category 'normal'"),
    ({"ops": ["mul"]}, "test.yaml: rules[0].ops[0]: 'mul' in 'mul' is not an op name"),
    ({"ops": ["category:shiny"]}, "test.yaml: rules[0].ops[0]: unknown category 'shiny'"),
    ({"ops": []}, "test.yaml: rules[0].ops is required"),
    ({"ops": ["aten.mul?"]}, "test.yaml: rules[0].ops can match nothing"),
    ({"match": "connected", "ops": ["aten.mul+"]},
     "test.yaml: rules[0].ops[0]: 'aten.mul+' has a quantifier '+'"),
    ({"match": "fuzzy"}, "test.yaml: rules[0].match must be one of sequence, connected"),
    ({"phases": ["warmup"]}, "test.yaml: rules[0].phases: unknown phase 'warmup'"),
    ({"scope": {}}, "test.yaml: rules[0].scope needs module_class or module_path"),
    ({"scope": {"module_class": "*Norm", "descendants": "yes"}},
     "test.yaml: rules[0].scope.descendants must be true or false"),
    ({"op": None}, "test.yaml: rules[0].op is required (or an anchor whose op is kept)"),
    ({"op": "fused"}, "test.yaml: rules[0].op must look like namespace.name"),
    ({"kernel": None}, "test.yaml: rules[0].kernel is required"),
    ({"requires": ["aten.mul"]}, "test.yaml: rules[0].requires applies to match: connected"),
    ({"min_ops": 0}, "test.yaml: rules[0].min_ops must be > 0"),
])
def test_a_bad_rule_is_one_line_naming_file_and_field(tmp_path, change, message):
    import yaml

    rule = {**GOOD_RULE, **change}
    rule = {k: v for k, v in rule.items() if v is not None}
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "platform": "cuda", "rules": [rule]}))
    with pytest.raises(SpecError) as err:
        FusionRulePack.from_yaml(path)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("name: t\nplatform: tpu\nrules: []\n", "test.yaml: platform: unknown platform 'tpu'"),
    ("name: t\nplatform: cuda\nrules: {}\n", "test.yaml: rules must be a list"),
    ("platform: cuda\nrules: []\n", "test.yaml: name is required"),
    ("name: t\nplatform: cuda\nrules:\n  - {name: r, scope: {module_class: x}, ops: [a.b],"
     " op: f.x, category: norm, kernel: k}\n  - {name: r, scope: {module_class: x},"
     " ops: [a.b], op: f.x, category: norm, kernel: k}\n",
     "test.yaml: rules[1].name 'r' is also rules[0]"),
    ("name: t\nplatform: cuda\nrules: [\n", "is not valid YAML"),
])
def test_a_bad_pack_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "test.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        FusionRulePack.from_yaml(path)
    assert message in str(err.value)
    assert "test.yaml" in str(err.value) and "\n" not in str(err.value)


def test_op_tokens_match_overloads_categories_and_fused_ops_by_exact_name():
    token = OpToken.parse("aten.mul|category:reduction", "where", quantifiers=False)
    assert token.matches("aten.mul.Tensor", "elementwise", fused=False)
    assert token.matches("aten.sum.dim_IntList", "reduction", fused=False)
    assert not token.matches("aten.mul_.Tensor", "elementwise", fused=False)
    assert not token.matches("fused.norm", "reduction", fused=True)  # categories: unfused only
    exact = OpToken.parse("fused.rms_norm", "where", quantifiers=False)
    assert exact.matches("fused.rms_norm", "norm", fused=True)
    assert not OpToken.parse("zrt.attention", "w", quantifiers=False).matches(
        "zrt.attention.default", "attention", fused=True)


def test_platform_packs_run_before_generic_ones_by_priority():
    def mk(name: str, platform: str, priority: int = 0) -> FusionRulePack:
        return FusionRulePack(name=name, platform=platform, priority=priority)

    packs = [mk("generic", "generic"), mk("cuda", "cuda"), mk("ascend", "ascend"),
             mk("deepseek-cuda", "cuda", priority=10), mk("extra", "generic")]
    assert [p.name for p in packs_for_platform("cuda", packs)] == \
        ["deepseek-cuda", "cuda", "extra", "generic"]
    assert [p.name for p in packs_for_platform("ascend", packs)] == \
        ["ascend", "extra", "generic"]
    assert [p.name for p in packs_for_platform("generic", packs)] == ["extra", "generic"]
    with pytest.raises(SpecError, match="unknown fusion platform 'rocm'"):
        packs_for_platform("rocm", packs)


def test_the_transform_takes_the_hosts_packs_for_the_hardware_platform(
        tmp_path, register_plugin):
    from types import SimpleNamespace

    from zrt_core.plugins import hookimpl
    from zrt_core.transforms.base import TransformContext, apply_all

    cuda = pack(RMS_NORM_PACK, tmp_path)
    other = FusionRulePack(name="npu", platform="ascend", rules=[
        FusionRule.from_mapping({**GOOD_RULE, "scope": {"module_class": "*RMSNorm"},
                                 "ops": ["aten.mean"]}, "inline")])

    class Plugin:
        @hookimpl
        def zrt_fusion_rules(self):
            return [cuda, other]

    host = register_plugin(Plugin(), "test-fusion")
    b = Builder()
    rms_norm_graph(b, 0)
    g = b.graph()

    def ctx(vendor: str) -> TransformContext:
        return TransformContext(dims=None, hardware=SimpleNamespace(vendor=vendor),
                                parallel=None, host=host)  # type: ignore[arg-type]

    on_gpu = apply_all(g, [Fusion()], ctx("NVIDIA"))
    assert [n.op for n in on_gpu.nodes] == ["aten.embedding.default", "fused.rms_norm",
                                             "aten.mm.default"]
    assert on_gpu.meta["transforms"] == ("fusion",)
    on_npu = Fusion().apply(g, ctx("Huawei"))
    assert [n.attrs.get("fusion_rule") for n in on_npu.nodes if n.fused_from] == ["npu/r"]
    assert Fusion(platform="generic").apply(g, ctx("NVIDIA")) is g


# -- captured graphs ------------------------------------------------------------------------

TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", hidden_size=128, intermediate_size=256,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=512),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=3, n_head=4, vocab_size=512,
                 n_positions=256, bos_token_id=0, eos_token_id=0),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512, mlp_only_layers=[0]),
}

CAPTURED_PACK = """\
    name: test
    platform: cuda
    rules:
      - name: attention_kvcache
        scope: {module_class: "*Attention*"}
        phases: [decode]
        match: sequence
        ops: [aten.cat, aten.cat, zrt.attention]
        anchor: zrt.attention
        category: attention
        kernel: flash_attn_with_kvcache
      - name: attention
        scope: {module_class: "*Attention*"}
        match: sequence
        ops: [zrt.attention]
        anchor: zrt.attention
        category: attention
        kernel: flash_attn
      - name: attention_backward
        scope: {module_class: "*Attention*"}
        phases: [backward]
        match: sequence
        ops: [zrt.attention_backward]
        anchor: zrt.attention_backward
        category: attention
        kernel: flash_attn_bwd
      - name: rms_norm
        scope: {module_class: "*RMSNorm"}
        match: connected
        ops: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul]
        requires: [aten.mean, aten.rsqrt]
        op: fused.rms_norm
        category: norm
        kernel: rms_norm
      - name: rms_norm_backward
        scope: {module_class: "*RMSNorm"}
        phases: [backward]
        match: connected
        ops: [category:elementwise, aten.sum, aten._to_copy]
        requires: [aten.sum]
        op: fused.rms_norm_backward
        category: norm
        kernel: rms_norm_bwd
      - name: swiglu
        scope: {module_class: ["*MLP", "*Experts"], descendants: true}
        match: connected
        ops: [aten.silu, aten.mul]
        requires: [aten.silu, aten.mul]
        op: fused.swiglu
        category: elementwise
        kernel: silu_and_mul
      - name: swiglu_backward
        scope: {module_class: ["*MLP", "*Experts"], descendants: true}
        phases: [backward]
        match: connected
        ops: [aten.mul, aten.silu_backward, aten.cat]
        requires: [aten.silu_backward]
        op: fused.swiglu_backward
        category: elementwise
        kernel: dswiglu
      - name: gelu
        scope: {module_class: "*GELU*"}
        match: connected
        ops: [category:elementwise]
        requires: [aten.tanh]
        op: fused.gelu
        category: elementwise
        kernel: gelu_new
      - name: moe_gather_grouped_gemm
        scope: {module_class: "*Experts"}
        phases: [inference]
        match: sequence
        ops: [zrt.moe_dispatch, aten._grouped_mm]
        anchor: aten._grouped_mm
        category: matmul
        kernel: fused_moe_kernel
"""


@pytest.fixture(scope="module")
def captured():
    """``captured(family)`` → the four phase graphs of a tiny model (batch 2, 16 tokens)."""
    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager(autoload=False)
    cache: dict[str, Any] = {}

    def run(family: str) -> dict[str, OpGraph]:
        if family not in cache:
            cache[family] = capture(TINY[family], host=host, batch=2, seq_len=16).graphs
        return cache[family]

    return run


@pytest.fixture(scope="module")
def captured_pack(tmp_path_factory) -> FusionRulePack:
    return pack(CAPTURED_PACK, tmp_path_factory.mktemp("packs"))


def counts(graph: OpGraph) -> dict[str, int]:
    return dict(graph.meta["fusion"]["fused"])


def test_llama_prefill_fuses_norms_swiglu_and_attention(captured, captured_pack):
    g = captured("llama")["prefill"]
    out = fuse(g, [captured_pack])
    # one template layer: input and post-attention norms, then the final norm
    assert counts(out) == {"test/rms_norm": 3, "test/attention": 1, "test/swiglu": 1}
    assert out.totals().flops == g.totals().flops
    norm = by_rule(out, "test/rms_norm")[0]
    assert norm.module_path == "model.layers.0.input_layernorm"
    assert [n.op.split(".")[1] for n in norm.fused_from] == [
        "_to_copy", "pow", "mean", "add", "rsqrt", "mul", "_to_copy", "mul"]
    # 2·16 tokens × 128 hidden: read x 32·128·2 = 8192 + weight 128·2 = 256 → 8448,
    # write y 8192. Unfused the eight ops read 8192 + 16384 (fp32 x) + 16384 (x²) + 128
    # + 128 (mean, +eps) + 16512 + 16384 + 8448 = 82560 and write 65920.
    assert (norm.bytes_read, norm.bytes_written) == (8448, 8192)
    assert sum(n.bytes_read for n in norm.fused_from) == 82560
    assert sum(n.bytes_written for n in norm.fused_from) == 65920
    swiglu = by_rule(out, "test/swiglu")[0]
    # gate and up 32·256·2 = 16384 each in, the product 16384 out
    assert (swiglu.bytes_read, swiglu.bytes_written) == (32768, 16384)
    assert [n.op for n in swiglu.fused_from if not n.zero_cost] == [
        "aten.silu.default", "aten.mul.Tensor"]
    attention = by_rule(out, "test/attention")[0]
    assert attention.op == "zrt.attention.default" and attention.attrs["is_causal"] is True
    assert_valid(out)


def test_llama_decode_folds_the_cache_append_into_attention(captured, captured_pack):
    out = fuse(captured("llama")["decode"], [captured_pack])
    (attention,) = by_rule(out, "test/attention_kvcache")
    # q [2, 4, 1, 32] 512 + cache K and V [2, 2, 16, 32] 4096 each + new rows
    # [2, 2, 1, 32] 256 each → 9216; out 512 + lse [2, 4, 1] fp32 32 → 544
    assert (attention.bytes_read, attention.bytes_written) == (9216, 544)
    assert [x.shape for x in attention.inputs[:3]] == [(2, 4, 1, 32), (2, 2, 17, 32),
                                                       (2, 2, 17, 32)]


def test_llama_training_fuses_forward_and_backward(captured, captured_pack):
    graphs = captured("llama")
    forward = fuse(graphs["train_forward"], [captured_pack])
    norm = by_rule(forward, "test/rms_norm")[0]
    # training keeps rstd for backward: y 8192 + rstd 32·4 = 128 → 8320
    assert (norm.bytes_read, norm.bytes_written) == (8448, 8320)
    # the eight ops' autograd sequence numbers (process-wide counters: relative only)
    numbers = sorted(m.attrs["seq_nr"] for m in norm.fused_from if "seq_nr" in m.attrs)
    assert list(norm.attrs["seq_nrs"]) == numbers == list(range(numbers[0], numbers[0] + 8))
    assert norm.attrs["seq_nr"] == numbers[0]

    backward = fuse(graphs["train_backward"], [captured_pack])
    assert counts(backward) == {"test/rms_norm_backward": 3, "test/swiglu_backward": 1,
                                "test/attention_backward": 1}
    final = next(n for n in by_rule(backward, "test/rms_norm_backward")
                 if n.module_path == "model.norm")
    # read: dy 8192 + weight 256 + saved bf16 x·rstd 8192 + saved fp32 x 16384 + rstd 128
    # + its detached alias 128 → 33280; write: dx 8192 + dweight 256 → 8448
    assert (final.bytes_read, final.bytes_written) == (33280, 8448)
    assert {n.module_class for n in final.fused_from} == {"LlamaRMSNorm", "AccumulateGrad"}
    swiglu = by_rule(backward, "test/swiglu_backward")[0]
    # read dy and the saved silu(gate), up, gate (32·256·2 = 16384 each) → 65536;
    # write d(up) and d(gate) → 32768
    assert (swiglu.bytes_read, swiglu.bytes_written) == (65536, 32768)
    assert backward.totals().flops == graphs["train_backward"].totals().flops
    assert_valid(backward)


def test_gpt2_gelu_chain_becomes_one_kernel(captured, captured_pack):
    out = fuse(captured("gpt2")["prefill"], [captured_pack])
    (gelu,) = by_rule(out, "test/gelu")
    assert len(gelu.fused_from) == 8 and gelu.module_path == "transformer.h.0.mlp.act"
    # x [2, 16, 512] bf16 = 32768 in (read by four of the ops, once here), 32768 out
    assert (gelu.bytes_read, gelu.bytes_written) == (32768, 32768)


def test_qwen3_moe_gathers_rows_inside_the_grouped_gemm(captured, captured_pack):
    from zrt_core.cost.opdims import gemm_dims

    out = fuse(captured("qwen3_moe")["prefill"], [captured_pack])
    (gemm,) = by_rule(out, "test/moe_gather_grouped_gemm")
    assert [n.op for n in gemm.fused_from if not n.zero_cost] == [
        "zrt.moe_dispatch.default", "aten._grouped_mm.default"]
    assert gemm.op == "aten._grouped_mm.default" and gemm.category == "matmul"
    # the GEMM reads as before: 8 groups of 64/8 rows, N 128, K 128
    dims = gemm_dims(gemm)
    assert (dims.batch, dims.m, dims.n, dims.k, dims.grouped) == (8, 8, 128, 128, True)
    # read: 32 tokens × 2 experts gathered 64·128·2 = 16384 + top-k ids 32·2·8 = 512
    # + weights 8·128·128·2 = 262144 + group offsets 8·4 = 32 → 279072
    # write: the GEMM's 64·128·2 = 16384 + the row maps for combine 2·64·8 = 1024 → 17408
    # (the permuted copy of the hidden states, 16384, is never written)
    assert (gemm.bytes_read, gemm.bytes_written) == (279072, 17408)
    assert counts(out)["test/swiglu"] == 2  # the dense layer's MLP and the experts


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3_moe"])
def test_captured_graphs_fuse_once(captured, captured_pack, family):
    for graph in captured(family).values():
        once = fuse(graph, [captured_pack])
        assert fuse(once, [captured_pack]) is once
        assert once.totals().flops == graph.totals().flops
        assert_valid(once)
        kept = {n.id for n in once.nodes if not n.fused_from}
        replaced = [m.id for n in once.nodes for m in n.fused_from]
        assert sorted(kept | set(replaced)) == sorted(n.id for n in graph.nodes)


def test_full_depth_matches_each_layer_kind_once_with_the_templated_totals(captured_pack):
    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager(autoload=False)
    full = capture(TINY["llama"], host=host, phases=("train_backward",), batch=2, seq_len=16,
                   full_depth=True).graphs["train_backward"]
    templated = capture(TINY["llama"], host=host, phases=("train_backward",), batch=2,
                        seq_len=16).graphs["train_backward"]
    engine = fusion._Engine(full)
    engine.plan_replicas()
    # backward runs the last layer first: layer 2 is matched, layers 1 and 0 copy it
    assert {layer: rep for layer, (rep, _, _) in engine.replica_of.items()} == {1: 2, 0: 2}
    out = fuse(full, [captured_pack])
    every_layer = fusion._Engine(full)
    for rule in captured_pack.rules:
        if full.phase in rule.phases:
            every_layer.apply_rule(captured_pack, rule)
    assert out == every_layer.result(["test"])
    assert out.totals() == fuse(templated, [captured_pack]).totals()


def test_fusing_leaves_no_reference_cycles(tmp_path):
    # a search runs with rare garbage collections (zrt_core.search.collector): the fusion
    # engine's garbage must go with reference counting alone. Both matchers run: the
    # sequence (rope) and the connected one with its trailing views (RMSNorm's detach)
    import gc

    b = Builder()
    rms_norm_graph(b, 0)
    packs = [pack(RMS_NORM_PACK, tmp_path), pack(ROPE_PACK, tmp_path, "rope.yaml")]
    graphs = [b.graph(), rope_graph().graph()]
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for g in graphs:
            out = fuse(g, packs)
            assert any(n.attrs.get("fusion_rule") for n in out.nodes)
            del out
        gc.collect()
        assert not [o for o in gc.garbage if type(o).__module__.startswith("zrt_core")
                    or type(o).__name__ in ("cell", "function")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
