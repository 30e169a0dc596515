"""MTP speculative decoding (zrt_core.estimate.speculative): the step's draft and verify
times from two decode breakdowns, the expected tokens a step yields, and the TPOT."""

from __future__ import annotations

import pytest

from zrt_core.errors import SpecError
from zrt_core.estimate.speculative import DEFAULT_ACCEPTANCE, MtpDecoding, mtp_step, with_mtp
from zrt_core.reports.inference import InferenceReport, PhaseBreakdown


def _decode(batch: int, time_s: float, attention_s: float) -> PhaseBreakdown:
    # one dense and one MoE layer (per layer 2 ms and 5 ms) and 1 ms outside the layers
    return PhaseBreakdown(phase="decode", batch=batch, tokens=batch, time_s=time_s, flops=0,
                          bytes=0, by_category_s={"attention": attention_s,
                                                  "matmul": time_s - attention_s},
                          by_layer_kind_s={"outside_layers": 1e-3, "dense": 2e-3,
                                           "moe": 5e-3},
                          per_layer_s={"dense": 2e-3, "moe": 5e-3},
                          layer_counts={"dense": 1, "moe": 1}, collectives={})


def test_expected_tokens_per_step_is_the_accepted_prefix():
    # 1 + p: DeepSeek-V3's 85% second-token acceptance gives 1.85 tokens a step
    assert MtpDecoding(1, DEFAULT_ACCEPTANCE, 0.0, 1.0).tokens_per_step == pytest.approx(1.85)
    # 1 + 0.5 + 0.25 + 0.125 = 1.875 with three drafts at 50%
    assert MtpDecoding(3, 0.5, 0.0, 1.0).tokens_per_step == 1.875
    assert MtpDecoding(2, 1.0, 0.0, 1.0).tokens_per_step == 3.0


def test_step_is_n_mtp_passes_plus_one_verify_that_reads_the_cache_once():
    base = _decode(8, time_s=10e-3, attention_s=2e-3)
    wide = _decode(16, time_s=13e-3, attention_s=4e-3)  # 2 tokens a sequence
    step = mtp_step(base, wide, draft_tokens=1, acceptance=0.85, mtp_kind="moe")
    # verify: 13 - 4 (wide attention) + 2 (the cache read once) = 11 ms;
    # draft: 1 x (MoE block 5 ms + embedding/head 1 ms) = 6 ms; step 17 ms
    assert step.verify_s == pytest.approx(11e-3)
    assert step.draft_s == pytest.approx(6e-3)
    # TPOT 17 ms / 1.85 tokens = 9.189 ms (from 10 ms without MTP)
    assert step.tpot_s == pytest.approx(17e-3 / 1.85)


def test_report_under_mtp_and_a_model_without_an_mtp_head():
    base = _decode(8, time_s=10e-3, attention_s=2e-3)
    wide = _decode(16, time_s=13e-3, attention_s=4e-3)
    report = InferenceReport(model="m", model_type="deepseek_v3", hardware_id="h",
                             hardware_name="h", parallel={"dp": 2}, workload={"output_len": 11},
                             num_gpus=2, batch=8, ttft_s=0.05, tpot_s=10e-3, decode=base)
    wide_report = InferenceReport(model="m", model_type="deepseek_v3", hardware_id="h",
                                  hardware_name="h", parallel={}, workload={}, decode=wide)
    out = with_mtp(report, wide_report, 1, 0.85, {"num_nextn_predict_layers": 1})
    assert out.tpot_s == pytest.approx(17e-3 / 1.85)
    # 8 sequences x 11 tokens over 50 ms + 10 x 9.189 ms = 141.89 ms, x dp 2
    total_s = 0.05 + 10 * 17e-3 / 1.85
    assert out.output_tokens_per_s == pytest.approx(2 * 8 * 11 / total_s)
    assert out.throughput["mtp_tokens_per_step"] == pytest.approx(1.85)
    with pytest.raises(SpecError, match="declares none"):
        with_mtp(report, wide_report, 1, 0.85, {"model_type": "llama"})
