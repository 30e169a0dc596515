"""MoE routing load over EP ranks (zrt_core.moe_load) and its effect on the EP pass: the
busiest rank's routed rows, all-to-all bytes and grouped-GEMM FLOPs under a skew, a per-step
multinomial draw and DeepSeek's EPLB placement, on the tiny qwen3-moe of test_parallel
(8 experts, top-2, hidden 128, expert FFN 64; 32 tokens per rank)."""

from __future__ import annotations

import argparse
import math

import pytest

from zrt_core.errors import LayoutError, SpecError
from zrt_core.moe_load import (
    ExpertLoad,
    balanced_packing,
    eplb_physical_shares,
    expected_max_normal,
)
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.parallel import ParallelTransform, apply_phases

from .test_parallel import LLAMA, QWEN3_MOE, _collectives, _ctx, captured, host  # noqa: F401

# imbalance 2.75 over 8 experts: expert 0 carries 2.75/8 = 0.34375 of the rows, the other 7
# share 0.65625 evenly (0.09375 each). On ep=4 (2 experts a rank) rank 0 holds
# 0.34375 + 0.09375 = 0.4375 of the rows: 4 x 0.4375 = 1.75 times the balanced quarter.
SKEW = ExpertLoad(imbalance=2.75)


def test_rank_load_of_a_skew_is_the_busiest_ranks_share():
    assert SKEW.expert_shares(8) == (0.34375,) + (0.09375,) * 7
    assert SKEW.rank_shares(8, 4) == (0.4375, 0.1875, 0.1875, 0.1875)
    assert SKEW.rank_load(8, 4, assignments=0) == 1.75
    assert ExpertLoad().rank_load(8, 4, assignments=64) == 1.0


def test_eplb_replicates_the_heaviest_and_packs_balanced():
    # 4 redundant slots: expert 0 (0.34375) is replicated while its per-replica load is the
    # largest: /2 = 0.171875, /3 = 0.1146, /4 = 0.0859 < 0.09375, then expert 1 (the first
    # of the 0.09375s) gets the 4th: 0.046875 each. 12 physical experts, 3 per rank, packed
    # heaviest first into the lightest rank with room: ranks 0,1 take 0.09375 x 2 + 0.0859
    # or 0.046875 ..., the busiest holds 0.09375 + 0.0859375 x 2 = 0.265625 -> 4 x 0.265625
    # = 1.0625 (from 1.75 without EPLB)
    shares = eplb_physical_shares(SKEW.expert_shares(8), 12)
    assert shares.count(0.34375 / 4) == 4 and shares.count(0.09375 / 2) == 2
    assert ExpertLoad(imbalance=2.75, redundant=4).rank_load(8, 4, 0) == 1.0625
    assert sorted(len(p) for p in balanced_packing(shares, 4)) == [3, 3, 3, 3]


def test_multinomial_adds_the_expected_maximum_of_the_ranks_draws():
    # two equal normals: E[max] = mu + sigma/sqrt(pi); N = 1600 assignments over ep = 2:
    # mu = 800, sigma = sqrt(1600 x 1/2 x 1/2) = 20 -> (800 + 20/sqrt(pi)) / 800
    assert expected_max_normal([800.0, 800.0], [20.0, 20.0]) == \
        pytest.approx(800 + 20 / math.sqrt(math.pi), rel=1e-9)
    load = ExpertLoad(distribution="multinomial")
    assert load.rank_load(8, 2, 1600) == pytest.approx(1 + 20 / math.sqrt(math.pi) / 800,
                                                       rel=1e-9)
    # more tokens a step, less spread: 16x the assignments, a quarter of the excess
    excess = load.rank_load(8, 2, 1600) - 1
    assert load.rank_load(8, 2, 25600) - 1 == pytest.approx(excess / 4, rel=1e-6)


def test_parse_and_bad_values_are_one_line_errors():
    assert ExpertLoad.parse("2.75") == SKEW
    assert ExpertLoad.parse("dist:multinomial").distribution == "multinomial"
    for bad in ("0.5", "dist:zipf", "hot"):
        with pytest.raises(SpecError):
            ExpertLoad.parse(bad)
    with pytest.raises(LayoutError, match="more redundant experts than the model's 8"):
        ExpertLoad(redundant=9).check(8, 4)
    with pytest.raises(LayoutError, match="--ep is 1"):
        ExpertLoad(redundant=4).check(8, 1)
    with pytest.raises(LayoutError, match="do not split over --ep 4"):
        ExpertLoad(redundant=3).check(8, 4)
    with pytest.raises(LayoutError, match="needs a MoE model"):
        ExpertLoad(redundant=1).check(0, 4)
    # balanced routing without EPLB is no load at all: the default layout is unchanged
    assert Parallel(ep=4, moe_load=ExpertLoad()) == Parallel(ep=4)
    assert "moe_load" not in Parallel(ep=4).to_json()


