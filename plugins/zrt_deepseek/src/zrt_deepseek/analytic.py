"""Analytic FLOPs of DeepSeek-V4 per phase, from the config alone (no torch).

The core's analytic front-end (:mod:`zrt_core.analytic`) does not describe V4's
compressed attention and hyper-connections; this module does, with the same conventions and
result type (:class:`zrt_core.analytic.flops.PhaseFlops`), so a V4 capture can be checked
like any other family. Derivation, one sequence of ``S`` tokens, ``h`` hidden,
``H × D`` attention heads, ``n = hc_mult``::

    matmul  = 2 · N_active · T + 2 · hc_terms · T
        N_active per layer: q_a (h·q_lora) + q_b (q_lora·H·D) + kv (h·D)
                            + o_a (H·D·o_lora: one o_lora block per head group)
                            + o_b (o_groups·o_lora·h)
                            + compressor kv/gate (CSA: 2·h·2D, HCA: 2·h·D)
                            + CSA indexer (kv/gate 2·h·2·D_idx, q_b q_lora·H_idx·D_idx,
                              head weights h·H_idx)
                            + router h·E + shared expert 3·h·f + top-k routed 3·h·f
        hc_terms per layer: two hyper-connections, each a projection of the n streams to
                            (2 + n)·n mixing weights (n·h·(2 + n)·n) and the n × n stream mix
                            (n·n·h); once more n·h·n for the head's collapse
    attention = Σ_layers Σ_queries 2·H·keys·(D + D)      (K = V)
        keys of the query at position p: min(p + 1, W) window keys, plus
        HCA: ⌊(p + 1)/m'⌋ compressed entries; CSA: min(index_topk, ⌊(p + 1)/m⌋)
    indexer   = Σ_CSA layers Σ_queries 2·H_idx·(D_idx + 1)·⌊(p + 1)/m⌋
    lm_head   = 2 · h · vocab · positions

Decode: one query at ``p = kv_len``. Training backward: twice the forward (the core's
convention).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from zrt_deepseek.formulas import compressed_pairs, indexer_pairs, window_pairs

CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
SLIDING = "sliding_attention"
_DEFAULT_RATES = {CSA: 4, HCA: 128}


@frozen
class V4Dims:
    """The V4 config fields the FLOP counts need (transformers' defaults where absent)."""

    hidden: int
    layers: int
    heads: int
    head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    experts: int
    top_k: int
    shared_experts: int
    moe_ffn: int
    vocab: int
    window: int
    index_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    layer_types: tuple[str, ...]
    rates: Mapping[str, int]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> V4Dims:
        c = dict(config.get("text_config") or config)
        n = int(c.get("num_hidden_layers", 43))
        types = c.get("layer_types")
        if not types:
            interleave = [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
            types = [HCA] * min(n, 2) + interleave
        rates = {**_DEFAULT_RATES, **(c.get("compress_rates") or {})}
        return cls(
            hidden=int(c.get("hidden_size", 4096)), layers=n,
            heads=int(c.get("num_attention_heads", 64)), head_dim=int(c.get("head_dim", 512)),
            q_lora_rank=int(c.get("q_lora_rank", 1024)), o_groups=int(c.get("o_groups", 8)),
            o_lora_rank=int(c.get("o_lora_rank", 1024)),
            experts=int(c.get("n_routed_experts", 256)),
            top_k=int(c.get("num_experts_per_tok", 6)),
            shared_experts=int(c.get("n_shared_experts", 1)),
            moe_ffn=int(c.get("moe_intermediate_size", 2048)),
            vocab=int(c.get("vocab_size", 129280)), window=int(c.get("sliding_window", 128)),
            index_heads=int(c.get("index_n_heads", 64)),
            index_head_dim=int(c.get("index_head_dim", 128)),
            index_topk=int(c.get("index_topk", 512)), hc_mult=int(c.get("hc_mult", 4)),
            layer_types=tuple(str(t) for t in types[:n]), rates=rates)

    def layer_matmul_active(self, layer_type: str) -> int:
        """Matmul weights one token multiplies in one layer (``N_active`` of the layer)."""
        h, hd = self.hidden, self.heads * self.head_dim
        attn = (h * self.q_lora_rank + self.q_lora_rank * hd + h * self.head_dim
                + hd * self.o_lora_rank + self.o_groups * self.o_lora_rank * h)
        if layer_type == CSA:
            di = self.index_head_dim
            attn += 2 * h * 2 * self.head_dim
            attn += 2 * h * 2 * di + self.q_lora_rank * self.index_heads * di + h * self.index_heads
        elif layer_type == HCA:
            attn += 2 * h * self.head_dim
        expert = 3 * h * self.moe_ffn
        moe = h * self.experts + self.shared_experts * expert + self.top_k * expert
        return attn + moe

    def hc_flops_per_token(self) -> int:
        """Hyper-connection matmuls of one layer per token (module docstring)."""
        n, h = self.hc_mult, self.hidden
        return 2 * (2 * n * h * (2 + n) * n + 2 * n * n * h)

    def attention_pairs(self, layer_type: str, q_len: int, start_pos: int) -> tuple[int, int]:
        """``(attention pairs, indexer pairs)`` of one head of one sequence in one layer."""
        window_keys = min(start_pos + q_len, self.window) if start_pos else q_len
        pairs = window_pairs(q_len, window_keys, self.window, start_pos)
        index = 0
        if layer_type in (CSA, HCA):
            rate = int(self.rates[layer_type])
            entries = (start_pos + q_len) // rate
            cap = self.index_topk if layer_type == CSA else entries
            pairs += compressed_pairs(q_len, entries, rate, start_pos, cap)
            if layer_type == CSA:
                index = indexer_pairs(q_len, entries, rate, start_pos)
        return pairs, index


def is_v4(config: Mapping[str, Any]) -> bool:
    """Whether a config (or its ``text_config``) is DeepSeek-V4's."""
    text = config.get("text_config") or {}
    return "deepseek_v4" in (config.get("model_type"), text.get("model_type"))


def v4_phase_flops(config: Mapping[str, Any], phase: str, batch: int, seq_len: int) -> Any:
    """Analytic FLOPs of a DeepSeek-V4 phase (whole model); ``seq_len`` is the cached length
    for decode. Returns a :class:`zrt_core.analytic.flops.PhaseFlops`."""
    from zrt_core.plugin import PhaseFlops

    d = V4Dims.from_config(config)
    decode = phase == "decode"
    q_len, start = (1, seq_len) if decode else (seq_len, 0)
    tokens = batch * q_len
    matmul = attention = 0
    for layer_type in d.layer_types:
        matmul += 2 * d.layer_matmul_active(layer_type) * tokens + d.hc_flops_per_token() * tokens
        pairs, index = d.attention_pairs(layer_type, q_len, start)
        attention += batch * (2 * d.heads * pairs * 2 * d.head_dim
                              + 2 * d.index_heads * index * (d.index_head_dim + 1))
    matmul += 2 * d.hc_mult * d.hidden * d.hc_mult * tokens  # the head's stream collapse
    positions = seq_len if phase.startswith("train") else 1
    lm_head = 2 * d.hidden * d.vocab * batch * positions
    scale = 2 if phase == "train_backward" else 1
    return PhaseFlops(phase=phase, batch=batch, seq_len=seq_len, tokens=tokens,
                      matmul=scale * matmul, attention=scale * attention, ssm=0,
                      lm_head=scale * lm_head)
