"""DeepSeek-V4: sliding, CSA and HCA layers each as one sparse-attention kernel, the CSA
indexer, exact FLOPs against the analytic count, numerics against transformers."""

from __future__ import annotations

from zrt_deepseek.analytic import V4Dims, v4_phase_flops
from zrt_deepseek.formulas import hc_split_sinkhorn_row_flops
from zrt_deepseek.v4 import v4_context, v4_hyper_connection_context

from zrt_core.capture.compat import cache_keyword, output_cache
from zrt_core.ir.graph import Category, Phase

SPARSE = "deepseek.sparse_attention.default"
INDEXER = "deepseek.lightning_indexer.default"


def _by_layer(graph, op):
    return {n.layer_index: n for n in graph.nodes if n.op == op}


def test_layer_kinds_and_one_kernel_per_layer(captured):
    r = captured("deepseek_v4")
    kinds = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
    assert [t.indices for t in r.templates] == [(0,), (1,), (2,)]
    assert all(kind in t.kind for kind, t in zip(kinds, r.templates, strict=True))
    assert r.missing_formulas == ()
    for phase in (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD):
        g = r.graphs[phase]
        assert set(_by_layer(g, SPARSE)) == {0, 1, 2}
        assert set(_by_layer(g, INDEXER)) == {1}          # only CSA has an indexer
        assert not [n for n in g.nodes if n.op == "zrt.attention.default"]
    backward = _by_layer(r.graphs[Phase.TRAIN_BACKWARD], "deepseek.sparse_attention_backward.default")
    assert set(backward) == {0, 1, 2}


def test_prefill_flops(captured):
    g = captured("deepseek_v4").graphs[Phase.PREFILL]
    att = _by_layer(g, SPARSE)
    unit = 2 * 2 * 4 * (64 + 64)  # 2 · B 2 · H 4 · (D + D), K = V
    # window 8 over 16 queries: 1+2+…+8 + 8·8 = 100 pairs
    assert att[0].flops == unit * 100
    # CSA: + Σ min(3, ⌊(p+1)/4⌋) = 0,0,0,1,1,1,1,2,2,2,2,3,3,3,3,3 → 27
    assert att[1].flops == unit * 127
    # HCA: + Σ ⌊(p+1)/8⌋ = seven 0s, eight 1s, one 2 → 10
    assert att[2].flops == unit * 110
    # CSA indexer over the 4 entries: Σ min(4, ⌊(p+1)/4⌋) = 28 pairs; 2 · 2 · 2 · 28 · 33
    assert _by_layer(g, INDEXER)[1].flops == 7_392
    assert att[1].inputs[1].shape == (2, 1, 16 + 4, 64)   # window source + 4 CSA entries
    assert att[2].inputs[1].shape == (2, 1, 16 + 2, 64)   # + 2 HCA entries


def test_decode_flops(captured):
    g = captured("deepseek_v4").graphs[Phase.DECODE]
    att = _by_layer(g, SPARSE)
    unit = 2 * 2 * 4 * 128
    # the token at p = 16 sees the 8-key window, plus min(3, 17//4 = 4) = 3 CSA entries
    # or 17//8 = 2 HCA entries
    assert [att[i].flops for i in (0, 1, 2)] == [unit * 8, unit * 11, unit * 10]
    assert att[0].inputs[1].shape == (2, 1, 8, 64)         # the window cache holds 8 keys
    # the indexer scores the 4 closed entries: 2 · 2 · 2 · 4 · 33
    assert _by_layer(g, INDEXER)[1].flops == 1_056


