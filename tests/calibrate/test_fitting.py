"""zrt_core.calibrate.fitting on synthetic records: the coarse-then-fine search, the fallbacks
of unfittable parameters, coordinate descent over shared records, and leave-one-group-out
cross-validation, with exact numbers.

Every synthetic record has a base time of 10 and is measured at ``10 / true``: a predictor
``10 / v`` (v the parameter's value) then has the relative error ``true / v − 1``."""

from __future__ import annotations

import math

import pytest

from zrt_core.calibrate.fitting import (
    CachedPredictor,
    Param,
    Sample,
    cross_validate,
    errors_at,
    fit,
    grid,
    mape,
    source_of,
)


def sample(rid: str, hardware: str, true: float, precision: str | None = None) -> Sample:
    return Sample(id=rid, hardware=hardware, workload="train", quantity="step_time_s",
                  measured=10 / true, precision=precision)


def predict(s: Sample, values: dict[str, float]) -> float:
    # each applying parameter divides the base time: 10 / (v1 · v2 ...)
    return 10 / math.prod(values.values()) if values else 10.0


SUSTAINED_A = Param("a.sustained", "matmul_sustained", ("hw_a",), default=1.0, shipped=0.8,
                    fallback="field_mean")
SUSTAINED_B = Param("b.sustained", "matmul_sustained", ("hw_b",), default=1.0, shipped=0.7,
                    fallback="field_mean")
FP4_B = Param("b.fp4", "matmul_fp4", ("hw_b",), precisions=("nvfp4",), default=0.77,
              shipped=0.44, fallback="default")


def test_grid_and_source() -> None:
    assert grid(0.40, 0.60, 0.05) == [0.4, 0.45, 0.5, 0.55, 0.6]
    assert grid(0.40, 0.63, 0.05) == [0.4, 0.45, 0.5, 0.55, 0.6]  # never past hi
    assert source_of("mbridge-qwen3-30b-b200") == "mbridge"
    assert source_of("trtllm") == "trtllm"
    assert mape([0.1, -0.3, None]) == pytest.approx(0.2)
    assert mape([None]) is None


def test_fit_finds_a_value_between_coarse_points() -> None:
    # true 0.83: coarse grid 0.40..1.00 by 0.05 scores |0.83/v − 1|: 0.80 → 0.0375,
    # 0.85 → 0.0235, so 0.85; the fine grid 0.80..0.90 by 0.01 holds 0.83 (error 0).
    samples = [sample(f"s1-{i}", "hw_a", 0.83) for i in range(3)]
    calls = CachedPredictor(predict)
    result = fit(samples, [SUSTAINED_A], calls)
    assert result.values["a.sustained"] == 0.83
    (pf,) = result.params
    assert (pf.how, pf.records, pf.mape) == ("fitted", 3, 0.0)
    # 13 coarse + 11 fine values, 0.80/0.85/0.90 shared: 21 distinct values × 3 records
    assert calls.calls == 21 * 3


def test_unfittable_parameters_take_their_fallback() -> None:
    # hw_a: 3 records (fitted to 0.8); hw_b: 2 records, under min_records 3, so
    # b.sustained takes the mean of the fitted matmul_sustained values (0.8 alone) and
    # b.fp4, with no nvfp4 record at all, its default 0.77.
    samples = [sample(f"s1-{i}", "hw_a", 0.8) for i in range(3)] + \
        [sample(f"s2-{i}", "hw_b", 0.6) for i in range(2)]
    result = fit(samples, [SUSTAINED_A, SUSTAINED_B, FP4_B], predict)
    assert dict(result.values) == {"a.sustained": 0.8, "b.sustained": 0.8, "b.fp4": 0.77}
    hows = {p.name: (p.how, p.records) for p in result.params}
    assert hows == {"a.sustained": ("fitted", 3),
                    "b.sustained": ("fallback: mean of the 1 fitted matmul_sustained value(s)",
                                    2),
                    "b.fp4": ("fallback: default", 0)}


