"""What ``zrt validate`` tells a user beyond the per-record table: the summary grouped by
source, model family and hardware, and one record's predicted breakdown beside what its
source published (``--explain ID``)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zrt_core.errors import UnknownNameError
from zrt_core.validate_groups import (
    GROUPS,
    SCORED,
    grouped,
    source_of,
)

if TYPE_CHECKING:
    from zrt_core.validate import Record, Validator

GIB = 2.0**30


# -- one record, explained ------------------------------------------------------------------


def find_record(records: Sequence[Record], record_id: str, where: str) -> Record:
    """The record with this id.

    :raises UnknownNameError: no record has it; the message names the closest ids.
    """
    for r in records:
        if r.id == record_id:
            return r
    ids = [r.id for r in records]
    close = difflib.get_close_matches(record_id, ids, n=3, cutoff=0.3) or \
        [i for i in ids if record_id.lower() in i.lower()][:3]
    hint = f"closest: {', '.join(close)}" if close else \
        "zrt validate FILE lists every record's id"
    raise UnknownNameError(f"no record {record_id!r} in {where}", hint)


def explain(validator: Validator, record: Record) -> dict[str, Any]:
    """One record predicted with its breakdown, beside what the source published.

    ``published`` is the record's ``measured``; ``predicted`` and ``error`` the quantities
    zrt predicts for it; ``breakdown`` the step-time identity, compute by op category,
    exposed communication by group and memory per device (training), or TTFT, TPOT,
    throughput, batch, the prefill and decode steps by category and memory per device
    (serving); ``assumptions`` the defaults zrt took for fields the source left out.

    :raises ZrtError: the record cannot be predicted (its one-line reason).
    """
    from zrt_core.validate import check_record, layer_case

    check_record(record, set())
    raw = record.raw
    model = raw.get("model") or {}
    head = {"id": record.id, "source": raw.get("source"), "workload": record.workload,
            "model": model.get("name") or record.model_type, "model_type": record.model_type,
            "hardware": record.hardware, "num_gpus": record.num_gpus,
            "precision": raw.get("precision"), "published_layout": dict(raw.get("parallel")
                                                                        or {}),
            "published": record.measured, "notes": raw.get("notes")}
    if record.workload == "infer":
        report, case = validator.inference_report(record)
        body = _serving(report)
        assumptions = case.assumptions
    else:
        if record.workload == "layer":
            case = layer_case(record)
            from zrt_core.estimate.training import capture_dtype, estimate_case

            captured = validator.training_capture(case.config, case.train.micro_batch,
                                                  case.train.seq_len,
                                                  capture_dtype(case.train.precision))
            report = estimate_case(case, host=validator.host, captured=captured)
        else:
            report, case = validator.training_report(record)
        body = _training(report)
        assumptions = case.assumptions
    predicted = body.pop("predicted")
    error = {k: (predicted[k] - v) / v for k, v in record.measured.items()
             if isinstance(predicted.get(k), int | float) and v}
    return {**head, "predicted": predicted, "error": error, **body,
            "assumptions": list(assumptions),
            "estimate_notes": [n for n in report.notes
                               if not n.startswith("graph transforms:")]}


def _training(report: Any) -> dict[str, Any]:
    mem = report.memory
    predicted = {"step_time_s": report.step_time_s,
                 "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu, "mfu": report.mfu,
                 "hfu": report.hfu}
    if mem is not None:
        predicted["memory_gib_per_device"] = mem.peak_bytes / GIB
    return {
        "predicted": predicted,
        "layout": {**report.parallel.to_json(), "schedule": report.schedule,
                   "microbatches": report.microbatches, **report.train.to_json()},
        "step": {"step_time_s": report.step_time_s, "pipeline_s": report.pipeline_s,
                 "optimizer_s": report.optimizer_s,
                 "optimizer_comm_exposed_s": report.optimizer_comm_exposed_s,
                 "compute_s": report.compute_s, "forward_s": report.forward_s,
                 "backward_s": report.backward_s, "recompute_s": report.recompute_s,
                 "pipeline_exposed_comm_s": report.pipeline_exposed_comm_total_s,
                 "bubble_s": report.bubble_s},
        "compute_by_category_s": dict(sorted(report.compute_by_category_s.items(),
                                             key=lambda kv: -kv[1])),
        "exposed_comm_s": {"pipeline": dict(report.pipeline_exposed_comm_s),
                           "step": dict(report.exposed_comm_s),
                           "hidden": dict(report.hidden_comm_s)},
        "memory": mem.to_json() if mem is not None else None,
    }


def _serving(report: Any) -> dict[str, Any]:
    mem = report.memory
    out = report.to_json()
    predicted = {k: out[k] for k in ("output_tokens_per_s", "output_tokens_per_s_per_gpu",
                                     "ttft_ms", "tpot_ms", "batch", "max_batch")}
    if mem is not None:
        predicted["memory_gib_per_device"] = out["memory_gib_per_device"]
    return {
        "predicted": predicted,
        "layout": {**dict(report.parallel), "engine": report.engine, "mode": report.mode,
                   **dict(report.workload)},
        "phases": {name: (getattr(report, name).to_json() if getattr(report, name) else None)
                   for name in ("prefill", "decode")},
        "throughput_model": dict(report.throughput),
        "memory": out["memory"],
    }


__all__ = ["GROUPS", "SCORED", "explain", "find_record", "grouped", "source_of"]
