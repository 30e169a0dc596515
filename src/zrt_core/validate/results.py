"""Results: one record's prediction and errors, and a run's summary (MAPE by quantity,
workload and group).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.validate.schema import (
    INFER_METRICS,
    INFORMATIONAL,
    LAYER_METRICS,
    PRIMARY,
    SCHEMA_VERSION,
    THROUGHPUT,
    TRAIN_METRICS,
    WORKLOADS,
    _ro,
)

if TYPE_CHECKING:
    pass


# -- results -------------------------------------------------------------------------------


@frozen
class RecordResult:
    """One record's outcome. ``error`` is ``(predicted − measured) / measured`` for each
    measured quantity that was predicted; a failed record has ``status == "error"`` and a
    one-line ``message``."""

    id: str
    status: str
    workload: str
    hardware: str
    num_gpus: int | None
    model_type: str = ""
    predicted: Mapping[str, float] = field(factory=dict, converter=_ro)
    measured: Mapping[str, float] = field(factory=dict, converter=_ro)
    error: Mapping[str, float] = field(factory=dict, converter=_ro)
    message: str = ""
    assumptions: tuple[str, ...] = field(default=(), converter=tuple)
    notes: tuple[str, ...] = field(default=(), converter=tuple)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def primary(self) -> str | None:
        """The quantity this record is ranked by: the first of :data:`PRIMARY` it has."""
        for k in PRIMARY.get(self.workload, ()):
            if k in self.error:
                return k
        return None

    def to_json(self) -> dict[str, Any]:
        if not self.ok:
            return {"id": self.id, "status": "error", "message": self.message,
                    "workload": self.workload, "hardware": self.hardware,
                    "num_gpus": self.num_gpus, "measured": dict(self.measured)}
        return {"id": self.id, "status": "ok", "predicted": dict(self.predicted),
                "measured": dict(self.measured), "error": dict(self.error),
                "workload": self.workload, "hardware": self.hardware,
                "num_gpus": self.num_gpus, "assumptions": list(self.assumptions),
                "notes": list(self.notes), "elapsed_s": self.elapsed_s}


def _mape(values: Iterable[float]) -> float | None:
    vals = [abs(v) for v in values]
    return statistics.fmean(vals) if vals else None


@frozen
class ValidationRun:
    """Every record's result, the file and the front-end used, and the wall time."""

    results: tuple[RecordResult, ...] = field(converter=tuple)
    path: str = ""
    frontend: str = "capture"
    elapsed_s: float = 0.0

    def errors_of(self, metric: str) -> list[float]:
        return [r.error[metric] for r in self.results if r.ok and metric in r.error]

    def summary(self, worst: int = 5) -> dict[str, Any]:
        """``records``, ``ok``, ``errors``, ``mape_step_time`` (train records),
        ``mape_throughput`` (tokens/s/GPU of train records and output tokens/s of infer
        records together), the MAPE per quantity and per workload, the ``worst`` records by
        the error of their primary quantity, and the failed records with their reasons."""
        ok = [r for r in self.results if r.ok]
        per_metric = {}
        for m in (*TRAIN_METRICS, *INFER_METRICS, *LAYER_METRICS):
            errs = self.errors_of(m)
            if errs:
                per_metric[m] = {"records": len(errs), "mape": _mape(errs),
                                 "bias": statistics.fmean(errs)}
        throughput = [e for m in THROUGHPUT for e in self.errors_of(m)]
        for r in ok:  # infer records measuring only the per-GPU rate
            if "output_tokens_per_s" not in r.error and \
                    "output_tokens_per_s_per_gpu" in r.error:
                throughput.append(r.error["output_tokens_per_s_per_gpu"])
        by_workload = {}
        for w in WORKLOADS:
            prim = [r.error[r.primary] for r in ok if r.workload == w and r.primary
                    and r.primary not in INFORMATIONAL]
            n = sum(1 for r in self.results if r.workload == w)
            if n:
                by_workload[w] = {"records": n,
                                  "ok": sum(1 for r in ok if r.workload == w),
                                  "mape_primary": _mape(prim)}
        ranked = sorted((r for r in ok if r.primary and r.primary not in INFORMATIONAL),
                        key=lambda r: -abs(r.error[r.primary]))
        from zrt_core.validate_groups import GROUPS, grouped

        groups = {f"by_{name}": grouped(self.results, key) for name, key in GROUPS.items()}
        return {
            "records": len(self.results),
            "ok": len(ok),
            "errors": len(self.results) - len(ok),
            "mape_step_time": _mape(self.errors_of("step_time_s")),
            "mape_throughput": _mape(throughput),
            "mape_by_quantity": per_metric,
            "by_workload": by_workload,
            **groups,
            "worst": [{"id": r.id, "quantity": r.primary, "error": r.error[r.primary]}
                      for r in ranked[:worst]],
            "failed": [{"id": r.id, "message": r.message} for r in self.results
                       if not r.ok],
            "frontend": self.frontend,
            "elapsed_s": self.elapsed_s,
        }

    def to_json(self) -> dict[str, Any]:
        """The shape SCHEMA.md specifies: ``records`` and ``summary``."""
        return {"schema_version": SCHEMA_VERSION, "file": self.path,
                "records": [r.to_json() for r in self.results],
                "summary": self.summary()}
