"""KV-cache sizes read from captured decode graphs, per layer kind, for every kind of cache:
GQA rows per token, sliding windows (fixed per sequence), windows still filling, Mamba's
convolution and SSM states. (MLA, DSA and DeepSeek-V4 caches: plugins/zrt_deepseek/tests.)

Captures are batch 2 with 24 cached tokens — a length no dimension of the tiny configs has,
so no axis is mistaken for the sequence. Sizes are per sequence, bf16 unless said.
"""

from __future__ import annotations

import pytest

from zrt_core.estimate.memory import FIXED, TOKENS, cache_states, kv_cache_size
from zrt_core.ir.graph import Phase


def _size(captured, family: str, seq_len: int = 24):
    r = captured(family, seq_len=seq_len, phases=("prefill", "decode"))
    decode = r.graphs[Phase.DECODE]
    states = cache_states(decode, r.graphs[Phase.PREFILL])
    return states, kv_cache_size(decode, caches=states)


def test_gqa_rows_grow_with_every_token(captured) -> None:
    states, kv = _size(captured, "llama")
    assert {s.kind for s in states.values()} == {TOKENS}
    # 3 layers x (K and V) x 2 KV heads x 32 x 2 bytes = 768 bytes per token
    assert (kv.per_token, kv.per_sequence_fixed, kv.window) == (768, 0, 0)
    assert kv.by_kind == {"dense": (768, 0)} and not kv.recurrent
    assert kv.for_sequence(1000) == 768_000


@pytest.mark.parametrize(("family", "full_layers", "sliding_layers"),
                         [("gemma2", 1, 2), ("gpt_oss", 1, 1), ("qwen2", 1, 2)])
def test_sliding_windows_are_fixed_per_sequence(captured, family, full_layers,
                                                sliding_layers) -> None:
    _states, kv = _size(captured, family)
    # a full layer: K and V x 2 KV heads x 32 x 2 bytes = 256 per token; a sliding layer
    # keeps the window's 8 - 1 = 7 earlier tokens: 7 x 256 = 1792 bytes, however long
    assert kv.per_token == 256 * full_layers
    assert kv.per_sequence_fixed == 1792 * sliding_layers
    assert kv.window == 7 and not kv.recurrent
    assert kv.by_kind["sliding_attention"] == (0, 1792 * sliding_layers)
    # what a heuristic blind to windows counts per token (trtllm-bench): every layer's rows
    assert kv.window_row_bytes == 256 * sliding_layers and kv.recurrent_fixed == 0


def test_a_window_still_filling_grows_until_it_is_full(captured) -> None:
    """Captured with 4 tokens, Gemma 2's sliding caches still grow: they are sized up to
    the window, so the size of a long sequence does not depend on the capture's length."""
    states, short = _size(captured, "gemma2", seq_len=4)
    assert sorted(s.cap_rows for s in states.values()) == [0, 0, 7, 7]
    # the 2 sliding layers add 2 x 256 = 512 bytes per token up to 7 tokens
    assert (short.per_token, short.per_sequence_fixed, short.windowed) == (256, 0, ((512, 7),))
    assert short.window_row_bytes == 512
    _states, long = _size(captured, "gemma2")
    for tokens in (5, 7, 100, 5000):
        assert short.for_sequence(tokens) >= long.per_token * tokens
        if tokens >= 7:
            assert short.for_sequence(tokens) == long.for_sequence(tokens)
    assert short.for_sequence(5) == 256 * 5 + 512 * 5


def test_mamba_states_are_fixed_and_recurrent(captured) -> None:
    states, kv = _size(captured, "nemotron_h")
    # "M*M-": the attention layer's K and V rows, 2 heads x 32 x 2 x 2 bytes = 256 per token
    assert kv.per_token == 256
    # each mixer: the convolution state, conv_dim (4 x 32 inner + 2 groups x 2 x 16 state
    # = 192) x kernel 4 x 2 bytes = 1536, and the SSM state 4 heads x 32 x 16 x 4 bytes
    # (float32) = 8192: 9728 per Mamba layer, 19456 for two
    assert kv.by_kind == {"full_attention": (256, 0), "mamba": (0, 19_456)}
    assert kv.per_sequence_fixed == kv.recurrent_fixed == 19_456
    assert kv.recurrent and kv.window == 0 and kv.window_row_bytes == 0
    assert sorted(s.kind for s in states.values()) == [FIXED, FIXED, TOKENS, TOKENS]


def test_llama4_chunked_caches_are_fixed(captured) -> None:
    _states, kv = _size(captured, "llama4")
    # layer 3 is the one full-attention layer (no_rope_layer_interval 4); the three chunked
    # layers keep chunk 8 - 1 = 7 earlier tokens: 3 x 7 x 256 = 5376 bytes
    assert (kv.per_token, kv.per_sequence_fixed, kv.window) == (256, 5376, 7)
    assert not kv.recurrent


def test_a_stage_counts_its_own_layers(captured) -> None:
    r = captured("gemma2", seq_len=24, phases=("prefill", "decode"))
    decode = r.graphs[Phase.DECODE]
    states = cache_states(decode, r.graphs[Phase.PREFILL])
    # layers 0 and 2 slide, layer 1 is full
    assert kv_cache_size(decode, {0}, caches=states).per_sequence_fixed == 1792
    assert kv_cache_size(decode, {1}, caches=states).per_token == 256
    assert kv_cache_size(decode, {1}, caches=states).per_sequence_fixed == 0


class _HybridCache:
    """A hybrid's cache: layer 0 keeps a recurrent state (MiniMax's lightning layers report
    0 tokens, Qwen3-Next's raise), layer 1 holds the attention keys."""

    def __init__(self, first: int | None, second: int) -> None:
        self.layers = [object(), object()]
        self._lengths = (first, second)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        length = self._lengths[layer_idx]
        if length is None:
            raise ValueError("`get_seq_length` can only be called on Attention layers")
        return length


def test_cache_length_is_the_longest_layers() -> None:
    from zrt_core.capture.phases import _cache_length

    assert _cache_length(_HybridCache(0, 16), -1) == 16  # (layer 0 alone said 0: "no KV")
    assert _cache_length(_HybridCache(None, 16), -1) == 16
    assert _cache_length(_HybridCache(None, 0), -1) == 0
    assert _cache_length(object(), -1) == -1  # no get_seq_length at all: the default
