"""A plugin supplies a model_type transformers does not build (``zrt_model_types``): the
capture builds it through the plugin's classes; without the plugin the type is refused in
one line that names it and says a plugin can supply it."""

from __future__ import annotations

import pytest

from zrt_core import hookimpl
from zrt_core.capture.api import capture
from zrt_core.capture.model_types import ModelType
from zrt_core.errors import ModelError, PluginError
from zrt_core.ir.graph import Phase

pytest.importorskip("torch")

# h=32, 2 layers of 4 heads (2 KV), FFN 64, vocab 64: a Llama under a name transformers lacks
TINY = {"model_type": "acme-llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 64, "max_position_embeddings": 64, "tie_word_embeddings": False}


def _config_class():
    from huggingface_hub.dataclasses import strict
    from transformers import LlamaConfig

    @strict
    class AcmeConfig(LlamaConfig):
        model_type = "acme-llama"

    return AcmeConfig


def _model_class():
    from transformers import LlamaForCausalLM

    class AcmeForCausalLM(LlamaForCausalLM):
        config_class = _config_class()

    return AcmeForCausalLM


class AcmePlugin:
    @hookimpl
    def zrt_model_types(self):
        return [ModelType(name="acme-llama", config_class=_config_class,
                          model_class=_model_class, description="a renamed Llama")]


def test_a_plugin_model_type_is_captured_through_its_classes(register_plugin) -> None:
    host = register_plugin(AcmePlugin(), "acme", distribution="acme-models")
    assert host.model_types.distribution_of("acme-llama") == "acme-models"
    r = capture(TINY, phases=(Phase.PREFILL,), batch=1, seq_len=16, host=host)
    assert r.model_type == "acme-llama"
    # the same graph as the Llama it renames: per layer q 32·32 + k, v 32·16 each + o 32·32
    # + gate, up, down 32·64 each + 2 norms of 32 = 1024 + 1024 + 1024 + 6144 + 64 = 9280;
    # embedding and head 64·32 each, final norm 32: 2·9280 + 2·2048 + 32 = 22688
    assert r.params.total == 22688
    llama = capture({**TINY, "model_type": "llama"}, phases=(Phase.PREFILL,), batch=1,
                    seq_len=16, host=host)
    assert r.graphs[Phase.PREFILL].totals().flops == llama.graphs[Phase.PREFILL].totals().flops


def test_without_the_plugin_the_type_is_one_line_naming_it(core_host) -> None:
    with pytest.raises(ModelError) as info:
        capture(TINY, phases=(Phase.PREFILL,), batch=1, seq_len=16, host=core_host)
    text = str(info.value)
    assert "unknown model_type 'acme-llama'" in text
    assert "no installed zrt plugin provides it" in text
    assert "install a zrt plugin that supplies 'acme-llama'" in text
    assert "\n" not in text


def test_a_model_type_given_twice_names_both_plugins(register_plugin) -> None:
    register_plugin(AcmePlugin(), "acme", distribution="acme-models")
    host = register_plugin(AcmePlugin(), "acme-again", distribution="other-models")
    with pytest.raises(PluginError, match="'acme-models' and by 'other-models'"):
        host.model_types  # noqa: B018
