"""MLA (DeepSeek-V2/V3, Kimi K2): decode absorbed over the latent cache, prefill and
training expanded, exact FLOPs, the cache row, numerics against transformers, no leaks."""

from __future__ import annotations

import pytest
from zrt_deepseek.mla import absorb_is_cheaper, mla_context

from zrt_core.analytic.flops import decode_flops
from zrt_core.capture.compat import cache_keyword, output_cache
from zrt_core.ir.graph import Category, Phase

MLA_OP = "deepseek.mla_attention.default"


def _flops(graph, *categories):
    return sum(graph.multiplicity(n) * n.flops for n in graph.nodes if n.category in categories)


def _ops(graph, op):
    return [n for n in graph.nodes if n.op == op]


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_decode_is_absorbed_and_prefill_training_expanded(captured, family):
    r = captured(family)
    assert tuple(r.graphs) == Phase.CAPTURED and r.missing_formulas == ()
    decode = r.graphs[Phase.DECODE]
    # one absorbed node per layer kind (dense layer 0, MoE layers 1-2), no expanded attention
    assert [n.layer_index for n in _ops(decode, MLA_OP)] == [0, 1]
    assert not _ops(decode, "zrt.attention.default")
    for phase in (Phase.PREFILL, Phase.TRAIN_FORWARD):
        g = r.graphs[phase]
        assert not _ops(g, MLA_OP)
        (att, _) = _ops(g, "zrt.attention.default")
        assert att.inputs[0].shape == (2, 4, 16, 40) and att.inputs[2].shape == (2, 4, 16, 20)
        assert att.attrs["mla_form"] == "expanded"


def test_absorbed_decode_flops_match_the_analytic_formula(captured, tiny):
    r = captured("deepseek_v3")
    decode = r.graphs[Phase.DECODE]
    node = _ops(decode, MLA_OP)[0]
    q, kv, v = node.inputs[:3]
    # q in the latent space: [B, H, 1, r + rope] = [2, 4, 1, 32 + 16]; the cache: 17 rows
    # (16 prefilled + the new token) of 48; values are its first r = 32 channels
    assert q.shape == (2, 4, 1, 48) and kv.shape == (2, 1, 17, 48) and v.shape == (2, 1, 17, 32)
    # 2 · B 2 · H 4 · 17 keys · ((32 + 16) + 32) = 21,760
    assert node.flops == 21_760
    # the analytic reference, per layer: 2 · 4 heads · 17 keys · (48 + 32) = 10,880 per sequence
    analytic = decode_flops(tiny["deepseek_v3"], batch=2, kv_len=16)
    assert analytic.attention == 3 * node.flops  # 3 layers, 2 sequences
    # whole phase: the matmuls are 2·N_active·T exactly; the rest are norms and elementwise
    assert _flops(decode, Category.ATTENTION) == analytic.attention
    assert abs(r.flops_checks[Phase.DECODE].gap) < 0.02


def test_weight_absorption_costs_kv_b_proj_once_per_query(captured):
    decode = captured("deepseek_v3").graphs[Phase.DECODE]
    absorb = [n for n in decode.nodes if n.op == "aten.bmm.default" and n.layer_index == 0
              and n.attrs.get("mla_form") == "absorbed"]
    # q_nope · W_UK: 2 · H 4 · (B·S = 2) · nope 24 · r 32 = 12,288;
    # out · W_UVᵀ: 2 · 4 · 2 · 32 · v 20 = 10,240 — together 2 · r · H · (nope + v) per token
    assert [n.flops for n in absorb] == [12_288, 10_240]
    assert all(n.inputs[1].param == "model.layers.0.self_attn.kv_b_proj.weight" for n in absorb)


