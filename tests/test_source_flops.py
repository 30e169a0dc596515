"""Model-FLOP counters of sources (zrt_core.source_flops): exact arithmetic on tiny configs."""

from __future__ import annotations

from zrt_core.source_flops import nemo2_llama_flops, published_model_flops

# h=64, 2 layers, 4 heads, 2 KV heads, FFN 128, vocab 256
CFG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}


def test_nemo2_counts_the_full_attention_square() -> None:
    # gbs·s·L·h² · (12 + 12·2/4 + 18·128/64 + 12·32/64 + 6·256/(2·64))
    #   = 2·32·2·4096 · (12 + 6 + 36 + 6 + 12) = 524288 · 72 = 37748736
    assert nemo2_llama_flops(CFG, 32, 2) == 37748736
    # doubling s doubles the tokens and adds 12·32/64 = 6 to the bracket: 2·524288·78
    assert nemo2_llama_flops(CFG, 64, 2) == 2 * 524288 * 78


def test_only_nemo_2_long_sequence_rows_use_it() -> None:
    rec = {"source": "NVIDIA NeMo long-sequence performance page, LLAMA3-8B (NeMo 25.04.rc2)",
           "model": {"hf_config": CFG}, "seq_len": 32, "global_batch": 2}
    flops, counter = published_model_flops(rec)
    assert flops == 37748736 and "full-square" in counter
    # NeMo 24.03's rows counted the causal half, as zrt does
    assert published_model_flops({**rec, "source": rec["source"].replace("25.04.rc2",
                                                                         "24.03.01")}) is None
    assert published_model_flops({**rec, "source": "Megatron-Bridge"}) is None
