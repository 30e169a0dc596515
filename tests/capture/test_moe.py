"""MoE on fake tensors: assumed routing, grouped GEMMs at true shapes, dispatch/combine."""

from __future__ import annotations

import pytest

from zrt_core.capture.moe import routing_histogram
from zrt_core.ir.graph import Category, Phase


def test_routing_histogram():
    assert routing_histogram(4, 2, 4) == (2, 2, 2, 2)
    assert routing_histogram(1, 8, 16) == (1,) * 8 + (0,) * 8   # decode: 8 experts busy
    assert routing_histogram(10, 1, 4) == (3, 3, 2, 2)
    # imbalance 2: hot expert takes 2 · 4 = 8 rows, the other 8 are shared by three
    assert routing_histogram(8, 2, 4, imbalance=2.0) == (8, 3, 3, 2)
    # a token picks an expert at most once: the hot expert is capped at the token count
    assert routing_histogram(4, 2, 2, imbalance=4.0) == (4, 4)
    for args in [(4096, 8, 256, 1.0), (4096, 8, 256, 1.7), (3, 6, 64, 1.0)]:
        assert sum(routing_histogram(*args)) == args[0] * args[1]


def _moe_nodes(graph, layer):
    return [n for n in graph.nodes if n.layer_index == layer]


def test_experts_run_as_dispatch_grouped_gemms_combine(captured):
    g = captured("qwen3_moe").graphs[Phase.PREFILL]
    layer = _moe_nodes(g, 1)
    ops = [n.op for n in layer if n.category in (Category.MOE_DISPATCH, Category.MOE_COMBINE)
           or n.op == "aten._grouped_mm.default"]
    assert ops == ["zrt.moe_dispatch.default", "aten._grouped_mm.default",
                   "aten._grouped_mm.default", "zrt.moe_combine.default"]
    up, down = [n for n in layer if n.op == "aten._grouped_mm.default"]
    # 2 sequences × 16 tokens × top-2 = 64 rows over 8 experts: 8 rows each
    assert up.inputs[0].shape == (64, 128) and up.inputs[1].shape == (8, 128, 128)
    assert list(up.attrs["group_rows"]) == [8] * 8
    assert down.inputs[1].shape == (8, 64, 128)
    # 2 · 64 rows · 128 · 128 (gate and up fused) = 2097152
    assert up.flops == 2097152
    assert all(n.module_path == "model.layers.1.mlp.experts" for n in (up, down))


def test_backward_has_the_mirror_ops_and_keeps_the_routing(captured):
    g = captured("qwen3_moe").graphs[Phase.TRAIN_BACKWARD]
    layer = _moe_nodes(g, 1)
    cats = {n.op: n.category for n in layer if n.op.startswith("zrt.moe")}
    assert cats == {"zrt.moe_combine_backward.default": Category.MOE_DISPATCH,
                    "zrt.moe_dispatch_backward.default": Category.MOE_COMBINE}
    grouped = [n for n in layer if n.op == "aten._grouped_mm.default"]
    assert len(grouped) == 4  # dX and dW of both projections
    assert all(list(n.attrs["group_rows"]) == [8] * 8 for n in grouped)


def test_op_count_does_not_grow_with_the_number_of_experts(host, tiny):
    from zrt_core.capture.api import capture

    counts = []
    for experts in (8, 64):
        cfg = {**tiny["qwen3_moe"], "num_experts": experts}
        r = capture(cfg, phases=(Phase.PREFILL,), batch=2, seq_len=16, host=host)
        counts.append(len(r.graphs[Phase.PREFILL].nodes))
    assert counts[0] == counts[1]


def test_imbalance_loads_the_busiest_expert(captured):
    g = captured("qwen3_moe", moe_imbalance=2.0).graphs[Phase.PREFILL]
    up = next(n for n in g.nodes if n.op == "aten._grouped_mm.default")
    rows = list(up.attrs["group_rows"])
    assert rows[0] == 16 and sum(rows) == 64   # 2 × the mean of 8
    assert g.meta["moe_imbalance"] == 2.0
    balanced = captured("qwen3_moe").graphs[Phase.PREFILL]
    assert g.totals().flops == balanced.totals().flops  # same work, different spread


