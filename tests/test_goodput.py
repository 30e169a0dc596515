"""The whole-run model of zrt_core.goodput: exact numbers with the arithmetic beside them, the
optimum against Young's and Daly's closed forms, parsing and bad input."""

from __future__ import annotations

import math

import pytest

from zrt_core.errors import SpecError
from zrt_core.goodput import (
    DEFAULT_MTBF_GPU_HOURS,
    GoodputSpec,
    expected_wall_s,
    goodput,
    optimal_interval_s,
    parse_interval,
    parse_tokens,
    young_daly_interval_s,
)


def _run(**spec) -> object:
    # 1,000 GPUs, 10 s steps of 4M tokens, a 1 TB checkpoint of which the busiest device
    # writes 1 GB at 1 GB/s: C = 1 s
    kw = {"step_time_s": 10.0, "tokens_per_step": 4_000_000, "num_gpus": 1000,
          "checkpoint_bytes": 1e12, "checkpoint_bytes_per_device": 1e9,
          "device_gb_per_s": 1.0}
    kw.update(spec.pop("run", {}))
    return goodput(GoodputSpec(**spec), **kw)


def test_the_default_mtbf_is_llama3s_snapshot_per_gpu() -> None:
    # 16,384 GPUs × 54 days × 24 h / 419 unexpected interruptions = 21,233,664 / 419
    assert DEFAULT_MTBF_GPU_HOURS == pytest.approx(50_677.0024, abs=1e-4)
    # the system MTBF at 16,384 GPUs: 54 × 24 / 419 = 3.093 h
    assert DEFAULT_MTBF_GPU_HOURS / 16_384 == pytest.approx(3.0931, abs=1e-4)


def test_a_thousand_gpu_run_in_exact_numbers() -> None:
    g = _run(steps=100_000, mtbf_gpu_hours=100_000, restart_s=600)
    # λ = 1,000 GPUs / 100,000 GPU-h = 0.01 per hour: system MTBF 100 h = 360,000 s
    assert g.system_mtbf_s == pytest.approx(360_000.0)
    assert (g.useful_s, g.tokens) == (1_000_000.0, 4e11)  # 100,000 × 10 s; × 4M tokens
    # C = 1e9 B / 1 GB/s = 1 s; the restart is 600 s + the 1 s load
    assert (g.checkpoint_write_s, g.restart_s) == (1.0, 601.0)
    # Young: sqrt(2 × 1 × 360,000) = 848.53 s; the exact optimum is Daly's higher-order
    # sqrt(2CM)[1 + sqrt(C/2M)/3 + C/(18M)] − C = 848.528 × 1.000393 − 1 = 847.862 s
    assert g.young_daly_interval_s == pytest.approx(848.5281, abs=1e-4)
    assert g.optimal_interval_s == pytest.approx(847.8616, abs=1e-4)
    daly = math.sqrt(2 * 360_000) * (1 + math.sqrt(1 / 720_000) / 3 + 1 / (18 * 360_000)) - 1
    assert g.optimal_interval_s == pytest.approx(daly, rel=1e-6)
    # whole steps: 847.86 / 10 = 84.8 → 84 or 85; 85 is better
    assert (g.optimal_every_steps, g.checkpoint_every_steps, g.interval_source) == (
        85, 85, "optimal")
    # 1e6 / 850 = 1,176.47 segments of s = 851 s; e^{851/360,000} − 1 = 0.00236669
    # T = 1,176.47 × 0.00236669 × (360,000 + 601) = 1,004,034.1 s
    assert g.checkpoints == pytest.approx(1176.4706, abs=1e-4)
    assert g.interruptions == pytest.approx(2.784335, abs=1e-6)  # 1,176.47 × 0.00236669
    assert g.wall_s == pytest.approx(1_004_034.124, abs=1e-3)
    assert g.goodput == pytest.approx(0.99598208, abs=1e-8)  # 1e6 / 1,004,034.1
    # lost: checkpoints 1,176.47 × 1 s; restarts 2.784 × 601 s = 1,673.4 s; the rest is the
    # work redone since the last checkpoint: ≈ 2.784 × 851 / 2 = 1,184.7 s
    assert g.checkpoint_lost_s == pytest.approx(1176.4706, abs=1e-4)
    assert g.restart_lost_s == pytest.approx(1673.3856, abs=1e-4)
    assert g.recompute_lost_s == pytest.approx(1184.2679, abs=1e-4)
    assert g.interruptions * 851 / 2 == pytest.approx(g.recompute_lost_s, rel=1e-3)
    assert g.wall_s == pytest.approx(g.useful_s + g.checkpoint_lost_s + g.restart_lost_s
                                     + g.recompute_lost_s, rel=1e-12)
    # GPU-hours: 1,004,034.1 s × 1,000 / 3,600
    assert g.gpu_hours == pytest.approx(278_898.368, abs=1e-3)


