"""Every bundled config builds in transformers, reads as ModelDims, and its analytic
parameter count agrees with the published figure."""

from __future__ import annotations

import pytest

from zrt_core.analytic.flops import param_counts
from zrt_core.capture.sources import resolve_model, transformers_config
from zrt_core.errors import ModelError
from zrt_core.modelinfo import ModelDims
from zrt_core.models import load_bundled
from zrt_core.plugins import get_plugin_manager

BUNDLED = load_bundled()
# Families the analytic model does not describe; a new entry here must be a decision.
NO_ANALYTIC_MODEL = {"deepseek-v4-flash"}
TOLERANCE = 0.02


@pytest.mark.parametrize("model", BUNDLED, ids=lambda m: m.key)
def test_builds_a_transformers_config(model):
    cfg = transformers_config(model.config_dict(), where=model.key)
    dims = ModelDims.from_config(model.config_dict())
    assert cfg.model_type == model.model_type
    assert dims.layers == cfg.num_hidden_layers
    assert dims.vocab == cfg.vocab_size
    # zrt reads tie_word_embeddings with the family's default the way transformers does.
    assert dims.tie_word_embeddings == bool(getattr(cfg, "tie_word_embeddings", False))


@pytest.mark.parametrize("model", [m for m in BUNDLED if m.total_params_b],
                         ids=lambda m: m.key)
def test_analytic_params_match_published(model):
    if model.key in NO_ANALYTIC_MODEL:
        with pytest.raises(ModelError, match="no analytic model"):
            param_counts(model.config_dict())
        return
    counts = param_counts(model.config_dict())
    total_b = counts.total / 1e9
    assert abs(total_b - model.total_params_b) <= TOLERANCE * model.total_params_b, (
        f"{model.key}: analytic {total_b:.3f}B vs published {model.total_params_b}B")
    if model.active_params_b:
        active_b = counts.active / 1e9
        assert abs(active_b - model.active_params_b) <= TOLERANCE * model.active_params_b, (
            f"{model.key}: analytic active {active_b:.3f}B vs {model.active_params_b}B")


@pytest.mark.parametrize("model", [m for m in BUNDLED if not m.total_params_b],
                         ids=lambda m: m.key)
def test_unpublished_counts_are_computed(model):
    """`zrt models` shows a count for every entry: published, else analytic."""
    assert model.key not in NO_ANALYTIC_MODEL
    counts = param_counts(model.config_dict())
    assert 0 < counts.active <= counts.total


def test_keys_and_aliases_resolve():
    host = get_plugin_manager(autoload=False)
    for model in BUNDLED:
        for name in (model.key, *model.aliases):
            resolved = resolve_model(name, host, check_model_type=False)
            assert resolved.bundled is not None and resolved.bundled.key == model.key


def test_popular_models_are_bundled():
    keys = {m.key for m in BUNDLED}
    for key in ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b",
                "llama4-scout", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "qwen3-32b",
                "qwen3-30b-a3b", "mistral-7b-v0.3", "mistral-small-24b", "mixtral-8x7b",
                "mixtral-8x22b", "gemma2-9b", "gemma2-27b", "gemma3-12b", "gemma3-27b",
                "phi3-mini", "phi3-medium", "phi4", "gpt2", "opt-6.7b", "opt-66b",
                "bloom-7b1", "deepseek-v3.2", "deepseek-v2-lite", "gpt-oss-20b",
                "nemotron-h-8b"):
        assert key in keys, key


def test_gpt2_exact_count():
    # GPT-2 small, h=768, 12 layers, vocab 50257, 1024 positions, tied head:
    # embeddings 50257·768 + 1024·768 = 38,597,376 + 786,432 = 39,383,808
    # per layer: ln 2·1536 + c_attn 768·2304+2304 + proj 768·768+768 + fc 768·3072+3072
    #            + proj 3072·768+768 = 3,072 + 1,771,776 + 590,592 + 2,362,368 + 2,360,064
    #            = 7,087,872; ×12 = 85,054,464; final ln 1,536
    # total 39,383,808 + 85,054,464 + 1,536 = 124,439,808
    gpt2 = next(m for m in BUNDLED if m.key == "gpt2")
    assert param_counts(gpt2.config_dict()).total == 124_439_808


def test_a_plugin_bundles_configs_by_key_and_alias(register_plugin):
    from zrt_core import hookimpl
    from zrt_core.errors import PluginError
    from zrt_core.models import BundledModel

    tiny = BundledModel(key="toy-llama", name="Toy Llama", aliases=("acme/toy",),
                        hf_config={"model_type": "llama", "hidden_size": 64})
    clash = BundledModel(key="llama3-8b", name="Another", hf_config={"model_type": "llama"})

    class Pack:
        def __init__(self, *models):
            self.models = list(models)

        @hookimpl
        def zrt_model_configs(self):
            return self.models

    host = register_plugin(Pack(tiny), "toy_pack", distribution="zrt-toy")
    assert host.models.get("ACME/Toy") is tiny
    assert host.models.distribution_of("toy-llama") == "zrt-toy"
    assert resolve_model("acme/toy", host).config["hidden_size"] == 64
    register_plugin(Pack(clash), "clash_pack", distribution="zrt-clash")
    with pytest.raises(PluginError, match="'llama3-8b' is contributed twice: by 'zrt-core' "
                                          "and by 'zrt-clash'"):
        host.models.get("toy-llama")
