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