def _grouped(g, layer=1):
    return [n for n in g.nodes if n.op == "aten._grouped_mm.default" and n.layer_index == layer]


def _a2a_bytes(g, layer=1):
    return [(n.attrs["moe"], n.attrs["bytes"]) for n in _collectives(g, "all_to_all")
            if n.layer_index == layer]


def test_skew_scales_the_busiest_ranks_rows_all_to_all_and_flops(host, captured):  # noqa: F811
    r = captured(QWEN3_MOE, ("prefill",))
    base = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(dp=4, ep=4)))
    skew = ParallelTransform().apply(r.graphs["prefill"],
                                     _ctx(host, r, Parallel(dp=4, ep=4, moe_load=SKEW)))
    # balanced: 32 tokens x top-2 = 64 rows; the busiest rank receives 64 x 1.75 = 112
    assert [n.inputs[0].shape[0] for n in _grouped(base)] == [64, 64]
    assert [n.inputs[0].shape[0] for n in _grouped(skew)] == [112, 112]
    assert _grouped(skew)[0].attrs["group_rows"] == (56, 56)
    # up-projection 2 x 112 x 128 x 128 = 3670016 (1.75 x 2097152)
    assert _grouped(skew)[0].flops == 3_670_016 == _grouped(base)[0].flops * 7 // 4
    # dispatch and combine: 112 rows x 128 x 2 bytes = 28672 (from 16384)
    assert _a2a_bytes(base) == [("dispatch", 16384), ("combine", 16384)]
    assert _a2a_bytes(skew) == [("dispatch", 28672), ("combine", 28672)]


def test_skew_without_all_to_all_scales_the_tp_ranks_rows(host, captured):  # noqa: F811
    r = captured(QWEN3_MOE, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"], _ctx(
        host, r, Parallel(tp=4, ep=4, etp=1, moe_load=SKEW)))
    # EP inside TP: 64 rows / 4 = 16 balanced, x 1.75 = 28 on the busiest rank
    assert _grouped(g)[0].inputs[0].shape == (28, 128)


def test_eplb_adds_expert_weights_and_cuts_the_busiest_rows(host, captured):  # noqa: F811
    r = captured(QWEN3_MOE, ("prefill",))
    load = ExpertLoad(imbalance=2.75, redundant=4)
    g = ParallelTransform().apply(r.graphs["prefill"],
                                  _ctx(host, r, Parallel(dp=4, ep=4, moe_load=load)))
    up = _grouped(g)[0]
    # (8 + 4) / 4 = 3 physical experts a rank (2 without EPLB): 3 x 128 x 128 weights;
    # rows 64 x 1.0625 = 68 (from 112 without EPLB)
    assert up.inputs[1].shape == (3, 128, 128)
    assert up.inputs[0].shape[0] == 68 and sum(up.attrs["group_rows"]) == 68
    assert _a2a_bytes(g)[0] == ("dispatch", 68 * 128 * 2)


def test_skew_reaches_the_training_backward(host, captured):  # noqa: F811
    r = captured(QWEN3_MOE, ("train_forward", "train_backward"))
    train = TrainSpec(micro_batch=2, global_batch=8, seq_len=16)
    out = apply_phases(r.graphs, _ctx(host, r, Parallel(dp=4, ep=4, moe_load=SKEW), train))
    assert {n.inputs[0].shape[0] for n in _grouped(out["train_forward"])} == {112}
    # dX GEMMs carry the 112 gradient rows [112, H], dW GEMMs reduce over them [H, 112]
    bwd = [n for n in out["train_backward"].nodes if "grouped_mm" in n.op
           and n.layer_index == 1]
    assert sorted(n.inputs[0].shape for n in bwd) == [(112, 128), (112, 128), (128, 112),
                                                      (128, 112)]
    assert _a2a_bytes(out["train_backward"]) == [("combine_backward", 28672),
                                                 ("dispatch_backward", 28672)]


