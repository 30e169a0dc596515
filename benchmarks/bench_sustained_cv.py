"""Fit one hardware's ``matmul_sustained`` (or another ``efficiency`` field) on its dense
training records and cross-validate.

    python benchmarks/bench_sustained_cv.py HARDWARE [--grid 0.70:1.00:0.01]
        [--field matmul --precision bf16] [--file FILE]

With ``--field``/``--precision`` the fit is of that field on the records of that precision
(``matmul`` for bf16/fp16, ``matmul_fp8`` for fp8/mxfp8).

Records: every dense (no MoE, no Mamba, no LoRA) ``workload: train`` record of HARDWARE with
a step time, plus the records that publish only an MFU from a known counter (NVIDIA's NeMo
long-sequence rows, NeMo 2's ``flops_formulas``: the full s² attention square;
:func:`zrt_core.source_flops.published_model_flops`), turned into a step time with the
same FLOPs the source divided by it. Prints the grid value with the least MAPE (ties toward 1), the
in-sample MAPE, and the leave-one-source-out MAPE (source: the id's first token): each
source's records predicted at the value fitted on the others (docs/cost-model.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path
from typing import Any

from _bench import VALIDATION

_NOT_DENSE = ("qwen", "deepseek", "gpt-oss", "nemotron3", "nemotron-h", "lora", "grok", "maverick",
              "mixtral")


def measured_step_s(record: dict[str, Any], peak_bf16_tflops: float) -> float | None:
    from zrt_core.source_flops import published_model_flops

    measured = record.get("measured") or {}
    if measured.get("step_time_s"):
        return float(measured["step_time_s"])
    counted = published_model_flops(record)
    if counted is not None and measured.get("mfu"):
        # the record's mfu is the published TFLOP/s over the bf16 peak
        return counted[0] / (measured["mfu"] * record["num_gpus"] * peak_bf16_tflops * 1e12)
    return None


def main() -> int:
    import yaml
    from attrs import evolve

    from zrt_core.errors import ZrtError
    from zrt_core.estimate.training import (
        capture_dtype,
        capture_for_training,
        case_from_record,
        estimate_case,
    )
    from zrt_core.plugins import get_plugin_manager

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hardware")
    parser.add_argument("--grid", default="0.70:1.00:0.01", help="start:stop:step")
    parser.add_argument("--file", type=Path, default=VALIDATION, help="validation records")
    parser.add_argument("--field", default="matmul_sustained",
                        help="the efficiency field to fit (default matmul_sustained)")
    parser.add_argument("--precision", default=None,
                        help="only records of this precision (null reads as bf16)")
    args = parser.parse_args()
    lo, hi, step = (float(x) for x in args.grid.split(":"))
    grid = [round(lo + i * step, 4) for i in range(round((hi - lo) / step) + 1)]
    host = get_plugin_manager()
    hw = host.hardware_spec(args.hardware)
    errors: dict[str, dict[float, float]] = {}
    with args.file.open(encoding="utf-8") as f:
        records = yaml.safe_load(f)
    for r in records:
        if r.get("workload") != "train" or r.get("hardware") != hw.id \
                or any(k in r["id"].lower() for k in _NOT_DENSE):
            continue
        if args.precision and (r.get("precision") or "bf16") != args.precision:
            continue
        measured = measured_step_s(r, hw.compute.bf16_tflops)
        if not measured:
            continue
        try:
            case = case_from_record(r)
            cap = capture_for_training(dict(case.config), case.train.micro_batch,
                                       case.train.seq_len,
                                       dtype=capture_dtype(case.train.precision), host=host)
        except ZrtError:
            continue
        row = {}
        for v in grid:
            spec = evolve(hw, efficiency=evolve(hw.efficiency, **{args.field: v}))
            with contextlib.suppress(ZrtError):
                t = estimate_case(case, host=host, captured=cap, hardware=spec).step_time_s
                row[v] = (t - measured) / measured
        errors[r["id"]] = row

    def mape(ids: list[str], v: float) -> float:
        return statistics.fmean(abs(errors[i][v]) for i in ids)

    now = getattr(hw.efficiency, args.field)
    current = min(grid, key=lambda v: abs(v - now))

    def fit(ids: list[str]) -> float:
        if len(ids) < 3:
            return current
        return min(grid, key=lambda v: (mape(ids, v), abs(v - now)))

    ids = sorted(errors)
    best = fit(ids)
    print(f"{hw.id}: {len(ids)} dense training records; {args.field} {now} -> {best}; "
          f"in-sample MAPE {mape(ids, current):.1%} -> {mape(ids, best):.1%}")
    for source in sorted({i.split("-")[0] for i in ids}):
        held = [i for i in ids if i.split("-")[0] == source]
        rest = [i for i in ids if i not in held]
        v = fit(rest)
        print(f"  leave out {source:10s} ({len(held):2d}): fitted {v} on the rest; held-out MAPE "
              f"{mape(held, current):.1%} -> {mape(held, v):.1%}")
    for i in ids:
        print(f"    {i:72s} {errors[i][current]:+.1%} -> {errors[i][best]:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
