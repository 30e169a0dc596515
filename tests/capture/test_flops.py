"""Captured FLOPs against independent counts: hand-derived formulas on real-size configs,
torch.utils.flop_counter on real runs of tiny models, and the training ≈ 3x forward rule."""

from __future__ import annotations

import pytest

from zrt_core.ir.graph import Category, Phase


def _category_flops(graph, *categories):
    return sum(n.flops * graph.multiplicity(n) for n in graph.nodes
               if n.category in categories)


def _causal_pairs(s: int) -> int:
    return s * (s + 1) // 2


@pytest.fixture(scope="module")
def llama8b(host):
    from zrt_core.capture.api import capture

    return capture("llama3-8b", phases=Phase.CAPTURED, batch=1, seq_len=512, host=host)


def test_llama3_8b_forward_is_two_flops_per_active_weight_plus_attention(llama8b):
    cfg = llama8b.config
    h, layers, heads, kv = (cfg["hidden_size"], cfg["num_hidden_layers"],
                            cfg["num_attention_heads"], cfg["num_key_value_heads"])
    d, ffn, vocab = h // heads, cfg["intermediate_size"], cfg["vocab_size"]
    # per layer: q, o (h·h each), k, v (h·kv·d each), gate/up/down (h·ffn each)
    per_layer = 2 * h * h + 2 * h * kv * d + 3 * h * ffn
    assert per_layer == 218_103_808                # 2·4096² + 2·4096·1024 + 3·4096·14336
    tokens = 512
    attention = layers * 2 * heads * _causal_pairs(512) * (d + d)
    prefill = llama8b.graphs[Phase.PREFILL]
    # prefill computes logits for the last position only: one row of h·vocab
    assert _category_flops(prefill, Category.MATMUL) == \
        2 * layers * per_layer * tokens + 2 * h * vocab
    assert _category_flops(prefill, Category.ATTENTION) == attention
    reference = 2 * layers * per_layer * tokens + 2 * h * vocab + attention
    assert abs(prefill.totals().flops / reference - 1) < 0.01
    # decode: one token, attending to the 512 cached keys and itself
    decode = llama8b.graphs[Phase.DECODE]
    decode_ref = 2 * layers * per_layer + 2 * h * vocab + layers * 2 * heads * 513 * 2 * d
    assert _category_flops(decode, Category.MATMUL, Category.ATTENTION) == decode_ref
    assert abs(decode.totals().flops / decode_ref - 1) < 0.01


def test_llama3_8b_training_is_about_three_forwards(llama8b):
    fwd = llama8b.graphs[Phase.TRAIN_FORWARD].totals().flops
    bwd = llama8b.graphs[Phase.TRAIN_BACKWARD].totals().flops
    assert 2.95 < (fwd + bwd) / fwd < 3.1
    # matmuls exactly: input and weight gradients each cost one forward
    f_mm = _category_flops(llama8b.graphs[Phase.TRAIN_FORWARD], Category.MATMUL)
    b_mm = _category_flops(llama8b.graphs[Phase.TRAIN_BACKWARD], Category.MATMUL)
    assert b_mm == 2 * f_mm


def test_qwen3_moe_counts_top_k_experts_per_token(host):
    from zrt_core.capture.api import capture

    r = capture("qwen3-30b-a3b", phases=(Phase.PREFILL,), batch=1, seq_len=256, host=host)
    cfg = r.config
    h, heads, kv, d = (cfg["hidden_size"], cfg["num_attention_heads"],
                       cfg["num_key_value_heads"], cfg["head_dim"])
    experts, top_k, moe_ffn = (cfg["num_experts"], cfg["num_experts_per_tok"],
                               cfg["moe_intermediate_size"])
    per_layer = (2 * h * heads * d + 2 * h * kv * d      # q, o and k, v
                 + h * experts                            # router
                 + top_k * 3 * h * moe_ffn)               # top-k experts' gate/up/down
    layers, tokens = cfg["num_hidden_layers"], 256
    g = r.graphs[Phase.PREFILL]
    assert _category_flops(g, Category.MATMUL) == \
        2 * layers * per_layer * tokens + 2 * h * cfg["vocab_size"]
    attention = layers * 2 * heads * _causal_pairs(256) * 2 * d
    reference = 2 * layers * per_layer * tokens + 2 * h * cfg["vocab_size"] + attention
    assert abs(g.totals().flops / reference - 1) < 0.01
    # active parameters from the fake weights: the published 3.3B
    assert r.params.active == pytest.approx(3.35e9, rel=0.01)
    assert r.params.total == pytest.approx(30.5e9, rel=0.01)


@pytest.mark.parametrize("model", ["deepseek-v3", "llama4-maverick", "gpt-oss-120b",
                                   "nemotron-h-8b", "gemma2-9b"])
def test_forward_phases_agree_with_the_analytic_front_end(host, model):
    """The analytic counts (zrt_core.analytic) are derived from the config alone."""
    from zrt_core.capture.api import capture

    r = capture(model, phases=(Phase.PREFILL, Phase.TRAIN_FORWARD), batch=1, seq_len=512,
                host=host)
    for phase, check in r.flops_checks.items():
        assert abs(check.gap) < 0.01, (phase, check)


def _real_run_flops(config: dict, batch: int, seq: int) -> tuple[int, int]:
    """torch.utils.flop_counter on a real (not fake) run: forward and backward totals.

    Attention runs through the harness's own ``zrt.attention`` (torch has no formula for
    it, so it counts 0), so the counter sees exactly the model's matmuls; experts run
    transformers' ``batched_mm`` (bmm, which torch counts; it has no formula for the
    grouped GEMM the capture uses).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.attention import zrt_attention_context
    from zrt_core.capture.sources import transformers_config

    torch.manual_seed(0)
    hf = transformers_config(config)
    with zrt_attention_context(hf, None):
        model = AutoModelForCausalLM.from_config(hf, experts_implementation="batched_mm",
                                                 dtype=torch.float32)
        model.train()
        ids = torch.randint(0, config.get("vocab_size", 512), (batch, seq))
        with FlopCounterMode(display=False) as fwd:
            loss = model(input_ids=ids, labels=ids).loss
        with FlopCounterMode(display=False) as bwd:
            loss.backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_v3", "gpt2"])
def test_matmul_flops_equal_torch_flop_counter_on_a_real_run(captured, tiny, family):
    r = captured(family, phases=(Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD),
                 dtype="float32")
    fwd, bwd = _real_run_flops(tiny[family], 2, 16)
    assert _category_flops(r.graphs[Phase.TRAIN_FORWARD], Category.MATMUL) == fwd
    assert _category_flops(r.graphs[Phase.TRAIN_BACKWARD], Category.MATMUL) == bwd
