"""Overlapped collectives hold SMs: the compute beside them runs on the rest
(``efficiency.comm_overlap_sms``; docs/overlap-rules.md)."""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.estimate.training import estimate_training
from zrt_core.estimate.training.stages import comm_overlap_share, overlap_slowdown_s
from zrt_core.strategy import Parallel, TrainSpec

from .cost.builders import make_toy

# h=64, 2 layers of 4 heads, FFN 256, vocab 128
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 128}


def test_share_is_the_sms_held_of_the_units():
    # 1 of the toy's 4 units; none without units, or when the count is off
    assert comm_overlap_share(make_toy(comm_overlap_sms=1)) == 0.25
    assert comm_overlap_share(make_toy(comm_overlap_sms=1, parallel_units=0)) == 0.0
    assert comm_overlap_share(make_toy()) == 0.0


def test_slowdown_is_each_groups_hidden_time_times_its_share():
    hidden = {"tp": 2.0, "dp": 1.0, "pp": 5.0, "ep": 4.0}
    # tp and dp at 0.25: 0.75; pipeline messages left out; ep at its dispatcher's 0.1: 0.4
    assert overlap_slowdown_s(hidden, 0.25, 0.1) == pytest.approx(1.15, rel=1e-12)
    # no known EP dispatcher SMs: the EP group takes the collectives' share, 1.0
    assert overlap_slowdown_s(hidden, 0.25) == pytest.approx(1.75, rel=1e-12)
    assert overlap_slowdown_s(hidden, 0.0) == 0.0


def test_the_step_pays_the_share_of_every_hidden_collective():
    # tp 2 with SP (TE userbuffers overlap the forward TP collectives, the backward ones run
    # beside the weight-gradient GEMMs) and dp 2 (the gradient reduction during backward):
    # with 2 of 4 units held, the compute beside them loses half of their hidden time
    par = Parallel(tp=2, dp=2, sp=True)
    train = TrainSpec(micro_batch=1, global_batch=4, seq_len=64)
    off = estimate_training(TINY, make_toy(), par, train)
    on = estimate_training(TINY, make_toy(comm_overlap_sms=2), par, train)
    hidden = sum(v for k, v in on.hidden_comm_s.items() if k != "pp")
    assert hidden > 0
    assert dict(on.hidden_comm_s) == pytest.approx(dict(off.hidden_comm_s), rel=1e-12)
    assert "overlap" not in off.exposed_comm_s
    assert on.exposed_comm_s["overlap"] == pytest.approx(0.5 * hidden, rel=1e-9)
    # pp 1: the stage times add over the micro-batches, so the step grows by exactly that
    assert on.step_time_s - off.step_time_s == pytest.approx(0.5 * hidden, rel=1e-9)
    assert on.compute_s == pytest.approx(off.compute_s, rel=1e-12)


def test_serving_rules_hide_nothing_so_nothing_is_lost():
    # every collective blocking: no hidden time (float rounding aside), no slowdown
    par = Parallel(tp=2, dp=2, sp=True)
    train = TrainSpec(micro_batch=1, global_batch=4, seq_len=64)
    from zrt_core.schedule.scheduler import OverlapRules

    rules = evolve(OverlapRules.serving(), serial=True)
    on = estimate_training(TINY, make_toy(comm_overlap_sms=2), par, train, overlap=rules)
    assert on.exposed_comm_s.get("overlap", 0.0) == pytest.approx(0.0, abs=1e-15)