def test_captured_flops_match_the_analytic_count(captured, tiny):
    r = captured("deepseek_v4")
    for phase, g in r.graphs.items():
        length = g.meta.get("kv_len") or 16
        ref = v4_phase_flops(tiny["deepseek_v4"], phase, 2, length)
        by_cat = {c: sum(g.multiplicity(n) * n.flops for n in g.nodes if n.category == c)
                  for c in (Category.MATMUL, Category.ATTENTION)}
        if phase != Phase.TRAIN_BACKWARD:
            assert by_cat[Category.ATTENTION] == ref.attention, phase
            # the analytic count's n × n stream mix (2·n²·h per token and hyper-connection:
            # 2 · 2² · 128 = 1,024; two per layer, 3 layers) runs inside deepseek.hc_post,
            # an elementwise kernel: 1,024 · 2 · 3 · 32 tokens = 196,608 (decode: 2 tokens)
            mix = 1_024 * 2 * 3 * ref.tokens
            assert by_cat[Category.MATMUL] + mix == ref.matmul + ref.lm_head, phase
        # the rest is norms, pooling and elementwise work the analytic count leaves out
        assert abs(g.totals().flops - ref.total) / ref.total < 0.05, phase
        # the capture's own check found the count through zrt_reference_flops
        check = r.flops_checks[phase]
        assert (check.analytic, check.reference) == (ref.total, "<local>"), phase
    assert not [w for w in r.warnings if "no analytic FLOPs" in w]


def test_the_reference_hook_answers_for_v4_only(host, tiny):
    from zrt_core.analytic.flops import reference_flops

    assert host.reference_flops(tiny["deepseek_v3"], "prefill", 1, 16) is None
    flops, source = reference_flops({"text_config": tiny["deepseek_v4"]}, "decode", 3, 40,
                                    host=host)
    assert flops == v4_phase_flops(tiny["deepseek_v4"], "decode", 3, 40)
    assert source == "<local>"


def test_analytic_layer_weights_match_the_built_model(captured, tiny):
    """N_active per layer (analytic) against the parameters transformers builds."""
    r = captured("deepseek_v4")
    d = V4Dims.from_config(tiny["deepseek_v4"])
    h, e, f = 128, 8, 64
    routed_unused = 3 * (e - 2) * 3 * h * f   # 3 layers · 6 idle experts · gate/up/down
    matmul_weights = sum(d.layer_matmul_active(t) for t in d.layer_types)
    # weights that are not matmul operands: norms, sinks, compressor position biases,
    # hyper-connection bases/scales (small); embedding and head are 512 · 128 each
    assert r.params.total - routed_unused - 2 * 512 * 128 > matmul_weights
    assert (r.params.total - routed_unused - 2 * 512 * 128 - matmul_weights) / matmul_weights \
        < 0.2


def test_transformers_graph_miscounts_compressed_layers(captured):
    """Through zrt.attention transformers' V4 graph charges an HCA query for the last
    window of the concatenated keys — the compressed entries — not its own window."""
    plain = captured("deepseek_v4", plugin=False).graphs[Phase.PREFILL]
    hca = [n for n in plain.nodes if n.op == "zrt.attention.default" and n.layer_index == 2]
    assert hca and hca[0].flops != _by_layer(captured("deepseek_v4").graphs[Phase.PREFILL],
                                             SPARSE)[2].flops