def test_dense_model_is_untouched_by_a_skew(host, captured):  # noqa: F811
    r = captured(LLAMA, ("prefill",))
    a = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(tp=2)))
    b = ParallelTransform().apply(r.graphs["prefill"],
                                  _ctx(host, r, Parallel(tp=2, moe_load=SKEW)))
    assert [n.flops for n in a.nodes] == [n.flops for n in b.nodes]


def test_cli_flags_build_the_load_and_the_mtp():
    from zrt_core.cli.moe_args import moe_load_from_args, mtp_from_args

    args = argparse.Namespace(moe_imbalance="2.75", eplb=4, mode="infer", mtp=2,
                              mtp_acceptance=None)
    assert moe_load_from_args(args) == ExpertLoad(imbalance=2.75, redundant=4)
    with pytest.raises(SpecError, match="does not apply to --train"):
        moe_load_from_args(argparse.Namespace(moe_imbalance=None, eplb=4, mode="train"))
    config, mtp = mtp_from_args(args, {"model_type": "deepseek_v3",
                                       "num_nextn_predict_layers": 1})
    assert config["num_nextn_predict_layers"] == 2 and mtp.depths == 2
    assert mtp_from_args(argparse.Namespace(mtp=None), {"a": 1}) == ({"a": 1}, None)


def test_estimate_spec_carries_the_load_in_parallel():
    from zrt_core.analytic.spec import _parallel

    p = _parallel({"ep": 4, "dp": 4, "moe_load": {"imbalance": 2.75, "redundant": 4}}, "s.yaml")
    assert p.moe_load == ExpertLoad(imbalance=2.75, redundant=4)
    assert p.to_json()["moe_load"] == {"imbalance": 2.75, "distribution": None, "redundant": 4}
    with pytest.raises(SpecError, match=r"s\.yaml: bad parallel"):
        _parallel({"ep": 4, "moe_load": {"hot": 4}}, "s.yaml")


def test_measured_skew_draws_popularities_then_tokens():
    from zrt_core.moe_load import distribution_names, routing_skews

    skew = routing_skews()["deepseek-sglang"]
    assert "deepseek-sglang" in distribution_names()
    # 16 measured counts (sglang PR 5524): sum 2,553,070, mean 159,566.875, population
    # standard deviation 111,266.6 -> CV 0.697304
    assert len(skew.counts) == 16 and sum(skew.counts) == 2_553_070
    assert skew.cv == pytest.approx(0.6973039, rel=1e-6)
    # 8 experts take the quantiles (i + 1/2)/8 of the 16 sorted counts, i.e. the 2nd, 4th ...
    # 16th largest: 322237, 184719, 147879, 119943, 117722, 102827, 73528, 46123 (sum
    # 1,114,978), normalised
    ranked = (322237, 184719, 147879, 119943, 117722, 102827, 73528, 46123)
    assert skew.profile(8) == pytest.approx(tuple(r / 1_114_978 for r in ranked), rel=1e-12)
    load = ExpertLoad.parse("dist:deepseek-sglang")
    # 8 experts on ep = 2 (m = 4 a rank), N = 1000 rows a step, N/ep = 500:
    # placement variance 500^2 x 0.6973039^2 / 4 x (8 - 4)/(8 - 1) = 17,365.6,
    # multinomial 1000 x 1/2 x 1/2 = 250 -> sigma = sqrt(17,615.6) = 132.72;
    # two equal normals: E[max] = 500 + sigma/sqrt(pi) = 574.88 -> 1.14976
    sigma = math.sqrt(500 ** 2 * 0.6973039 ** 2 / 4 * 4 / 7 + 250)
    assert load.rank_load(8, 2, 1000) == pytest.approx(1 + sigma / math.sqrt(math.pi) / 500,
                                                       rel=1e-6)
    assert load.rank_load(8, 2, 1000) == pytest.approx(1.14976, abs=1e-5)
    # EPLB places by the expected profile: 8 redundant on 16 slots over ep = 2 packs the
    # replicas evenly, so with no per-step draw (N = 0) the busiest rank is within 1% of even
    eplb = ExpertLoad.parse("dist:deepseek-sglang", redundant=8)
    assert 1.0 <= eplb.rank_load(8, 2, 0) < 1.01 < load.rank_load(8, 2, 0)
    with pytest.raises(SpecError, match="takes no imbalance"):
        ExpertLoad(imbalance=2.0, distribution="deepseek-sglang")
    with pytest.raises(SpecError) as err:
        ExpertLoad.parse("dist:zipf")
    assert "dist:multinomial or dist:deepseek-sglang" in str(err.value.hint)