def test_the_optimum_is_the_root_of_the_derivative_and_beats_its_neighbours() -> None:
    rate, write = 1 / 3600.0, 30.0  # a failure an hour, 30 s checkpoints
    tau = optimal_interval_s(write, rate)
    # d/dτ [(e^{λ(τ+C)} − 1)/τ] = 0  ⇔  (1 − λτ) e^{λ(τ+C)} = 1
    assert (1 - rate * tau) * math.exp(rate * (tau + write)) == pytest.approx(1.0, abs=1e-12)
    walls = [expected_wall_s(1e6, t, write, 600.0, rate) for t in (0.9 * tau, tau, 1.1 * tau)]
    assert walls[1] < walls[0] and walls[1] < walls[2]
    # Young's sqrt(2 × 30 × 3,600) = 464.8 s; with λC = 1/120 the exact optimum is lower
    assert young_daly_interval_s(write, 3600.0) == pytest.approx(464.758, abs=1e-3)
    assert 430 < tau < 464.758


def test_without_failures_only_the_checkpoints_cost() -> None:
    # 1,000 steps of 10 s, a 1 s checkpoint every 100 steps: 10 checkpoints, T = 10,010 s
    assert expected_wall_s(10_000.0, 1000.0, 1.0, 600.0, 0.0) == 10_010.0
    # a vanishing failure rate tends to the same
    g = _run(steps=1000, mtbf_gpu_hours=1e15, checkpoint_every_steps=100)
    assert g.wall_s == pytest.approx(10_010.0, rel=1e-6)
    assert g.goodput == pytest.approx(10_000 / 10_010, rel=1e-6)


def test_tokens_become_whole_steps_and_a_duration_whole_steps() -> None:
    # 1e9 tokens / 4e6 per step = 250 steps exactly; 1.0000001e9 → 251
    assert _run(tokens=1e9).steps == 250
    assert _run(tokens=1.0000001e9).steps == 251
    # every 30 minutes at 10 s a step: 1,800 / 10 = 180 steps
    assert _run(steps=10_000, checkpoint_every_s=1800.0).checkpoint_every_steps == 180


def test_the_storage_system_caps_the_checkpoint_write() -> None:
    # the whole 1 TB at 100 GB/s: 10 s, longer than the busiest device's 1 s
    assert _run(steps=100, storage_gb_per_s=100.0).checkpoint_write_s == pytest.approx(10.0)
    # at 10 TB/s: 0.1 s, shorter: the device's 1 s stands
    assert _run(steps=100, storage_gb_per_s=10_000.0).checkpoint_write_s == 1.0


@pytest.mark.parametrize(("text", "tokens"), [
    ("15T", 15e12), ("1.5e13", 1.5e13), ("300B", 3e11), ("2.5M", 2.5e6), ("1000", 1000.0),
    ("15t", 15e12)])
def test_tokens_parse(text: str, tokens: float) -> None:
    assert parse_tokens(text) == tokens


@pytest.mark.parametrize("text", ["15X", "", "-3T", "0", "T", "1e400", "nan"])
def test_bad_tokens_are_refused(text: str) -> None:
    with pytest.raises(SpecError):
        parse_tokens(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("500", (500, None)), ("90s", (None, 90.0)), ("30m", (None, 1800.0)),
    ("30min", (None, 1800.0)), ("2h", (None, 7200.0)), ("1.5d", (None, 129_600.0))])
def test_intervals_parse(text: str, parsed: tuple) -> None:
    assert parse_interval(text) == parsed


@pytest.mark.parametrize("text", ["0", "-5", "0s", "5 weeks", "h"])
def test_bad_intervals_are_refused(text: str) -> None:
    with pytest.raises(SpecError):
        parse_interval(text)


@pytest.mark.parametrize("spec", [
    {"steps": 10, "mtbf_gpu_hours": -1.0}, {"steps": 10, "mtbf_gpu_hours": 0.0},
    {"steps": 10, "checkpoint_gb_per_s": -2.0}, {"steps": 10, "storage_gb_per_s": 0.0},
    {"steps": 10, "restart_s": -60.0}, {"steps": 0}, {"tokens": -1.0}, {},
    {"steps": 10, "tokens": 1e9},
    {"steps": 10, "checkpoint_every_steps": 5, "checkpoint_every_s": 60.0}])
def test_bad_specs_are_refused(spec: dict) -> None:
    with pytest.raises(SpecError):
        GoodputSpec(**spec)


def test_a_failure_rate_no_step_survives_is_refused_not_infinite() -> None:
    # 1,000 GPUs at 0.001 GPU-hours each: λ = 277.8 per second; e^{λ × 11 s} overflows
    with pytest.raises(SpecError, match="never finish"):
        _run(steps=10, mtbf_gpu_hours=0.001)
    with pytest.raises(SpecError):
        _run(steps=10, run={"device_gb_per_s": 0.0})
