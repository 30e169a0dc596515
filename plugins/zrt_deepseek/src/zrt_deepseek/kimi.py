"""Kimi K2 as a model type: transformers registers no ``kimi_k2``; Moonshot's checkpoints
(moonshotai/Kimi-K2-Base, -Instruct) carry DeepSeek-V3's modelling code through ``auto_map``
(``configuration_deepseek.DeepseekV3Config``, ``modeling_deepseek.DeepseekV3ForCausalLM``),
so the model is transformers' DeepSeek-V3 built from the config's own fields."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def kimi_k2_config_class() -> Any:
    """transformers' ``DeepseekV3Config`` under Kimi K2's ``model_type`` (one class per
    process, so configs built from it compare and cache alike)."""
    from transformers import DeepseekV3Config

    class KimiK2Config(DeepseekV3Config):
        model_type = "kimi_k2"

    return KimiK2Config
