"""DeepSeek configs the plugin bundles: registered, resolvable, and counted as published."""

from __future__ import annotations

import pytest

from zrt_core.analytic.flops import param_counts


@pytest.mark.parametrize(("key", "alias"), [("deepseek-r1", "deepseek-ai/DeepSeek-R1-0528"),
                                            ("deepseek-v3.1", "deepseek-v3.1-terminus")])
def test_bundled_configs(host, key, alias):
    model = host.models.get(key)
    assert host.models.get(alias) is model
    counts = param_counts(model.config_dict())
    # DeepSeek-V3's architecture: 671.026 B weights, 37.552 B active (embedding and head in)
    assert round(counts.total / 1e9, 3) == model.total_params_b == 671.026
    assert round(counts.active / 1e9, 3) == model.active_params_b == 37.552
    assert model.config_dict() == dict(host.models.get("deepseek-v3").config_dict())



def test_kimi_k2_is_a_model_type_built_as_deepseek_v3(host):
    # transformers registers no kimi_k2 (a checkpoint's own config.json names it): the plugin
    # builds it as DeepSeek-V3 with Kimi's dimensions — the core's bundled kimi-k2, which
    # spells its model_type deepseek_v3, under its own name
    fields = {**host.models.get("kimi-k2").config_dict(), "model_type": "kimi_k2"}
    kimi = host.model_types.get("kimi_k2")
    config = kimi.config_class()(**fields)
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    assert isinstance(config, DeepseekV3Config) and config.model_type == "kimi_k2"
    assert (config.n_routed_experts, config.first_k_dense_replace) == (384, 1)
    assert kimi.model_class() is DeepseekV3ForCausalLM
    # 1 026.408 B weights, 32.862 B active (embedding and head in), as the bundled copy
    counts = param_counts(fields)
    assert (round(counts.total / 1e9, 3), round(counts.active / 1e9, 3)) == (1026.408, 32.862)