def test_numerics_match_transformers(tiny, make_real_model):
    """Prefill, five decode steps (windows closing mid-decode) and training gradients of a
    random V4 agree with transformers' eager reference."""
    import torch

    model = make_real_model(tiny["deepseek_v4"])
    ids = torch.randint(0, 512, (2, 13))
    steps = [torch.randint(0, 512, (2, 1)) for _ in range(5)]

    def run():
        outs = []
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            outs.append(out.logits)
            for step in steps:
                out = model(input_ids=step, use_cache=True, **{cache_keyword(model): output_cache(out)})
                outs.append(out.logits)
        model.zero_grad()
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        model.eval()
        return outs + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    reference = run()
    with v4_context(model.config, None), v4_hyper_connection_context(model.config, None):
        ours = run()
    assert len(ours) == len(reference)
    for a, b in zip(reference, ours, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


HC = "deepseek.hc_split_sinkhorn.default"


def test_hyper_connections_are_one_kernel_counting_what_transformers_counted(captured):
    """Each layer's two hyper-connections compute their weights with one node; its FLOPs are
    what transformers' elementwise ops (captured without the plugin) add up to."""
    ours, plain = captured("deepseek_v4"), captured("deepseek_v4", plugin=False)
    for phase in (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD):
        g = ours.graphs[phase]
        hc = [n for n in g.nodes if n.op == HC]
        assert sorted(n.layer_index for n in hc) == [0, 0, 1, 1, 2, 2]
        tokens = 2 * (1 if phase == Phase.DECODE else 16)
        # n = hc_mult 2, hc_sinkhorn_iters 20 (transformers' default): 8·2 + 8·4 +
        # 39·(2·4 + 2) = 438 FLOPs per token
        assert hc_split_sinkhorn_row_flops(2, 20) == 438
        assert {n.flops for n in hc} == {438 * tokens}
        assert hc[0].outputs[2].shape == (2, tokens // 2, 2, 2)   # comb, float32
        # the nodes transformers used for the same weights: every node of an attn_hc /
        # ffn_hc module outside its norm, projection and collapse
        replaced = [n for n in plain.graphs[phase].nodes if n.module_path.endswith("_hc")
                    and n.layer_index == 0]
        mine = [n for n in g.nodes if n.module_path.endswith("_hc") and n.layer_index == 0]
        assert len(replaced) - len(mine) > 200
        assert sum(n.flops for n in replaced) == sum(n.flops for n in mine)
    backward = [n for n in ours.graphs[Phase.TRAIN_BACKWARD].nodes
                if n.op == "deepseek.hc_split_sinkhorn_backward.default"]
    assert len(backward) == 6 and {n.flops for n in backward} == {3 * 438 * 32}


def test_the_hyper_connection_patch_restores_the_class(tiny):
    import importlib

    module = importlib.import_module("transformers.models.deepseek_v4.modeling_deepseek_v4")
    classes = (module.DeepseekV4HyperConnection, module.DeepseekV4DecoderLayer)
    originals = [cls.__dict__["forward"] for cls in classes]
    try:
        with v4_hyper_connection_context(None, None):
            assert all(cls.forward is not f for cls, f in zip(classes, originals, strict=True))
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    assert [cls.__dict__["forward"] for cls in classes] == originals


def test_stream_collapse_and_mix_are_one_kernel_each(captured):
    """Each hyper-connection's collapse is one deepseek.hc_aggregate and each block's
    expansion + residual mix one deepseek.hc_post (Megatron-Core's fused mHC kernels), not
    a broadcast multiply, a reduction and a [n × n] @ [n × D] bmm per token."""
    r = captured("deepseek_v4")
    g = r.graphs[Phase.TRAIN_FORWARD]
    agg = [n for n in g.nodes if n.op == "deepseek.hc_aggregate.default"]
    post = [n for n in g.nodes if n.op == "deepseek.hc_post.default"]
    assert sorted(n.layer_index for n in post) == [0, 0, 1, 1, 2, 2]
    assert sorted(n.layer_index for n in agg) == [0, 0, 1, 1, 2, 2]
    # 2 · 16 = 32 rows, n = hc_mult 2, D = hidden 128:
    # collapse 2·n·D = 512 per row → 16,384; mix (2n + 2)·n·D = 1,536 per row → 49,152
    assert {n.flops for n in agg} == {16_384}
    assert {n.flops for n in post} == {49_152}
    assert post[0].outputs[0].shape == (2, 16, 2, 128)
    assert agg[0].outputs[0].shape == (2, 16, 128)
    assert not [n for n in g.nodes if n.op == "aten.bmm.default"
                and n.module_path.rsplit(".", 1)[-1].isdigit()]   # no layer-level stream bmm
    b = r.graphs[Phase.TRAIN_BACKWARD]
    # backward: collapse 3·n·D = 768 per row → 24,576; mix (4n + 4)·n·D = 3,072 → 98,304
    assert {n.flops for n in b.nodes if n.op == "deepseek.hc_aggregate_backward.default"} \
        == {24_576}
    assert {n.flops for n in b.nodes if n.op == "deepseek.hc_post_backward.default"} \
        == {98_304}
    assert len([n for n in b.nodes if n.op == "deepseek.hc_post_backward.default"]) == 6
