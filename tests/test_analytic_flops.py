"""Analytic parameter and FLOP counts on tiny dimensions, with the arithmetic beside each."""

from __future__ import annotations

import pytest

from zrt_core.analytic.arch import architecture
from zrt_core.analytic.flops import (
    causal_keys,
    decode_flops,
    decode_keys,
    flops_gap,
    param_counts,
    phase_flops,
    prefill_flops,
    train_backward_flops,
    train_forward_flops,
)
from zrt_core.errors import ModelError

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "tie_word_embeddings": False}

MLA = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 32,
       "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
       "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
       "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "q_lora_rank": 32,
       "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
       "vocab_size": 128, "tie_word_embeddings": False}

NEMOTRON_H = {"model_type": "nemotron_h", "hybrid_override_pattern": "M*-E",
              "num_hidden_layers": 4, "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
              "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 2,
              "conv_kernel": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 32,
              "n_group": 1, "topk_group": 1, "vocab_size": 128, "tie_word_embeddings": False}


# -- parameters -------------------------------------------------------------------------


def test_dense_params():
    c = param_counts(LLAMA)
    # per layer: q 64·64 + k 64·32 + v 64·32 + o 64·64 = 12,288; MLP 3·64·128 = 24,576;
    # two RMSNorms 128 → 36,992; ×2 layers = 73,984
    # embedding 256·64 = 16,384; head 16,384; final norm 64
    assert c.total == 16_384 + 73_984 + 64 + 16_384 == 106_816
    assert c.active == c.total
    assert c.layer_matmul_active == 2 * (12_288 + 24_576) == 73_728
    assert (c.embedding, c.head, c.head_matmul) == (16_384, 16_384, 16_384)


def test_tied_head_counts_once():
    c = param_counts(dict(LLAMA, tie_word_embeddings=True))
    assert c.total == 106_816 - 16_384 and c.head == 0 and c.head_matmul == 16_384


def test_mla_moe_params():
    c = param_counts(MLA)
    # attention: q_a 64·32 + q_b 32·4·12 + kv_a 64·20 + kv_b 16·4·16 + o 4·8·64
    #          = 2,048 + 1,536 + 1,280 + 1,024 + 2,048 = 7,936; q_a/kv_a norms 32 + 16 = 48
    # layer 0 (dense): 7,936 + 48 + MLP 3·64·32 = 6,144 + norms 128 = 14,256
    # layer 1 (MoE): 7,936 + 48 + router 64·4 = 256 + shared 3·64·16 = 3,072
    #               + experts 4·3,072 = 12,288 + correction bias 4 + norms 128 = 23,732
    # embedding 8,192 + head 8,192 + final norm 64
    assert c.total == 8_192 + 14_256 + 23_732 + 64 + 8_192 == 54_436
    assert c.active == 54_436 - 2 * 3_072  # two of four experts unused
    assert c.layer_matmul_active == (7_936 + 6_144) + (7_936 + 256 + 3_072 + 2 * 3_072)


def test_nemotron_h_params():
    arch = architecture(NEMOTRON_H)
    assert [layer.kind for layer in arch.layers] == ["mamba", "attention", "mlp", "moe"]
    mamba = arch.layers[0]
    # inner 4·8 = 32, conv_dim 32 + 2·2·8 = 64; in_proj 32·(32 + 64 + 4) = 3,200,
    # out_proj 32·32 = 1,024 → 4,224 matmul
    # conv 64·4 + 64 bias = 320; dt_bias, A_log, D 3·4 = 12; gated norm 32; block norm 32
    assert mamba.matmul_params == 4_224
    assert mamba.other_params == 320 + 12 + 32 + 32
    moe = arch.layers[3]
    # router 32·4 = 128 + shared up/down 2·32·32 = 2,048; experts 4·(2·32·16) = 4,096
    assert moe.matmul_params == 2_176 and moe.expert_params == 4_096
    assert moe.active_expert_params == 2_048


