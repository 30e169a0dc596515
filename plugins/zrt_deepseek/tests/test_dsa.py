"""DeepSeek-V3.2 sparse attention: the lightning indexer and top-k attention in MLA's
absorbed form, in every phase, with exact FLOPs and numerics against transformers."""

from __future__ import annotations

from zrt_deepseek.mla import mla_context

from zrt_core.capture.compat import cache_keyword, output_cache
from zrt_core.ir.graph import Category, Phase

INDEXER = "deepseek.lightning_indexer.default"
MLA_OP = "deepseek.mla_attention.default"


def _ops(graph, op, layer=0):
    return [n for n in graph.nodes if n.op == op and n.layer_index == layer]


def test_every_phase_has_the_indexer_and_sparse_latent_attention(captured):
    r = captured("deepseek_v32")
    assert tuple(r.graphs) == Phase.CAPTURED and r.missing_formulas == ()
    for phase in (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD):
        g = r.graphs[phase]
        (indexer,) = _ops(g, INDEXER)
        (attention,) = _ops(g, MLA_OP)
        assert attention.inputs[3].shape[-1] == 8           # indices: the top-8 keys
        assert attention.inputs[3].tensor_id == indexer.outputs[0].tensor_id
        assert not [n for n in g.nodes if n.op == "zrt.attention.default"]
    backward = r.graphs[Phase.TRAIN_BACKWARD]
    assert _ops(backward, "deepseek.mla_attention_backward.default")
    assert not [n for n in backward.nodes if "indexer" in n.op]  # no gradient, as the model


def test_prefill_flops(captured):
    g = captured("deepseek_v32").graphs[Phase.PREFILL]
    (indexer,) = _ops(g, INDEXER)
    (attention,) = _ops(g, MLA_OP)
    # indexer: 16·17/2 = 136 causal pairs; 2 · B 2 · 2 index heads · 136 · (32 + 1) = 35,904
    assert indexer.flops == 35_904
    # attention: Σ min(i, 8) for i = 1..16 = 36 + 8·8 = 100 pairs;
    # 2 · 2 · 4 heads · 100 · ((32 + 16) + 32) = 128,000
    assert attention.flops == 128_000
    # the CUDA indexer writes [B, S, T] float32 logits and reads them back for the top-k
    logits = 2 * 16 * 16 * 4
    q, k, w = indexer.inputs
    assert indexer.bytes_read == q.nbytes + k.nbytes + w.nbytes + logits
    assert indexer.bytes_written == 2 * 16 * 8 * 4 + logits


def test_decode_and_backward_flops(captured):
    r = captured("deepseek_v32")
    decode = r.graphs[Phase.DECODE]
    (indexer,) = _ops(decode, INDEXER)
    (attention,) = _ops(decode, MLA_OP)
    # the new token scores all 17 keys: 2 · 2 · 2 · 17 · 33 = 4,488
    assert indexer.flops == 4_488
    # and attends to its top 8: 2 · 2 · 4 · 8 · 80 = 10,240; it reads 8 of the 17 cache rows
    assert attention.flops == 10_240
    q = attention.inputs[0]
    row = 48 * 2
    assert attention.bytes_read == q.nbytes + 2 * 8 * row + attention.inputs[3].nbytes
    (backward,) = _ops(r.graphs[Phase.TRAIN_BACKWARD], "deepseek.mla_attention_backward.default")
    # 100 pairs · 2 · 2 · 4 · (3·48 + 2·32) = 332,800
    assert backward.flops == 332_800


def test_short_prefill_is_dense_masked_mha(captured):
    g = captured("deepseek_v32", seq_len=8).graphs[Phase.PREFILL]
    # no query can take more than 8 keys: top-k is everything, expanded MHA as for V3
    assert not _ops(g, MLA_OP)
    (attention,) = _ops(g, "zrt.attention.default")
    assert attention.attrs["mla_form"] == "expanded" and len(attention.inputs) == 3
    assert _ops(g, INDEXER)


def test_phases_agree_with_the_analytic_reference(captured):
    r = captured("deepseek_v32")
    for phase, check in r.flops_checks.items():
        assert abs(check.gap) < 0.05, (phase, check)
    for phase in (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD):
        g = r.graphs[phase]
        attention = sum(g.multiplicity(n) * n.flops for n in g.nodes
                        if n.category == Category.ATTENTION)
        from zrt_core.analytic.flops import phase_flops

        length = g.meta.get("kv_len") or 16
        assert attention == phase_flops(r.config, phase, 2, length).attention


def test_numerics_match_transformers(tiny, make_real_model):
    """Top-k selection and the absorbed sparse attention reproduce transformers' eager DSA
    (indexer mask folded into the attention mask), forward and backward."""
    import torch

    model = make_real_model(tiny["deepseek_v32"])
    ids, nxt = torch.randint(0, 512, (2, 12)), torch.randint(0, 512, (2, 1))

    def run():
        with torch.no_grad():
            first = model(input_ids=ids, use_cache=True)
            step = model(input_ids=nxt, use_cache=True,
                         **{cache_keyword(model): output_cache(first)})
        model.zero_grad()
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        model.eval()
        return [first.logits, step.logits] + [p.grad.clone() for p in model.parameters()
                                              if p.grad is not None]

    reference = run()
    with mla_context(model.config, None):
        ours = run()
    assert len(ours) == len(reference)
    for a, b in zip(reference, ours, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
