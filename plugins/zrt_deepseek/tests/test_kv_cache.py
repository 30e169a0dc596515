"""KV-cache sizes of DeepSeek's caches as the core reads them from the captured graphs: MLA's
latent row, DSA's indexer keys, V4's sliding windows and compressed entries; and the whole
model's bytes per token trtllm-bench's heuristic takes (the latent once, not per TP rank).

Captures: batch 2 with 24 cached tokens (see conftest for the dimensions); bf16.
"""

from __future__ import annotations

from zrt_core.estimate.memory import ENTRIES, FIXED, TOKENS, cache_states, kv_cache_size
from zrt_core.ir.graph import Phase


def _size(captured, family: str):
    r = captured(family, seq_len=24, phases=("prefill", "decode"))
    decode = r.graphs[Phase.DECODE]
    states = cache_states(decode, r.graphs[Phase.PREFILL])
    return states, kv_cache_size(decode, caches=states)


def test_mla_caches_one_latent_row_per_token(captured):
    for family in ("deepseek_v2", "deepseek_v3"):
        _states, kv = _size(captured, family)
        # kv_lora_rank 32 + rope 16 = 48 values x 2 bytes = 96 per layer; 3 layers: 288
        assert (kv.per_token, kv.per_sequence_fixed) == (288, 0), family
        assert kv.by_kind == {"dense": (96, 0), "moe": (192, 0)}


def test_dsa_adds_the_indexer_keys(captured):
    _states, kv = _size(captured, "deepseek_v32")
    # + index_head_dim 32 x 2 bytes = 64 per layer: (96 + 64) x 3 = 480
    assert (kv.per_token, kv.per_sequence_fixed) == (480, 0)


def test_v4_windows_are_fixed_and_compressed_entries_grow_per_ratio(captured):
    states, kv = _size(captured, "deepseek_v4")
    kinds = sorted(s.kind for s in states.values())
    # one window cache per layer (transformers' second, never-read copy of K = V is left
    # out), CSA's entries and indexer keys, HCA's entries
    assert kinds == [ENTRIES, ENTRIES, ENTRIES, FIXED, FIXED, FIXED]
    assert TOKENS not in kinds
    assert sorted(s.tokens_per_row for s in states.values() if s.kind == ENTRIES) == [4, 4, 8]
    # windows: 8 - 1 = 7 earlier tokens x 64 x 2 bytes = 896 per layer, 3 layers: 2688
    # CSA: a 64-wide entry (128 bytes) and a 32-wide indexer key (64 bytes) per 4 tokens:
    # 48 bytes per token; HCA: a 128-byte entry per 8 tokens: 16
    assert kv.by_kind == {"sliding_attention+hash_moe": (0, 896),
                          "compressed_sparse_attention+moe": (48, 896),
                          "heavily_compressed_attention+moe": (16, 896)}
    assert (kv.per_token, kv.per_sequence_fixed, kv.window) == (64, 2688, 7)
    assert not kv.recurrent


def test_trtllm_bench_counts_the_latent_once_per_model(captured, host):
    from zrt_core.estimate import CapturedModel
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.hardware import HardwareSpec
    from zrt_core.strategy import InferSpec, Parallel, check_layout

    cap = CapturedModel.from_capture(captured("deepseek_v3", batch=1, seq_len=24,
                                              phases=("prefill", "decode")))
    hw = HardwareSpec.from_mapping({
        "id": "toy", "name": "Toy", "vendor": "nvidia",
        "compute": {"fp32": 10, "bf16": 100, "fp16": 100},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": 8}, {"name": "net", "bandwidth_gb_per_s": 25,
                                          "latency_us": 5, "devices": None}]})
    infer = InferSpec(input_len=24, output_len=8)
    for tp in (1, 2):
        est = _Estimator(cap, hw, check_layout(Parallel(tp=tp), cap.dims), infer, host,
                         "trtllm")
        # every TP rank holds the whole 48-value latent: 3 layers x 96 bytes, counted
        # once as trtllm-bench counts MLA (layers x (kv_lora_rank + rope) x bytes)
        assert est._kv_bytes_model() == (288, 0, False)
