"""Fit zrt's fitted parameters by code and cross-validate them: a coarse-then-fine 1-D
search per parameter on the mean absolute percentage error of the records it moves.

Nothing here knows how a record is predicted: a *predictor* ``(sample, values) -> float``
gives a sample's predicted quantity under the values of the parameters that apply to it
(:mod:`zrt_core.calibrate.records` predicts validation records with zrt's estimators;
the tests use synthetic ones). docs/calibration.md describes the procedure and the rules.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from attrs import field, frozen

from zrt_core.validate_report import source_of

#: ``(sample, values) -> predicted quantity`` (None: zrt cannot predict the sample).
#: ``values`` holds exactly the parameters that apply to the sample, by name.
Predictor = Callable[["Sample", Mapping[str, float]], "float | None"]

#: How a parameter that cannot be fitted (fewer than ``min_records`` records in the fit)
#: gets its value: its documented default, or the mean of the values fitted for the other
#: parameters of the same efficiency field in the same fit (the default when none was).
FALLBACKS = ("default", "field_mean")


def _ro(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


@frozen
class Sample:
    """One measured quantity of one record: what a fit scores and a fold holds out."""

    id: str
    hardware: str
    workload: str
    quantity: str
    measured: float
    precision: str | None = None
    family: str = ""

    @property
    def source(self) -> str:
        return source_of(self.id)


@frozen
class Param:
    """One fitted parameter: an efficiency field shared by ``hardware`` (a die's variants),
    fitted on the records on that hardware (at ``precisions``, every precision when None).

    :param default: the value without the fit (a publication's, or the neutral 1), taken
        when the parameter cannot be fitted and ``fallback`` is ``default``.
    :param shipped: the value the hardware pack ships (the fit on every record, as
        committed).
    :param lo: lowest value searched; :param hi: highest.
    :param min_records: fewer records than this in a fit leave the parameter unfitted.
    :param basis: where ``default`` comes from (docs/calibration.md).
    """

    name: str
    field: str
    hardware: tuple[str, ...] = field(converter=tuple)
    default: float
    shipped: float
    precisions: tuple[str | None, ...] | None = None
    lo: float = 0.40
    hi: float = 1.00
    fallback: str = field(default="default")
    min_records: int = 3
    basis: str = ""

    @fallback.validator
    def _check_fallback(self, _attr: Any, value: str) -> None:
        if value not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {value!r}")

    def applies(self, sample: Sample) -> bool:
        if sample.hardware not in self.hardware:
            return False
        return self.precisions is None or sample.precision in self.precisions


@frozen
class ParamFit:
    """How one parameter got its value in one fit: ``how`` is ``fitted`` or the fallback
    taken; ``records`` the records it was fitted on; ``mape`` their MAPE at the value."""

    name: str
    value: float
    how: str
    records: int
    mape: float | None = None


@frozen
class Fit:
    """The values of every parameter after one fit, and how each was reached."""

    values: Mapping[str, float] = field(converter=_ro)
    params: tuple[ParamFit, ...] = field(converter=tuple)


def applying(params: Iterable[Param], sample: Sample, values: Mapping[str, float]
             ) -> dict[str, float]:
    """The values of the parameters that apply to ``sample``."""
    return {p.name: values[p.name] for p in params if p.applies(sample)}


class CachedPredictor:
    """A predictor remembered per sample and values: a fit's searches and the folds of a
    cross-validation ask for the same predictions many times."""

    def __init__(self, predict: Predictor) -> None:
        self.predict = predict
        self.calls = 0
        self._memo: dict[tuple[str, tuple[tuple[str, float], ...]], float | None] = {}

    def __call__(self, sample: Sample, values: Mapping[str, float]) -> float | None:
        key = (sample.id, tuple(sorted((k, round(v, 6)) for k, v in values.items())))
        if key not in self._memo:
            self.calls += 1
            self._memo[key] = self.predict(sample, values)
        return self._memo[key]


def relative_error(predicted: float | None, measured: float) -> float | None:
    """``(predicted − measured) / measured``; None when there is no prediction."""
    if predicted is None:
        return None
    return (predicted - measured) / measured


def mape(errors: Iterable[float | None]) -> float | None:
    vals = [abs(e) for e in errors if e is not None]
    return statistics.fmean(vals) if vals else None


def grid(lo: float, hi: float, step: float) -> list[float]:
    """``lo, lo + step, ... ≤ hi`` rounded to 6 places (exact keys for the caches)."""
    n = math.floor((hi - lo) / step + 1e-9)
    return [round(lo + i * step, 6) for i in range(n + 1)]


def errors_at(samples: Sequence[Sample], params: Sequence[Param], values: Mapping[str, float],
              predict: Predictor) -> dict[str, float | None]:
    """Each sample's relative error at ``values`` (None where it cannot be predicted)."""
    return {s.id: relative_error(predict(s, applying(params, s, values)), s.measured)
            for s in samples}


def _search(param: Param, members: Sequence[Sample], params: Sequence[Param],
            values: dict[str, float], predict: Predictor, coarse_step: float,
            fine_step: float) -> tuple[float, float | None]:
    """The value of ``param`` (others held at ``values``) with the least MAPE over
    ``members``: the best of a ``coarse_step`` grid over [lo, hi], then the best of a
    ``fine_step`` grid within one coarse step of it; ties go to the value nearest the
    default. Predictions are asked record by record (all values of one record, then the
    next), which keeps the estimators' per-record caches warm."""

    def table(candidates: Sequence[float]) -> dict[float, float | None]:
        errs: dict[float, list[float]] = {v: [] for v in candidates}
        for s in members:
            for v in candidates:
                vals = applying(params, s, {**values, param.name: v})
                e = relative_error(predict(s, vals), s.measured)
                if e is not None:
                    errs[v].append(abs(e))
        return {v: (statistics.fmean(es) if es else None) for v, es in errs.items()}

    def best(scores: Mapping[float, float | None]) -> float:
        scored = [v for v, m in scores.items() if m is not None]
        if not scored:
            return param.default
        return min(scored, key=lambda v: (round(scores[v], 12), abs(v - param.default), v))

    coarse = table(grid(param.lo, param.hi, coarse_step))
    c = best(coarse)
    fine_lo = max(param.lo, round(c - coarse_step, 6))
    fine_hi = min(param.hi, round(c + coarse_step, 6))
    fine = table(grid(fine_lo, fine_hi, fine_step))
    f = best(fine)
    return f, fine.get(f)


def fit(samples: Sequence[Sample], params: Sequence[Param], predict: Predictor, *,
        coarse_step: float = 0.05, fine_step: float = 0.01, rounds: int = 2) -> Fit:
    """Fit every parameter on ``samples``.

    Each parameter with at least ``min_records`` samples it applies to is searched in turn
    (:func:`_search`) with the others held at their current values, starting from the
    defaults. When two parameters share samples (a die's sustained rate and its fp4 rate
    both move an fp4 record) the pass is repeated (``rounds`` in all: coordinate descent),
    and the first pass fits each parameter on the samples no other fittable parameter
    moves, where it has ``min_records`` of them: a shared sample cannot then pull a
    parameter off the value its own records give before the other parameter has been
    fitted. Without shared samples one pass is exact. Then each parameter left unfitted
    takes its fallback (:data:`FALLBACKS`)."""
    values = {p.name: p.default for p in params}
    members = {p.name: [s for s in samples if p.applies(s)] for p in params}
    fittable = [p for p in params if len(members[p.name]) >= p.min_records]
    own = {p.name: [s for s in members[p.name]
                    if not any(q.applies(s) for q in fittable if q is not p)]
           for p in fittable}
    shared = any(len(own[p.name]) < len(members[p.name]) for p in fittable)
    scores: dict[str, float | None] = {}
    for round_ in range(rounds if shared else 1):
        for p in fittable:
            on = own[p.name] if round_ == 0 and len(own[p.name]) >= p.min_records \
                else members[p.name]
            values[p.name], scores[p.name] = _search(p, on, params, values, predict,
                                                     coarse_step, fine_step)
        if shared:  # the score of each parameter on all its samples at the final values
            for p in fittable:
                scores[p.name] = mape(errors_at(members[p.name], params, values,
                                                predict).values())
    out = [ParamFit(p.name, values[p.name], "fitted", len(members[p.name]), scores[p.name])
           for p in fittable]
    fitted_by_field: dict[str, list[float]] = {}
    for p in fittable:
        fitted_by_field.setdefault(p.field, []).append(values[p.name])
    for p in params:
        if p in fittable:
            continue
        same = fitted_by_field.get(p.field)
        if p.fallback == "field_mean" and same:
            values[p.name] = round(statistics.fmean(same), 6)
            how = f"fallback: mean of the {len(same)} fitted {p.field} value(s)"
        else:
            values[p.name] = p.default
            how = "fallback: default" + (f" ({p.basis})" if p.basis else "")
        out.append(ParamFit(p.name, values[p.name], how, len(members[p.name])))
    order = {p.name: i for i, p in enumerate(params)}
    return Fit(values=values, params=sorted(out, key=lambda f: order[f.name]))


@frozen
class CrossValidation:
    """Held-out errors of a cross-validation: each sample's error when its group was left
    out of the fit, and each fold's fit."""

    errors: Mapping[str, float | None] = field(converter=_ro)
    folds: Mapping[str, Fit] = field(converter=_ro)


def cross_validate(samples: Sequence[Sample], params: Sequence[Param], predict: Predictor,
                   group_of: Callable[[Sample], str], **options: Any) -> CrossValidation:
    """Leave one group out at a time (a source, a hardware): fit every parameter on the
    other groups' samples and predict the held-out ones with those values; every sample is
    held out exactly once. ``options`` go to :func:`fit`."""
    groups = sorted({group_of(s) for s in samples})
    errors: dict[str, float | None] = {}
    folds: dict[str, Fit] = {}
    for g in groups:
        train = [s for s in samples if group_of(s) != g]
        held = [s for s in samples if group_of(s) == g]
        folds[g] = fit(train, params, predict, **options)
        errors.update(errors_at(held, params, folds[g].values, predict))
    return CrossValidation(errors=errors, folds=folds)


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
