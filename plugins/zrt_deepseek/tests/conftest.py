"""Tiny DeepSeek configs of every version, plugin hosts with and without zrt_deepseek, and a
memoised capture per (config, host, options).

Every config is 2-3 layers of hidden 128 so a capture of all four phases takes about a
second. The numbers the tests assert are derived from these dimensions in comments.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.plugins import PluginHost, get_plugin_manager

_MLA = dict(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, kv_lora_rank=32, qk_rope_head_dim=16,
            qk_nope_head_dim=24, v_head_dim=20, vocab_size=512)

TINY: dict[str, dict[str, Any]] = {
    # H = 4 heads; r = kv_lora_rank 32, rope 16, nope 24, v 20: the cache row is r + rope
    # = 48 values, an expanded head is 24 + 16 = 40 (q/k) and 20 (v) wide.
    "deepseek_v2": dict(model_type="deepseek_v2", q_lora_rank=None, topk_method="greedy",
                        **_MLA),
    "deepseek_v3": dict(model_type="deepseek_v3", q_lora_rank=48, n_group=2, topk_group=1,
                        **_MLA),
    # DSA: 2 index heads × 32, top-8 keys (prefill of 16 tokens is longer than top-k).
    "deepseek_v32": dict(model_type="deepseek_v32", q_lora_rank=48, n_group=2, topk_group=1,
                         index_n_heads=2, index_head_dim=32, index_topk=8, **_MLA),
    # V4: one layer of each attention kind; window 8, CSA every 4 tokens (top-3 entries),
    # HCA every 8; 4 heads of 64 sharing one K=V head; 2 hyper-connection streams.
    "deepseek_v4": dict(model_type="deepseek_v4", hidden_size=128, moe_intermediate_size=64,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=64, q_lora_rank=48, o_groups=2, o_lora_rank=32,
                        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                        sliding_window=8, index_n_heads=2, index_head_dim=32, index_topk=3,
                        hc_mult=2, vocab_size=512,
                        layer_types=["sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention"],
                        compress_rates={"compressed_sparse_attention": 4,
                                        "heavily_compressed_attention": 8},
                        mlp_layer_types=["hash_moe", "moe", "moe"]),
}


@pytest.fixture(scope="session")
def tiny() -> dict[str, dict[str, Any]]:
    return TINY


@pytest.fixture(scope="session")
def core_host() -> PluginHost:
    """The core's plugins only: transformers' reference graphs."""
    return get_plugin_manager(autoload=False)


@pytest.fixture(scope="session")
def host() -> PluginHost:
    """The core plus this plugin, and nothing else that may be installed."""
    import zrt_deepseek.plugin

    h = get_plugin_manager(autoload=False)
    h.register(zrt_deepseek.plugin, name="zrt_deepseek")
    return h


_CACHE: dict[tuple, Any] = {}


@pytest.fixture(scope="session")
def captured(host: PluginHost, core_host: PluginHost):
    """``captured(family, plugin=True, **options)`` → a memoised ``CaptureResult``
    (batch 2, sequence 16 unless given)."""
    from zrt_core.capture.api import capture

    def run(family: str, plugin: bool = True, **options: Any) -> Any:
        opts = {"batch": 2, "seq_len": 16, **options}
        key = (family, plugin, tuple(sorted((k, repr(v)) for k, v in opts.items())))
        if key not in _CACHE:
            _CACHE[key] = capture(TINY[family], host=host if plugin else core_host, **opts)
        return _CACHE[key]

    return run


def real_model(config: dict[str, Any], seed: int = 0) -> Any:
    """A float32 model with random weights and eager attention, for numerical checks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    hf = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    hf._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.05)
    return model


@pytest.fixture(scope="session")
def make_real_model():
    return real_model