def test_shared_records_are_fitted_by_coordinate_descent() -> None:
    # hw_b bf16 records measured at 10 / 0.9 fix b.sustained = 0.9; the nvfp4 ones at
    # 10 / (0.9 · 0.5) = 10 / 0.45 need b.fp4 = 0.5 once b.sustained is 0.9. The first pass
    # fits b.sustained on the three records only it moves (0.9; on all eight, with b.fp4 at
    # its default 0.77, the five nvfp4 records would hold it near 0.45 / 0.77 = 0.58 and
    # the descent would stay there), then b.fp4 on the nvfp4 ones (0.5); every error 0.
    samples = [sample(f"s1-{i}", "hw_b", 0.9, "bf16") for i in range(3)] + \
        [sample(f"s2-{i}", "hw_b", 0.45, "nvfp4") for i in range(5)]
    result = fit(samples, [SUSTAINED_B, FP4_B], predict)
    assert dict(result.values) == {"b.sustained": 0.9, "b.fp4": 0.5}
    assert [(p.records, p.mape) for p in result.params] == [(8, 0.0), (5, 0.0)]
    errs = errors_at(samples, [SUSTAINED_B, FP4_B], result.values, predict)
    assert max(abs(e) for e in errs.values()) < 1e-12


def test_leave_one_source_out_and_one_hardware_out() -> None:
    # Source s1 measures hw_a at 0.80, s2 at 0.90 (3 records each); s3 measures hw_b at 0.70.
    samples = [sample(f"s1-{i}", "hw_a", 0.8) for i in range(3)] + \
        [sample(f"s2-{i}", "hw_a", 0.9) for i in range(3)] + \
        [sample(f"s3-{i}", "hw_b", 0.7) for i in range(3)]
    params = [SUSTAINED_A, SUSTAINED_B]
    # In sample: on [0.8, 0.9] the six hw_a errors sum to 3·(1 − 0.8/v) + 3·(0.9/v − 1) =
    # 0.3/v, least at v = 0.9 (MAPE 0.1/0.9/2 = 0.0556); hw_b fits 0.7 exactly.
    full = fit(samples, params, predict)
    assert dict(full.values) == {"a.sustained": 0.9, "b.sustained": 0.7}
    assert mape(errors_at(samples, params, full.values, predict).values()) == \
        pytest.approx(3 * (1 - 0.8 / 0.9) / 9)
    # Leave one source out: without s1, hw_a fits 0.9 and s1 is off by 0.8/0.9 − 1 =
    # −11.1%; without s2, 0.8 and s2 by 0.9/0.8 − 1 = +12.5%; without s3 hw_b has no
    # record and takes the mean of the fitted sustained values (hw_a's 0.9 on all six
    # records): s3 off by 0.7/0.9 − 1 = −22.2%.
    loso = cross_validate(samples, params, predict, lambda s: s.source)
    assert loso.errors["s1-0"] == pytest.approx(0.8 / 0.9 - 1)
    assert loso.errors["s2-0"] == pytest.approx(0.9 / 0.8 - 1)
    assert loso.errors["s3-0"] == pytest.approx(0.7 / 0.9 - 1)
    assert mape(loso.errors.values()) == pytest.approx(
        (3 * (1 - 0.8 / 0.9) + 3 * (0.9 / 0.8 - 1) + 3 * (1 - 0.7 / 0.9)) / 9)
    assert loso.folds["s3"].params[1].how.startswith("fallback: mean")
    # Leave one hardware out: without hw_a, a.sustained takes hw_b's 0.7: s1 off by
    # 0.8/0.7 − 1, s2 by 0.9/0.7 − 1; without hw_b, b.sustained takes hw_a's 0.9.
    loho = cross_validate(samples, params, predict, lambda s: s.hardware)
    assert loho.errors["s1-2"] == pytest.approx(0.8 / 0.7 - 1)
    assert loho.errors["s2-2"] == pytest.approx(0.9 / 0.7 - 1)
    assert loho.errors["s3-2"] == pytest.approx(0.7 / 0.9 - 1)
    assert set(loho.folds) == {"hw_a", "hw_b"}


def test_a_record_zrt_cannot_predict_is_left_out_of_the_score() -> None:
    samples = [sample(f"s1-{i}", "hw_a", 0.8) for i in range(3)]

    def flaky(s: Sample, values: dict[str, float]) -> float | None:
        return None if s.id == "s1-0" else predict(s, values)

    result = fit(samples, [SUSTAINED_A], flaky)
    assert result.values["a.sustained"] == 0.8
    assert errors_at(samples, [SUSTAINED_A], result.values, flaky)["s1-0"] is None


def test_a_bad_fallback_is_refused() -> None:
    with pytest.raises(ValueError, match="fallback"):
        Param("x", "matmul", ("hw",), default=1.0, shipped=1.0, fallback="median")
