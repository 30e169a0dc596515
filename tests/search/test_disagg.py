"""Disaggregated prefill/decode on hand-made serving rows: rates, worker counts, KV
transfer and the targets, with the arithmetic."""

from __future__ import annotations

import pytest

from zrt_core.hardware import InterconnectTier
from zrt_core.search.disagg import disaggregated, kv_transfer_s


class _Hw:
    interconnect = (InterconnectTier("nvlink", 400.0, 2.0, 8),
                    # 50 GB/s at 0.8 efficiency = 40 GB/s achievable, 10 µs latency
                    InterconnectTier("net", 50.0, 10.0, None, efficiency=0.8))


def _row(gpus: int, batch: int, ttft_ms: float, tpot_ms: float, kv: float = 0.0) -> dict:
    return {"gpus": gpus, "tp": gpus, "ep": 1, "dp": 1, "quant": "none", "batch": batch,
            "fits": True, "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
            "kv_bytes_per_sequence": kv}


def test_kv_transfer_over_the_network_tier() -> None:
    # 4 sequences × 1e8 bytes = 4e8 bytes at 40 GB/s = 10 ms, + 10 µs
    assert kv_transfer_s(_row(1, 4, 1.0, 1.0, kv=1e8), _Hw()) == pytest.approx(0.01001)


def test_best_split_balances_prefill_and_decode() -> None:
    # prefill: 1 GPU, batch 4 in 100 ms → 40 requests/s per worker
    # decode: 1 GPU, batch 8, TPOT 10 ms, 100 output tokens → 8 / 1 s = 8 requests/s
    rows = [_row(1, 4, 100.0, 50.0), _row(1, 8, 400.0, 10.0)]
    best = disaggregated(rows, _Hw(), 100, ttft_ms=None, tpot_ms=20.0)
    # the decode layout must meet TPOT ≤ 20 ms: only the second row decodes; prefill by the
    # first (40/s) or the second (8 / 0.4 s = 20/s). One prefill worker feeds five decode
    # workers (min(40, 5·8) = 40 requests/s on 6 GPUs): 40 × 100 / 6 = 666.7 tokens/s/GPU
    assert (best["prefill_workers"], best["decode_workers"], best["gpus"]) == (1, 5, 6)
    assert best["output_tokens_per_s_per_gpu"] == pytest.approx(4000 / 6)
    assert best["prefill"]["ttft_ms"] == 100.0 and best["tpot_ms"] == 10.0


def test_targets_out_of_reach_give_none() -> None:
    rows = [_row(1, 4, 100.0, 50.0)]
    assert disaggregated(rows, _Hw(), 100, ttft_ms=50.0, tpot_ms=None) is None
    # a row asked at the largest batch that fits ("max") is not a fixed batch: unused
    rows = [dict(_row(1, 4, 100.0, 5.0), batch="max")]
    assert disaggregated(rows, _Hw(), 100, ttft_ms=None, tpot_ms=None) is None
