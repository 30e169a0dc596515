"""The model catalogue as ``zrt models --json`` lists it (each registered model's published
parameter counts beside the analytic count from its config), and ``zrt capture --json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def model_rows(host: Any) -> list[dict[str, Any]]:
    """Every registered model as ``zrt models --json`` lists it: published parameter counts
    where the entry has them, the analytic count from the config beside them."""
    rows = []
    for m in sorted(host.models, key=lambda m: m.key):
        computed_total, computed_active = _computed(m.config_dict())
        rows.append({
            "key": m.key, "name": m.name, "model_type": m.model_type,
            "aliases": list(m.aliases),
            "total_params_b": m.total_params_b, "active_params_b": m.active_params_b,
            "computed_total_params_b": computed_total,
            "computed_active_params_b": computed_active,
            "source": m.source,
            "distribution": host.models.distribution_of(m.key),
        })
    return rows


def _computed(config: Mapping[str, Any]) -> tuple[float | None, float | None]:
    from zrt_core.errors import ZrtError
    from zrt_core.modelmath.flops import param_counts

    try:
        counts = param_counts(config)
    except ZrtError:
        return None, None
    return round(counts.total / 1e9, 3), round(counts.active / 1e9, 3)


def capture_json(result: Any, summaries: Any, exported: Any, timings: dict[str, float]
                 ) -> dict[str, Any]:
    """What ``zrt capture --json`` prints (and a server capture job answers)."""
    out = {
        "model": result.model,
        "model_type": result.model_type,
        "source": result.source,
        "batch": result.options.batch,
        "seq_len": result.options.seq_len,
        "dtype": result.options.dtype,
        "full_depth": result.options.full_depth,
        "params": {"total": result.params.total, "active": result.params.active},
        "analytic_params": analytic_params(result.config),
        "build_s": round(timings.get("build", 0.0), 3),
        "phases": {s.phase: s.to_json() for s in summaries},
        "warnings": list(result.warnings),
    }
    if exported is not None:
        out["out"] = {"dir": str(exported.out_dir),
                      "files": [str(p) for p in exported.files],
                      "notes": list(exported.notes)}
    return out


def analytic_params(config: Any) -> dict[str, Any] | None:
    """The analytic parameter counts of the captured config (None for families the
    analytic model does not describe)."""
    from zrt_core.errors import ZrtError
    from zrt_core.modelmath.flops import param_counts

    try:
        return param_counts(dict(config)).to_json()
    except ZrtError:
        return None
