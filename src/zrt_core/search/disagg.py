"""Disaggregated serving from the serving rows: x prefill workers and y decode workers of
(possibly different) layouts, the KV cache of every request sent from prefill to decode
over the network tier, against the best aggregated layout (docs/search.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Worker counts tried on each side (x prefill, y decode).
MAX_WORKERS = 8


def kv_transfer_s(row: Mapping[str, Any], hw: Any) -> float:
    """Moving one prefill batch's KV cache to the decode workers: every device of the prefill
    instance sends its shard (``kv_bytes_per_sequence`` is per device) at the outermost
    tier's achievable bandwidth (prefill and decode workers on different nodes)."""
    tier = hw.interconnect[-1] if hw.interconnect else None
    if tier is None or not row.get("kv_bytes_per_sequence"):
        return 0.0
    bytes_ = row["kv_bytes_per_sequence"] * row["batch"]
    return bytes_ / (tier.bandwidth_gb_per_s * 1e9 * tier.efficiency) + tier.latency_us * 1e-6


def disaggregated(rows: Sequence[Mapping[str, Any]], hw: Any, output_len: int, *,
                  ttft_ms: float | None, tpot_ms: float | None) -> dict[str, Any] | None:
    """The best split by output tokens/s per GPU that meets the targets, or None.

    From the fixed-batch rows that fit: a prefill instance finishes ``batch × dp`` prompts
    every ``TTFT`` (its rate ``batch·dp / TTFT``); a decode instance finishes ``batch × dp``
    requests every ``output_len × TPOT``. ``x`` prefill and ``y`` decode instances sustain
    ``min(x·prefill rate, y·decode rate)`` requests/s on ``x·GPUs_p + y·GPUs_d`` GPUs. TTFT
    is the prefill's plus the KV transfer (:func:`kv_transfer_s`); TPOT the decode
    layout's. Queueing is not modelled (a steady, saturated stream)."""
    usable = [r for r in rows if r.get("fits") and isinstance(r.get("batch"), int)
              and r.get("ttft_ms") and r.get("tpot_ms")]
    prefills = []
    for r in usable:
        kv_s = kv_transfer_s(r, hw)
        ttft = r["ttft_ms"] + kv_s * 1e3
        if ttft_ms is None or ttft <= ttft_ms:
            prefills.append((r, r["batch"] * r["dp"] / (r["ttft_ms"] * 1e-3), ttft, kv_s))
    decodes = [(r, r["batch"] * r["dp"] / (r["tpot_ms"] * 1e-3 * output_len)) for r in usable
               if tpot_ms is None or r["tpot_ms"] <= tpot_ms]
    best: dict[str, Any] | None = None
    for p, rate_p, ttft, kv_s in prefills:
        for d, rate_d in decodes:
            for x in range(1, MAX_WORKERS + 1):
                for y in range(1, MAX_WORKERS + 1):
                    rate = min(x * rate_p, y * rate_d)
                    gpus = x * p["gpus"] + y * d["gpus"]
                    per_gpu = rate * output_len / gpus
                    if best is None or per_gpu > best["output_tokens_per_s_per_gpu"]:
                        best = {"prefill": dict(p), "decode": dict(d), "prefill_workers": x,
                                "decode_workers": y, "gpus": gpus, "requests_per_s": rate,
                                "output_tokens_per_s_per_gpu": per_gpu, "ttft_ms": ttft,
                                "tpot_ms": d["tpot_ms"], "kv_transfer_ms": kv_s * 1e3}
    return best
