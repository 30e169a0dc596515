"""Tiny configs of every family the harness supports, and a cached capture per config.

Every config is 2-4 layers of hidden 64-128 so a capture of all four phases takes well
under a second; ``captured(name, **options)`` memoises results across tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.plugins import PluginHost, get_plugin_manager

_LLAMA_LIKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)

TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_LLAMA_LIKE),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=3, n_head=4, vocab_size=512,
                 n_positions=256),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512, mlp_only_layers=[0]),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=2, topk_group=1,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                        q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32,
                        v_head_dim=32, vocab_size=512),
}


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
