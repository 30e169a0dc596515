"""Calibration: every fitted parameter of zrt fitted by code (a 1-D search per parameter
on the records it moves), so the fit can be re-run with records left out and its
cross-validated error reported (docs/calibration.md, ``benchmarks/bench_crossval.py``)."""

from zrt_core.calibrate.fitting import (
    FALLBACKS,
    CachedPredictor,
    CrossValidation,
    Fit,
    Param,
    ParamFit,
    Predictor,
    Sample,
    applying,
    cross_validate,
    errors_at,
    fit,
    grid,
    mape,
    relative_error,
    source_of,
)

__all__ = [
    "FALLBACKS",
    "CachedPredictor",
    "CrossValidation",
    "Fit",
    "Param",
    "ParamFit",
    "Predictor",
    "Sample",
    "applying",
    "cross_validate",
    "errors_at",
    "fit",
    "grid",
    "mape",
    "relative_error",
    "source_of",
]