def test_decode_reads_only_the_experts_it_uses(captured):
    g = captured("qwen3_moe", batch=1).graphs[Phase.DECODE]
    up = next(n for n in g.nodes if n.op == "aten._grouped_mm.default")
    assert list(up.attrs["group_rows"]) == [1, 1, 0, 0, 0, 0, 0, 0]
    weights = up.inputs[1]
    # 2 of 8 experts active: the node reads 2/8 of the stacked weights
    assert up.bytes_read == up.inputs[0].nbytes + weights.nbytes // 4 + up.inputs[2].nbytes


def test_llama4_routes_top_k_instead_of_every_expert(captured):
    r = captured("llama4")
    g = r.graphs[Phase.PREFILL]
    moe = [n for n in g.nodes if n.layer_index == 1 and n.category == Category.MATMUL]
    grouped = [n for n in moe if n.op == "aten._grouped_mm.default"]
    assert len(grouped) == 2
    # top-1 of 4 experts: 32 rows (not 4 × 32 as HF's dense reference computes)
    assert grouped[0].inputs[0].shape == (32, 128)
    assert not [n for n in moe if n.op == "aten.bmm.default"]
    assert abs(r.flops_checks[Phase.PREFILL].gap) < 0.02


def test_moe_patches_are_scoped(captured):
    from transformers.integrations.moe import ExpertsInterface
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.llama4 import modeling_llama4

    captured("llama4")
    captured("qwen3_moe")
    assert "zrt_balanced" not in ExpertsInterface._global_mapping
    assert "zrt" not in AttentionInterface._global_mapping
    assert modeling_llama4.Llama4TextMoe.forward.__name__ == "forward"


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3", "gpt_oss", "nemotron_h"])
def test_every_moe_family_uses_the_grouped_path(captured, family):
    g = captured(family).graphs[Phase.PREFILL]
    has_experts = any(n.op == "zrt.moe_dispatch.default" for n in g.nodes)
    assert has_experts == (family != "nemotron_h")  # the tiny Nemotron-H has no MoE block


ROUTER_OPS = {
    # family: the scoring and selection ops its router runs in prefill (besides casts)
    "mixtral": {"aten._softmax.default", "aten.topk.default", "aten.sum.dim_IntList",
                "aten.div_.Tensor"},
    "qwen3_moe": {"aten._softmax.default", "aten.topk.default"},
    "gpt_oss": {"aten._softmax.default", "aten.topk.default"},
    # group-limited routing: sigmoid scores, per-group top-2 sums, top groups, mask, top-k
    "deepseek_v3": {"aten.sigmoid.default", "aten.topk.default", "aten.masked_fill.Scalar",
                    "aten.gather.default", "aten.scatter_.value"},
    "llama4": {"aten.topk.default", "aten.sigmoid.default"},
}


@pytest.mark.parametrize("family", sorted(ROUTER_OPS))
def test_router_ops_are_moe_router_and_the_gate_gemm_a_gemm(captured, family):
    r = captured(family)
    for phase, g in r.graphs.items():
        router = [n for n in g.nodes if not n.zero_cost and (
            n.module_class.endswith("Router") or n.attrs.get("moe_router"))]
        assert router, phase
        gemms = [n for n in router if n.category == Category.MATMUL]
        # the gate GEMM (and its input and weight gradients in the backward)
        assert {n.op.split(".")[1] for n in gemms} <= {"mm", "addmm"}
        assert len(gemms) == (2 if phase == Phase.TRAIN_BACKWARD else 1) * len(
            {n.layer_index for n in gemms})
        assert all(n.category == Category.MOE_ROUTER for n in router if n not in gemms)
        if phase == Phase.PREFILL:
            assert ROUTER_OPS[family] <= {n.op for n in router}
        # nothing outside a router is called one
        assert all(n in router for n in g.nodes if n.category == Category.MOE_ROUTER)