def test_decode_flops_drop_by_the_expected_factor(captured):
    plain = captured("deepseek_v3", plugin=False).graphs[Phase.DECODE]
    patched = captured("deepseek_v3").graphs[Phase.DECODE]
    # Per layer, transformers re-expands all 17 cached latents through kv_b_proj,
    #   2 · B 2 · 17 · r 32 · H 4 · (nope 24 + v 20) = 382,976,
    # and attends with expanded heads, 2 · 2 · 4 · 17 · (40 + 20) = 16,320: 399,296.
    # Absorbed: W_UK and W_UV once per query, 2 · 2 · 32 · 4 · 44 = 22,528, and the latent
    # attention 21,760: 44,288. Everything else (projections, MoE, head) is common.
    per_layer_plain, per_layer_absorbed = 382_976 + 16_320, 22_528 + 21_760
    cats = (Category.MATMUL, Category.ATTENTION)
    assert _flops(plain, *cats) - _flops(patched, *cats) == 3 * (
        per_layer_plain - per_layer_absorbed)
    assert per_layer_plain / per_layer_absorbed == pytest.approx(9.016, abs=1e-3)
    assert _flops(plain, *cats) / _flops(patched, *cats) > 1.5


def test_cache_row_is_the_latent(captured):
    decode = captured("deepseek_v3").graphs[Phase.DECODE]
    node = _ops(decode, MLA_OP)[0]
    # (r 32 + rope 16) bf16 values per token and layer, where expanded K/V would be
    # H 4 · (40 + 20) = 240 values
    assert node.attrs["kv_cache_bytes_per_token"] == (32 + 16) * 2
    assert node.inputs[1].dtype == "bfloat16"


def test_deepseek_v3_cache_row_is_576_values():
    """Full DeepSeek-V3 widths (two layers): 512 latent + 64 rope = 576 values per token
    per layer, 1,152 bytes in bf16 (not 2 · 128 heads · (192 + 128) expanded values)."""
    import zrt_deepseek.plugin

    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager(autoload=False)
    host.register(zrt_deepseek.plugin, name="zrt_deepseek")
    v3 = dict(host.models.get("deepseek-v3").config_dict(), num_hidden_layers=2,
              first_k_dense_replace=1)
    r = capture(v3, host=host, phases="decode", batch=1, seq_len=8)
    (dense, moe) = _ops(r.graphs[Phase.DECODE], MLA_OP)
    for node in (dense, moe):
        assert node.inputs[1].shape == (1, 1, 9, 576)
        assert node.attrs["kv_cache_bytes_per_token"] == 1_152
    # 2 · 128 heads · 9 keys · (576 + 512) = 2,506,752
    assert dense.flops == 2_506_752


