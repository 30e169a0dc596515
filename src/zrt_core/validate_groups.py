"""How ``zrt validate`` groups its summary: by source (the id's first token), model family,
hardware and family × hardware, with each group's MAPE and bias (re-exported by
:mod:`zrt_core.validate_report`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zrt_core.validate import RecordResult


def source_of(record_id: str) -> str:
    """A record's source: the first token of its id before ``-`` (``mbridge-...``)."""
    return record_id.split("-", 1)[0]


#: How the summary groups records: by source (the id's first token), model family (the
#: config's ``model_type``), hardware id, and the two together.
GROUPS: dict[str, Callable[[RecordResult], str]] = {
    "source": lambda r: source_of(r.id),
    "family": lambda r: r.model_type or "?",
    "hardware": lambda r: r.hardware or "?",
    "family_hardware": lambda r: f"{r.model_type or '?'} on {r.hardware or '?'}",
}

#: A family × hardware group whose mean signed error is past this is listed on its own
#: (issue 9's target: no such group beyond ±15%).
BIAS_LINE = 0.15


#: The quantity a group's MAPE and bias are of, per workload (the first a record has):
#: one quantity per workload, so a bias keeps its sign's meaning (a step time predicted
#: short and a throughput predicted high are the same mistake).
SCORED = {"train": ("step_time_s",),
          "infer": ("output_tokens_per_s", "output_tokens_per_s_per_gpu"),
          "layer": ("fwd_plus_bwd_ms_per_layer", "fwd_ms_per_layer", "bwd_ms_per_layer")}


def grouped(results: Iterable[RecordResult], key: Callable[[RecordResult], str]
            ) -> dict[str, dict[str, dict[str, Any]]]:
    """``{group: {workload: {records, ok, scored, mape, bias}}}``: per group and workload,
    the records, those predicted, and the MAPE and mean signed error of the quantity
    :data:`SCORED` names (training records measuring only an MFU are counted, not scored).
    Workloads stay apart: their quantities differ."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        entry = out.setdefault(key(r), {}).setdefault(r.workload or "?", {
            "records": 0, "ok": 0, "errors": []})
        entry["records"] += 1
        if not r.ok:
            continue
        entry["ok"] += 1
        q = next((q for q in SCORED.get(r.workload, ()) if q in r.error), None)
        if q is not None:
            entry["errors"].append(r.error[q])
    for workloads in out.values():
        for entry in workloads.values():
            errs = entry.pop("errors")
            entry.update(scored=len(errs),
                         mape=statistics.fmean(abs(e) for e in errs) if errs else None,
                         bias=statistics.fmean(errs) if errs else None)
    return dict(sorted(out.items()))
