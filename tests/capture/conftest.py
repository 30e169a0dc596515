"""Tiny configs of every supported family, the plugin host, and memoised captures.

Every config is 2-4 layers of hidden 128: small enough that capturing all four phases
takes well under a second, real enough to exercise each family's structure (MoE, MLA,
sliding/chunked attention, Mamba, sinks...). ``tiny`` gives the configs by family name;
``captured(family, **options)`` returns one :class:`CaptureResult` per distinct call, so
tests that look at the same capture share it.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.plugins import PluginHost, get_plugin_manager

_LLAMA_LIKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)

TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_LLAMA_LIKE),
    "mistral": dict(model_type="mistral", sliding_window=8, **_LLAMA_LIKE),
    "qwen2": dict(model_type="qwen2", use_sliding_window=True, sliding_window=8,
                  max_window_layers=1, layer_types=["full_attention", "sliding_attention",
                                                   "sliding_attention"], **_LLAMA_LIKE),
    "qwen3": dict(model_type="qwen3", head_dim=32, **_LLAMA_LIKE),
    "phi3": dict(model_type="phi3", pad_token_id=0, **_LLAMA_LIKE),
    "nemotron": dict(model_type="nemotron", head_dim=32, partial_rotary_factor=0.5,
                     **_LLAMA_LIKE),
    "gemma2": dict(model_type="gemma2", head_dim=32, sliding_window=8, **_LLAMA_LIKE),
    "gemma3": dict(model_type="gemma3_text", head_dim=32, sliding_window=8,
                   sliding_window_pattern=2, **{**_LLAMA_LIKE, "num_hidden_layers": 4}),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=3, n_head=4, vocab_size=512,
                 n_positions=256, bos_token_id=0, eos_token_id=0),
    "opt": dict(model_type="opt", hidden_size=128, ffn_dim=256, num_hidden_layers=3,
                num_attention_heads=4, vocab_size=512, word_embed_proj_dim=128,
                max_position_embeddings=256, pad_token_id=1, bos_token_id=0,
                eos_token_id=0),
    "bloom": dict(model_type="bloom", hidden_size=128, n_layer=3, n_head=4, vocab_size=512),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2,
                    **_LLAMA_LIKE),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512, mlp_only_layers=[0]),
    "llama4": dict(model_type="llama4_text", hidden_size=128, intermediate_size=64,
                   intermediate_size_mlp=256, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=32, num_local_experts=4,
                   num_experts_per_tok=1, interleave_moe_layer_step=2,
                   attention_chunk_size=8, vocab_size=512, no_rope_layer_interval=4),
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=128, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=8, vocab_size=512),
    "deepseek_v2": dict(model_type="deepseek_v2", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16,
                        qk_nope_head_dim=32, v_head_dim=32, vocab_size=512,
                        topk_method="greedy"),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=2, topk_group=1,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                        q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32,
                        v_head_dim=32, vocab_size=512),
    "deepseek_v32": dict(model_type="deepseek_v32", hidden_size=128, intermediate_size=256,
                         moe_intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                         num_experts_per_tok=2, n_group=2, topk_group=1,
                         n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                         q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32,
                         v_head_dim=32, vocab_size=512, index_n_heads=2,
                         index_head_dim=32, index_topk=8),
    "deepseek_v4": dict(model_type="deepseek_v4", hidden_size=128, moe_intermediate_size=64,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=64, q_lora_rank=48, o_groups=2, o_lora_rank=32,
                        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                        sliding_window=8, index_n_heads=2, index_head_dim=32,
                        index_topk=4, hc_mult=2, vocab_size=512,
                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention",
                                     "compressed_sparse_attention"],
                        mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                        compress_rates={"compressed_sparse_attention": 4,
                                        "heavily_compressed_attention": 8}),
    "nemotron_h": dict(model_type="nemotron_h", hidden_size=128, intermediate_size=256,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, hybrid_override_pattern="M*M-", mamba_num_heads=4,
                       mamba_head_dim=32, ssm_state_size=16, n_groups=2, conv_kernel=4,
                       chunk_size=8, vocab_size=512),
}


@pytest.fixture(scope="session")
def tiny() -> dict[str, dict[str, Any]]:
    """The tiny configs by family name (copy before changing one)."""
    return TINY


@pytest.fixture(scope="session")
def host() -> PluginHost:
    """The core's plugins only: results do not depend on what else is installed."""
    return get_plugin_manager(autoload=False)


_CACHE: dict[tuple, Any] = {}


@pytest.fixture(scope="session")
def captured(host: PluginHost):
    """``captured(family, **options)`` → a memoised :class:`CaptureResult`."""
    from zrt_core.capture.api import capture

    def run(family: str, **options: Any) -> Any:
        opts = {"batch": 2, "seq_len": 16, **options}
        key = (family, tuple(sorted((k, repr(v)) for k, v in opts.items())))
        if key not in _CACHE:
            _CACHE[key] = capture(TINY[family], host=host, **opts)
        return _CACHE[key]

    return run


@pytest.fixture(scope="session")
def matches_count() -> Any:
    """``matches_count(config, result, seq_len, rel)``: every phase of a capture of ``config``
    (batch 2) has the analytic count's FLOPs within ``rel``; the training backward counts
    FlashAttention's recomputed scores as well (a quarter of the forward attention)."""
    from zrt_core.ir.graph import Phase
    from zrt_core.modelmath.flops import phase_flops

    def check(config: dict[str, Any], result: Any, seq_len: int, rel: float) -> None:
        for phase, graph in result.graphs.items():
            length = graph.meta.get("kv_len") if phase == Phase.DECODE else seq_len
            ref = phase_flops(config, str(phase), 2, int(length))
            total = ref.total
            if phase == Phase.TRAIN_BACKWARD:
                total += ref.attention / 4
            assert graph.totals().flops == pytest.approx(total, rel=rel), phase

    return check


@pytest.fixture(scope="session")
def patch_keeps_a_training_step() -> Any:
    """:func:`_patch_keeps_a_training_step`."""
    return _patch_keeps_a_training_step


def _patch_keeps_a_training_step(model: Any, ids: Any, patch: Any) -> None:
    """One training step of ``model`` on ``ids`` (logits, and the gradient of every
    parameter that gets one) equal with and without the ``patch`` context open."""
    import torch

    def run() -> tuple[Any, list[Any]]:
        model.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), [p.grad.clone() for p in model.parameters()
                                     if p.grad is not None]

    ref_logits, ref_grads = run()
    with patch:
        logits, grads = run()
    torch.testing.assert_close(logits, ref_logits)
    assert len(grads) == len(ref_grads)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b)