FAMILIES = {
    "llama": LLAMA,
    "qwen2": dict(LLAMA, model_type="qwen2"),
    "qwen3": dict(LLAMA, model_type="qwen3", head_dim=16),
    "mistral_window": dict(LLAMA, model_type="mistral", sliding_window=8),
    "phi3": dict(LLAMA, model_type="phi3"),
    "gemma2": dict(LLAMA, model_type="gemma2", head_dim=16, num_hidden_layers=3),
    "gemma3_text": dict(LLAMA, model_type="gemma3_text", head_dim=16, num_hidden_layers=7,
                        sliding_window=8),
    "mixtral": dict(LLAMA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(LLAMA, model_type="qwen3_moe", head_dim=16, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32),
    "deepseek_v3": MLA,
    "deepseek_v2_no_q_lora": dict(MLA, model_type="deepseek_v2", q_lora_rank=None,
                                  topk_method="greedy"),
    "deepseek_v32": dict(MLA, model_type="deepseek_v32", index_n_heads=2, index_head_dim=8,
                         index_topk=4),
    "gpt_oss": dict(LLAMA, model_type="gpt_oss", head_dim=16, num_local_experts=4,
                    num_experts_per_tok=2, intermediate_size=32, attention_bias=True,
                    sliding_window=4),
    "llama4_text": dict(LLAMA, model_type="llama4_text", head_dim=16, intermediate_size=32,
                        intermediate_size_mlp=64, num_local_experts=4, num_experts_per_tok=1,
                        interleave_moe_layer_step=2, attention_chunk_size=8,
                        num_hidden_layers=4),
    "nemotron_h": NEMOTRON_H,
    "nemotron": dict(LLAMA, model_type="nemotron", head_dim=16),
    # ERNIE 4.5's MoE keys: moe_k, moe_num_shared_experts, a first dense layer
    "ernie4_5_moe": dict(LLAMA, model_type="ernie4_5_moe", num_hidden_layers=3,
                         moe_num_experts=4, moe_k=2, moe_intermediate_size=32,
                         moe_num_shared_experts=1, moe_layer_start_index=1,
                         moe_layer_end_index=2, moe_layer_interval=1),
    # Tencent HunYuan: top-k as moe_topk (a per-layer list), every expert and the one shared
    # MLP at intermediate_size whatever moe_intermediate_size / num_shared_expert say
    "hunyuan_v1_moe": dict(LLAMA, model_type="hunyuan_v1_moe", head_dim=16, num_experts=4,
                           moe_topk=[2, 2], moe_intermediate_size=[32, 32],
                           num_shared_expert=[1, 1], use_qk_norm=True),
    # Mamba-2 hybrids with an MLP / MoE in every layer (IBM Bamba, Granite 4.0-H)
    "bamba": dict(LLAMA, model_type="bamba", attn_layer_indices=[1], mamba_n_heads=8,
                  mamba_d_head=16, mamba_expand=2, mamba_n_groups=1, mamba_d_state=16,
                  mamba_d_conv=4, mamba_chunk_size=8),
    "granitemoehybrid": dict(LLAMA, model_type="granitemoehybrid",
                             layer_types=["mamba", "attention"], mamba_n_heads=8,
                             mamba_d_head=16, mamba_expand=2, mamba_n_groups=1,
                             mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8,
                             num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=32),
    "granitemoehybrid_dense": dict(LLAMA, model_type="granitemoehybrid",
                                   layer_types=["mamba", "attention"], mamba_n_heads=8,
                                   mamba_d_head=16, mamba_expand=2, mamba_n_groups=1,
                                   mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8,
                                   num_local_experts=0, shared_intermediate_size=96),
    # Adept Persimmon: LayerNorms with biases, biased linears, ReLU² ungated MLP, qk norms
    "persimmon": dict(LLAMA, model_type="persimmon", num_key_value_heads=4),
    # XGLM's keys (d_model, ffn_dim, num_layers, attention_heads); GPT-2-like layers
    "xglm": {"model_type": "xglm", "d_model": 64, "ffn_dim": 128, "num_layers": 2,
             "attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 64},
    # GPT-Neo: learned positions, global and 4-key local layers, biased out_proj and MLP
    "gpt_neo": {"model_type": "gpt_neo", "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                "vocab_size": 256, "max_position_embeddings": 64, "window_size": 4,
                "attention_types": [[["global", "local"], 1]]},
    # up → ReLU² / xIELU → down, no gate (Arcee AFM, Swiss AI Apertus)
    "arcee": dict(LLAMA, model_type="arcee", hidden_act="relu2"),
    "apertus": dict(LLAMA, model_type="apertus", hidden_act="xielu"),
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
             "n_positions": 32, "vocab_size": 256},
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 32,
            "word_embed_proj_dim": 32},
    "bloom": {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4,
              "vocab_size": 256},
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_params_equal_the_built_model(name):
    """The analytic count equals the parameters transformers builds (on the meta device),
    plus the router correction bias, which transformers keeps as a buffer but checkpoints
    store as a weight."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.sources import transformers_config

    config = FAMILIES[name]
    # Token ids only have to fit the tiny vocabulary; they hold no weights.
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(transformers_config({**config, **ids}))
    built = sum(p.numel() for p in model.parameters())
    built += sum(b.numel() for n, b in model.named_buffers()
                 if n.endswith("e_score_correction_bias"))
    assert param_counts(config).total == built


# -- keys per query ---------------------------------------------------------------------


def test_causal_keys():
    assert causal_keys(8) == 36  # 8·9/2
    assert causal_keys(10, window=4) == 34  # 4·5/2 + 6·4 = 10 + 24
    assert causal_keys(3, window=4) == 6  # shorter than the window: 3·4/2
    assert causal_keys(10, chunk=4) == 23  # two full chunks 2·(4·5/2) + a chunk of 2: 3


def test_decode_keys():
    assert decode_keys(8) == 9  # the 8 cached keys and itself
    assert decode_keys(10, window=4) == 4
    assert decode_keys(10, chunk=4) == 3  # 10 mod 4 + 1: the third token of its chunk


# -- phases -----------------------------------------------------------------------------


def test_prefill_dense():
    f = prefill_flops(LLAMA, batch=2, seq_len=8)
    # matmul 2·73,728·16 tokens = 2,359,296
    # attention per layer per sequence 2·4 heads·36 keys·(16 + 16) = 9,216; ×2 layers ×2 seqs
    # lm head for the last token of each sequence: 2·16,384·2 = 65,536
    assert (f.matmul, f.attention, f.ssm, f.lm_head) == (2_359_296, 36_864, 0, 65_536)
    assert f.total == 2_461_696 and f.tokens == 16


def test_decode_dense():
    f = decode_flops(LLAMA, batch=2, kv_len=8)
    # matmul 2·73,728·2 = 294,912; attention 2·4·9·32 = 2,304 per layer → ×2 layers ×2 seqs
    assert (f.matmul, f.attention, f.lm_head) == (294_912, 9_216, 65_536)
    assert f.total == 369_664


def test_training_is_three_forwards():
    fwd = train_forward_flops(LLAMA, batch=2, seq_len=8)
    # logits for all 16 positions: 2·16,384·16 = 524,288
    assert fwd.lm_head == 524_288
    assert fwd.total == 2_359_296 + 36_864 + 524_288 == 2_920_448
    bwd = train_backward_flops(LLAMA, batch=2, seq_len=8)
    assert bwd.total == 2 * fwd.total
    assert phase_flops(LLAMA, "train_backward", 2, 8) == bwd


def test_forward_per_token_is_two_n_plus_attention():
    """The acceptance rule: forward FLOPs / token = 2·N_active + attention terms."""
    cfg = dict(LLAMA, num_hidden_layers=3)
    f = train_forward_flops(cfg, batch=1, seq_len=16)
    n = param_counts(cfg)
    assert f.total == 2 * (n.layer_matmul_active + n.head_matmul) * 16 + f.attention


def test_sliding_window_prefill():
    cfg = dict(LLAMA, model_type="mistral", sliding_window=4)
    f = prefill_flops(cfg, batch=1, seq_len=10)
    # 34 keys (see test_causal_keys) · 2·4·32 per layer, 2 layers
    assert f.attention == 2 * (2 * 4 * 34 * 32) == 17_408


def test_gemma3_layer_pattern():
    cfg = FAMILIES["gemma3_text"]  # 7 layers: 5 sliding, 1 full, 1 sliding
    kinds = [layer.kind for layer in architecture(cfg).layers]
    assert kinds == ["dense_sliding"] * 5 + ["dense_full", "dense_sliding"]
    f = prefill_flops(cfg, batch=1, seq_len=16)
    # sliding (window 8): 8·9/2 + 8·8 = 100 keys; full: 16·17/2 = 136 keys
    # per key 2·4 heads·(16 + 16) = 256 FLOPs
    assert f.attention == 256 * (6 * 100 + 136)


def test_mla_decode_uses_absorbed_dims():
    f = decode_flops(MLA, batch=1, kv_len=5)
    # 6 keys · 2·4 heads·((16 + 4) + 16) = 1,728 per layer, 2 layers
    assert f.attention == 3_456
    p = prefill_flops(MLA, batch=1, seq_len=6)
    # 21 keys · 2·4·(12 + 8) = 3,360 per layer
    assert p.attention == 6_720
    assert p.matmul == 2 * 31_488 * 6


def test_dsa_sparse_attention_and_indexer():
    cfg = FAMILIES["deepseek_v32"]  # top-4 keys; indexer 2 heads × 8
    f = prefill_flops(cfg, batch=1, seq_len=6)
    # main, longer than top-k so MLA's absorbed form: keys min(i, 4) for i = 1..6
    # → 1+2+3+4+4+4 = 18; 2·4·18·((16 + 4) + 16) = 5,184 per layer
    # indexer: all 21 causal keys · 2·2·(8 + 1) = 756 per layer
    assert f.attention == 2 * (5_184 + 756)
    short = prefill_flops(cfg, batch=1, seq_len=4)
    # no longer than top-k: dense masked MHA, 10 causal keys · 2·4·(12 + 8) = 1,600;
    # indexer 10 · 2·2·9 = 360
    assert short.attention == 2 * (1_600 + 360)


def test_llama4_chunked_and_moe_interleave():
    arch = architecture(FAMILIES["llama4_text"])
    # MoE every 2nd layer; RoPE layers use chunked attention, every 4th layer is global.
    assert [layer.kind for layer in arch.layers] == [
        "dense_chunked", "moe_chunked", "dense_chunked", "moe_full"]
    assert arch.layers[0].attention.chunk == 8 and arch.layers[3].attention.chunk is None


def test_mamba_ssm_flops():
    f = prefill_flops(NEMOTRON_H, batch=1, seq_len=4)
    # conv 2·4·64 = 512 + scan 5·32·8 = 1,280 → 1,792 per token, one Mamba layer, 4 tokens
    assert f.ssm == 7_168
    d = decode_flops(NEMOTRON_H, batch=3, kv_len=4)
    assert d.ssm == 3 * 1_792


def test_moe_forward_uses_active_experts_only():
    cfg = FAMILIES["mixtral"]
    n = param_counts(cfg)
    # per layer: attention 12,288 + router 64·4 = 256 + 2 of 4 experts (3·64·128 each)
    assert n.layer_matmul_active == 2 * (12_288 + 256 + 2 * 24_576)
    f = prefill_flops(cfg, batch=1, seq_len=4)
    assert f.matmul == 2 * n.layer_matmul_active * 4


def test_hunyuan_reads_moe_topk_and_sizes_experts_as_transformers_builds_them():
    from zrt_core.modelinfo import ModelDims

    cfg = FAMILIES["hunyuan_v1_moe"]
    d = ModelDims.from_config(cfg)
    # top-k from the per-layer moe_topk list; experts and the shared MLP at
    # intermediate_size 128 (transformers' HunYuanMoEV1Experts / HunYuanMoEV1MLP), not
    # moe_intermediate_size 32
    assert (d.top_k, d.moe_ffn, d.shared_expert_ffn) == (2, 128, 128)
    n = param_counts(cfg)
    # per layer: attention 64·64·2 + 32·64·2 = 12,288, router 64·4 = 256, the shared MLP
    # 3·64·128 = 24,576 and 2 of 4 experts at 24,576 each
    assert n.layer_matmul_active == 2 * (12_288 + 256 + 24_576 + 2 * 24_576)
    with pytest.raises(ModelError, match=r"moe_topk differs across layers \(\[1, 2\]\)"):
        ModelDims.from_config(dict(cfg, moe_topk=[2, 1]))


def test_bad_inputs():
    with pytest.raises(ModelError, match="batch must be a positive integer"):
        prefill_flops(LLAMA, batch=0, seq_len=4)
    with pytest.raises(ModelError, match="sequence length must be a positive integer"):
        decode_flops(LLAMA, batch=1, kv_len=-1)
    with pytest.raises(ModelError, match="unknown phase 'optimizer'"):
        phase_flops(LLAMA, "optimizer", 1, 4)
    with pytest.raises(ModelError, match="no analytic model for model_type 'deepseek_v4'"):
        architecture({"model_type": "deepseek_v4", "hidden_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "vocab_size": 128})
    with pytest.raises(ModelError, match="config has no hidden size"):
        param_counts({"model_type": "llama", "num_hidden_layers": 2})


def test_flops_gap():
    assert flops_gap(110, 100) == pytest.approx(0.10)
    assert flops_gap(50, 0) is None


def test_nemotron_h_as_transformers_saves_it():
    """transformers' to_dict has ``layers_block_type`` and no ``num_hidden_layers``."""
    saved = {k: v for k, v in NEMOTRON_H.items()
             if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    saved["layers_block_type"] = ["linear_attention", "full_attention", "mlp", "moe"]
    assert param_counts(saved) == param_counts(NEMOTRON_H)
    assert architecture(saved).dims.moe_layers == 1


def test_a_frozen_config_reads_its_lists_as_given():
    """A config read back from a capture or a validation record holds tuples where the JSON
    had lists (``ir.graph._freeze``): per-layer lists still set the layers, as lists do."""
    from zrt_core.checks import check_config
    from zrt_core.ir.graph import _freeze

    saved = {k: v for k, v in NEMOTRON_H.items()
             if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    saved["layers_block_type"] = ["linear_attention", "full_attention", "mlp", "moe"]
    frozen = _freeze(saved)
    assert check_config(frozen).layers == 4  # was: "config has no layer count"
    assert param_counts(frozen) == param_counts(NEMOTRON_H)
    # an explicit layer pattern that the family's default rule would not give
    gemma = dict(FAMILIES["gemma3_text"], num_hidden_layers=2,
                 layer_types=["full_attention", "sliding_attention"])
    kinds = [layer.kind for layer in architecture(_freeze(gemma)).layers]
    assert kinds == [layer.kind for layer in architecture(gemma).layers] == \
        ["dense_full", "dense_sliding"]
