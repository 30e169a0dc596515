"""The KV cache reaches every patched attention forward, whatever keyword transformers uses.

transformers 5.24 passes the cache to attention modules as ``cache=`` where 5.23 passed
``past_key_values=`` (BLOOM/Falcon: ``layer_past=``). A patch that reads one name sees no cache
on the other version and decodes against the new token alone; capture must refuse that graph.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from zrt_core.capture.api import capture  # noqa: E402
from zrt_core.capture.compat import cache_keyword, output_cache, take_cache  # noqa: E402
from zrt_core.errors import InternalError  # noqa: E402


class _Cache:
    def __init__(self, name: str) -> None:
        self.name = name


def test_take_cache_reads_every_name_and_pops_them():
    for name in ("cache", "past_key_values", "layer_past"):
        cache = _Cache(name)
        kwargs = {name: cache, "position_ids": 3}
        assert take_cache(kwargs) is cache
        assert kwargs == {"position_ids": 3}  # safe to pass on to an attention function


def test_take_cache_prefers_the_bound_argument_and_allows_none():
    cache = _Cache("bound")
    assert take_cache({"cache": None}, cache) is cache
    assert take_cache({}, None) is None


def test_two_different_caches_are_a_programming_error():
    with pytest.raises(TypeError, match="two different KV caches"):
        take_cache({"cache": _Cache("a")}, _Cache("b"))


def test_output_cache_and_keyword_follow_the_installed_transformers(tiny):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**tiny["llama"])
    model = AutoModelForCausalLM.from_config(config)
    ids = torch.zeros((1, 4), dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        cache = output_cache(out)
        assert cache is not None and cache.get_seq_length() == 4
        model(input_ids=ids[:, :1], use_cache=True, **{cache_keyword(model): cache})
    # the decode step appended one row: the cache went in under the right name
    assert cache.get_seq_length() == 5
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    assert cache_keyword(model) == ("cache" if (major, minor) >= (5, 24) else "past_key_values")


def test_a_patch_that_drops_the_cache_is_an_internal_error(host, tiny, monkeypatch):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaAttention.forward

    def forgetful(self, *args, **kwargs):
        for name in ("cache", "past_key_values"):
            kwargs.pop(name, None)  # what a patch reading the wrong keyword does
        return original(self, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", forgetful)
    with pytest.raises(InternalError) as exc:
        capture(tiny["llama"], host=host, phases=("decode",), seq_len=8)
    assert "KV cache" in str(exc.value) and "a patch does not read" in str(exc.value)
    assert exc.value.exit_code == 1