def test_absorption_is_chosen_by_flops():
    v3 = dict(heads=128, kv_lora_rank=512, nope=128, rope=64, v=128)
    assert absorb_is_cheaper(1, 4097, **v3)                   # decode
    assert not absorb_is_cheaper(4096, 4096, **v3)            # prefill, no prefix
    assert absorb_is_cheaper(64, 4096 + 64, **v3)             # a short extend on a long prefix
    assert not absorb_is_cheaper(1024, 4096 + 1024, **v3)     # a long chunk re-expands


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_numerics_match_transformers(tiny, make_real_model, family):
    """Prefill, a decode step and training gradients of a random model agree with
    transformers' eager reference (the absorbed form is an exact rewrite)."""
    import torch

    model = make_real_model(tiny[family])
    ids, nxt = torch.randint(0, 512, (2, 12)), torch.randint(0, 512, (2, 1))

    def infer():
        with torch.no_grad():
            first = model(input_ids=ids, use_cache=True)
            return first.logits, model(input_ids=nxt, use_cache=True,
                                       **{cache_keyword(model): output_cache(first)}).logits

    def grads():
        model.zero_grad()
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        model.eval()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    reference, reference_grads = infer(), grads()
    with mla_context(model.config, None):
        ours, our_grads = infer(), grads()
    for a, b in zip(reference, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert our_grads.keys() == reference_grads.keys()
    for name, g in reference_grads.items():
        torch.testing.assert_close(our_grads[name], g, rtol=1e-5, atol=1e-6)


def test_patches_do_not_leak(captured, tiny):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention

    classes = (DeepseekV2Attention, DeepseekV3Attention, DeepseekV32Attention,
               DeepseekV4Attention)
    before = {c: c.__dict__["forward"] for c in classes}
    for family in tiny:
        captured(family)
    assert {c: c.__dict__["forward"] for c in classes} == before
    with pytest.raises(RuntimeError, match="inside"), mla_context(_Config("deepseek_v3"), None):
        assert DeepseekV3Attention.__dict__["forward"] is not before[DeepseekV3Attention]
        raise RuntimeError("inside")
    assert DeepseekV3Attention.__dict__["forward"] is before[DeepseekV3Attention]


class _Config:
    def __init__(self, model_type: str) -> None:
        self.model_type = model_type
        self.kv_lora_rank = 32


def test_decode_shards_and_rescales_through_the_kernels(captured, host):
    """Serving a batch of 3 at tp = 2: the kernels' outputs follow their queries (the
    formulas declare layout="attention"), so the heads split and the batch is counted once
    — matched by axis sizes alone, the batch-1 capture's size-1 axes took the batch twice."""
    from zrt_core.estimate import CapturedModel
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.hardware import HardwareSpec
    from zrt_core.strategy import InferSpec, Parallel, check_layout

    hw = HardwareSpec.from_mapping({
        "id": "toy", "name": "Toy", "vendor": "nvidia",
        "compute": {"fp32": 10, "bf16": 100, "fp16": 100},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": 8}, {"name": "net", "bandwidth_gb_per_s": 25,
                                          "latency_us": 5, "devices": None}]})
    for family in ("deepseek_v3", "deepseek_v32"):
        cap = CapturedModel.from_capture(captured(family, batch=1, seq_len=24,
                                                  phases=("prefill", "decode")))
        est = _Estimator(cap, hw, check_layout(Parallel(tp=2), cap.dims),
                         InferSpec(input_len=24, output_len=8), host, "trtllm")
        g = est.graph("decode", 3, 30, kernels=False)
        attn = [n for n in g.nodes if n.op == "deepseek.mla_attention.default"]
        assert attn, family
        for n in attn:
            # out [B 3, 1 token, 4 heads / 2, kv_lora_rank 32], lse [3, 2, 1]
            assert [t.shape for t in n.outputs] == [(3, 1, 2, 32), (3, 2, 1)], family
        o_proj = [n for n in g.nodes if n.module_path.endswith("o_proj")
                  and n.op == "aten.mm.default"]
        # 3 rows (sequences x 1 token) of 2 heads x v_head_dim 20
        assert o_proj and all(n.inputs[0].shape == (3, 40) for n in o_proj), family


def test_kimi_k2_captures_as_deepseek_v3(host, core_host, tiny):
    # Kimi K2's model_type is the plugin's: the same tiny dimensions as deepseek_v3 capture to
    # the same graphs, MLA patched (absorbed decode, expanded prefill); without the plugin the
    # type is unknown and the error says which model_type a plugin can supply
    from zrt_core.capture.api import capture
    from zrt_core.errors import ZrtError

    kimi = {**tiny["deepseek_v3"], "model_type": "kimi_k2"}
    r = capture(kimi, host=host, batch=2, seq_len=16)
    v3 = capture(tiny["deepseek_v3"], host=host, batch=2, seq_len=16)
    for phase in Phase.CAPTURED:
        assert [n.op for n in r.graphs[phase].nodes] == [n.op for n in v3.graphs[phase].nodes]
    assert [n.layer_index for n in _ops(r.graphs[Phase.DECODE], MLA_OP)] == [0, 1]
    with pytest.raises(ZrtError, match="kimi_k2"):
        capture(kimi, host=core_host, batch=2, seq_len=16)
