"""Predict every training record of a validation file and print the step-time errors.

    python benchmarks/bench_train_validation.py [FILE] [--only SUBSTR] [--json OUT]
        [--cache DIR] [--verbose]
        [--fit | --fit-sustained | --fit-host | --fit-expert | --fit-overlap | --fit-a2a]

For each ``workload: train`` record: the inputs with Megatron-LM / NeMo defaults for null
fields (``zrt_core.estimate.training.case_from_record``), one capture per model,
micro-batch, sequence and dtype (in the capture cache; ``--cache DIR`` puts it there), the
estimate, and ``(predicted − measured) / measured`` for the step time (and tokens/s/GPU,
MFU where the record has them). Prints a row per record, the MAPE of the step time over
the records that measured it, the worst records, and the estimate's own time (capture
excluded). A record zrt cannot predict is listed with the reason and the run goes on.

Records whose source published no layout (the README's strong-scaling endpoints) are
estimated at the fastest feasible Megatron layout (``search_layout`` in
``zrt_core.estimate.training``); they carry only an MFU, so they do not enter the
step-time MAPE.

``--fit-sustained`` refits the packs' fitted parameters (each hardware's ``matmul_sustained``,
B200's NVFP4 rate) on all their records, training and serving, with ``zrt_core.calibrate``
(docs/calibration.md; ``bench_crossval.py`` cross-validates the same fit).

``--fit`` fits each hardware's GEMM efficiency per precision (``matmul``, ``matmul_fp8``,
``matmul_fp4`` of the hardware YAML's ``efficiency`` section) on every record on that
hardware at that precision with the same code (docs/training-model.md, "Calibration").

``--fit-host`` fits ``host_launch_us`` (host time per eager kernel launch) once per host CPU
type — the x86 hosts of DGX A100/H100/H200/B200/B300 and the Grace CPUs of GB200/GB300 — on
every training record of that type, dense and MoE, and prints the in-sample,
leave-one-source-out and leave-one-hardware-out step-time MAPE (docs/moe-training.md).

``--fit-expert`` fits ``expert_kernel_us`` (device time per per-expert GEMM of
TransformerEngine's ``GroupedLinear`` loop) the same way, one value for every NVIDIA GPU.

``--fit-overlap`` fits ``comm_overlap_sms`` (the SMs a collective's kernels hold while it
overlaps computation) the same way, one value for every NVIDIA GPU (docs/overlap-rules.md).

``--fit-a2a`` fits the network tier's ``all_to_all_efficiency`` (the rate of NCCL's
all-to-all traffic over InfiniBand) the same way, one value for every NVIDIA GPU (docs/collectives.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _bench import VALIDATION as DEFAULT_FILE
from _bench import result

#: Step-time MAPE over the records with a measured step time (docs/validation.md: 12.8%).
MAPE_TARGET = 0.15
#: One training estimate, capture excluded (the estimator's budget).
ESTIMATE_TARGET_MS = 300.0


def load_records(path: Path) -> list[dict[str, Any]]:
    import yaml

    with path.open(encoding="utf-8") as f:
        return [r for r in yaml.safe_load(f) if r.get("workload") == "train"]


def record_case(record: dict[str, Any]):
    from zrt_core.estimate.training import case_from_record

    return case_from_record(record)


def captured(case, host, cache: Path | None):
    """The training capture of a case, from the capture cache (``--cache DIR`` sets
    ``ZRT_CACHE_DIR``; entries are keyed on the config, the options and the installed
    versions, so a change to the capture code captures again)."""
    from zrt_core.estimate.training import capture_dtype, capture_for_training

    if cache is not None:
        os.environ["ZRT_CACHE_DIR"] = str(cache)
    return capture_for_training(dict(case.config), case.train.micro_batch,
                                case.train.seq_len, dtype=capture_dtype(case.train.precision),
                                host=host, use_cache=True)


#: Which efficiency field a record's GEMMs run at, by its precision.
FIT_FIELD = {"bf16": "matmul", "fp16": "matmul", None: "matmul", "fp8": "matmul_fp8",
             "mxfp8": "matmul_fp8", "nvfp4": "matmul_fp4"}


def _estimate(case, cap, host, hw=None):
    from zrt_core.estimate.training import estimate_case

    return estimate_case(case, host=host, captured=cap, hardware=hw or case.hardware)


def _fit(path: Path, only: str | None, cache: Path | None, params) -> dict[str, Any]:
    """Fit ``params`` with ``zrt_core.calibrate`` (the one fitting code, docs/calibration.md)
    on every record of the file, training and serving, and print each value."""
    from zrt_core.calibrate.records import fit_records
    from zrt_core.validate import load_records as load_all

    if cache is not None:
        os.environ["ZRT_CACHE_DIR"] = str(cache)
    records = [r for r in load_all(path) if not only or only in r.id]
    result, report = fit_records(records, params)
    out: dict[str, Any] = {}
    for p, pf in zip(params, result.params, strict=True):
        r = report[p.name]
        out[p.name] = {"records": r["records"], "shipped": p.shipped, "fitted": pf.value,
                       "how": pf.how, "mape_shipped": r["shipped_mape"],
                       "mape_fitted": r["fitted_mape"]}
        shown = "—" if r["shipped_mape"] is None else \
            f"{r['shipped_mape']:.1%} -> {r['fitted_mape']:.1%}"
        print(f"{p.name:34s} {r['records']:3d} records: {p.shipped} -> {pf.value} "
              f"({pf.how}; MAPE {shown})", flush=True)
    return out


def fit(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit each hardware's GEMM efficiency per precision (``matmul``, ``matmul_fp8``,
    ``matmul_fp4``) on every record on that hardware at that precision (0.40 … 1.00; fewer
    than three records: not fitted). The shipped values of these fields are publications'
    (docs/calibration.md): this shows what the records alone would say."""
    import yaml

    from zrt_core.calibrate import Param
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    with path.open(encoding="utf-8") as f:
        raw = [r for r in yaml.safe_load(f) if r.get("workload") in ("train", "infer")
               and (not only or only in str(r.get("id")))]
    groups: dict[tuple[str, str], set[str | None]] = {}
    for r in raw:
        precision = r.get("precision")
        key = None if precision is None else str(precision).lower()
        groups.setdefault((r["hardware"], FIT_FIELD.get(key, "matmul")), set()).add(key)
    params = []
    for (hw_id, field), precisions in sorted(groups.items(), key=str):
        current = getattr(host.hardware_spec(hw_id).efficiency, field)
        if current is None:
            continue
        params.append(Param(f"{hw_id}.{field}", field, (hw_id,), default=current,
                            shipped=current, precisions=tuple(precisions)))
    return _fit(path, only, cache, params)


def fit_sustained(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit the packs' fitted parameters (``zrt_core.calibrate.records.PACK_PARAMS``: the
    A100 and GH100 ``matmul_sustained``, B200's ``matmul_fp4``) on every record they move,
    training step times and serving output tokens/s together."""
    from zrt_core.calibrate.records import PACK_PARAMS

    return _fit(path, only, cache, PACK_PARAMS)


#: Host CPU types: one ``host_launch_us`` each (the hardware packs' value is the same for
#: every hardware of a type).
HOST_CPU_TYPES = {
    "x86": ("nvidia_a100_sxm_80g", "nvidia_h100_sxm", "nvidia_h200", "nvidia_h800",
            "nvidia_b200", "nvidia_b300"),
    "grace": ("nvidia_gb200_nvl72", "nvidia_gb300_nvl72"),
}
#: µs per launch, 0 … 35: up to the published host cost of one TransformerEngine Linear
#: forward on a DGX's Xeon (~36 µs: 99.7 µs on GB200's Grace scaled by torch.nn.Linear's
#: 13.5 µs Xeon / 37.1 µs Grace, TransformerEngine issue 2053; docs/moe-training.md); a
#: value beyond it would be fitting something else.
HOST_GRID = tuple(float(v) for v in range(0, 36, 5))
#: Values within this much MAPE of the best count as equal; the smallest of them is taken
#: (no more host time than the records ask for).
HOST_TIE = 0.001


def _grid_fit_value(errors: dict[str, dict[float, float]], ids: list[str],
                    grid: tuple[float, ...], tie: float, off: float = 0.0) -> float:
    """The value of ``grid`` with the lowest MAPE over ``ids``; of those within ``tie`` of
    it, the nearest to ``off`` (the value without the mechanism); ``off`` without records."""
    if not ids:
        return off
    scores = {v: statistics.fmean(abs(errors[i][v]) for i in ids) for v in grid}
    best = min(scores.values())
    return min((v for v, sc in scores.items() if sc <= best + tie), key=lambda v: abs(v - off))


def fit_host(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit ``host_launch_us`` per host CPU type (:data:`HOST_CPU_TYPES`) by grid search
    (:data:`HOST_GRID`) on the step-time MAPE of every training record of that type, and
    cross-validate the fit: refit without each source (the record id's first token) and
    without each hardware, and predict the records left out."""
    return _grid_fit(path, only, cache, "host_launch_us", HOST_GRID, HOST_CPU_TYPES,
                     HOST_TIE)


#: One ``expert_kernel_us`` for every NVIDIA GPU: a device-side cost per kernel of
#: TransformerEngine's per-expert GEMM loop (docs/moe-training.md).
EXPERT_GPU_TYPES = {
    "nvidia": HOST_CPU_TYPES["x86"] + HOST_CPU_TYPES["grace"],
}
#: µs per per-expert kernel, 0 … 30 in 2 µs steps: up to the cost of one per-expert GEMM of
#: TE's multi-stream cuBLAS loop measured kernel against kernel on B200 (0.267 ms for 8
#: experts of 128 rows, N = K = 2 048, NVFP4: ~33 µs each for ~1 GFLOP of work;
#: NVIDIA/TransformerEngine PR 3134, docs/moe-training.md).
EXPERT_GRID = tuple(float(v) for v in range(0, 31, 2))


def fit_expert(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit ``expert_kernel_us`` (:data:`EXPERT_GPU_TYPES`, :data:`EXPERT_GRID`) on the
    step-time MAPE of the training records it moves (those with TransformerEngine grouped
    GEMMs: the MoE records), with the same leave-one-source-out and leave-one-hardware-out
    report (over every record) as ``--fit-host``."""
    return _grid_fit(path, only, cache, "expert_kernel_us", EXPERT_GRID, EXPERT_GPU_TYPES,
                     HOST_TIE, moved_only=True)


#: SMs, 0 … 32 in steps of 4: up to NCCL's channel limit (one resident CTA per channel;
#: ``ncclConfig_t.maxCTAs``, 32 unless set) and TransformerEngine userbuffers' largest
#: ``num_sm`` in NeMo's H100 configurations (24); DeepEP's 20 and HybridEP's 16 lie inside.
OVERLAP_GRID = tuple(float(v) for v in range(0, 33, 4))


def fit_overlap(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit ``comm_overlap_sms`` (:data:`OVERLAP_GRID`) once for every NVIDIA GPU on the
    step-time MAPE of every training record, with the leave-one-source-out and
    leave-one-hardware-out report of ``--fit-host``."""
    return _grid_fit(path, only, cache, "comm_overlap_sms", OVERLAP_GRID, EXPERT_GPU_TYPES,
                     HOST_TIE)


#: The scale-out tier's all-to-all efficiency, 0.90 (the tier's ring efficiency on every
#: NVIDIA pack with training records: no change) down to 0.40 in steps of 0.05.
A2A_GRID = tuple(round(0.90 - 0.05 * k, 2) for k in range(11))


def fit_a2a(path: Path, only: str | None, cache: Path | None) -> dict[str, Any]:
    """Fit the outermost (network) tier's ``all_to_all_efficiency`` (:data:`A2A_GRID`) once
    for every NVIDIA GPU on the step-time MAPE of the training records it moves (those
    whose NCCL all-to-all — Megatron-Core's ``alltoall`` token dispatcher, Ulysses — crosses
    the network; DeepEP's and HybridEP's keep the tier's efficiency), with the
    leave-one-source-out and leave-one-hardware-out report of ``--fit-host``."""
    return _grid_fit(path, only, cache, "interconnect.all_to_all_efficiency", A2A_GRID,
                     EXPERT_GPU_TYPES, HOST_TIE, moved_only=True, off=A2A_GRID[0])


def _with_value(hw, field: str, value):
    """``hw`` with one efficiency field, or (``interconnect.NAME``) one field of its
    outermost, unbounded tier, set to ``value``."""
    from attrs import evolve as _evolve

    if field.startswith("interconnect."):
        name = field.split(".", 1)[1]
        tiers = tuple(_evolve(t, **{name: value}) if t.devices is None else t
                      for t in hw.interconnect)
        return _evolve(hw, interconnect=tiers)
    if isinstance(getattr(hw.efficiency, field), int):
        value = int(value)
    return _evolve(hw, efficiency=_evolve(hw.efficiency, **{field: value}))


def _grid_fit(path: Path, only: str | None, cache: Path | None, field: str,
              grid: tuple[float, ...], types: dict[str, tuple[str, ...]], tie: float,
              moved_only: bool = False, off: float = 0.0) -> dict[str, Any]:
    """Fit one efficiency ``field`` per hardware type (``types``) by grid search on the
    step-time MAPE of every training record of that type (``moved_only``: of those the
    field moves), of the values within ``tie`` of the best the nearest to ``off`` (the
    value without the mechanism, a grid value), and cross-validate: refit without each
    source (the record id's first token) and without each hardware, and predict the
    records left out."""
    from zrt_core.errors import ZrtError
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    type_of = {hw: kind for kind, hws in types.items() for hw in hws}
    errors: dict[str, dict[float, float]] = {}
    where: dict[str, tuple[str, str, str]] = {}
    for record in load_records(path):
        measured = record.get("measured", {}).get("step_time_s")
        if (only and only not in record["id"]) or not measured:
            continue
        try:
            case = record_case(record)
            cap = captured(case, host, cache)
            hw = host.hardware_spec(case.hardware)
            row = {}
            # the step time is monotone in either field: equal at both ends, flat between
            for v in (grid[0], grid[-1], *grid[1:-1]):
                if v not in (grid[0], grid[-1]) and row[grid[0]] == row[grid[-1]]:
                    row[v] = row[grid[0]]
                    continue
                spec = _with_value(hw, field, v)
                row[v] = (_estimate(case, cap, host, spec).step_time_s - measured) / measured
            row = {v: row[v] for v in grid}
        except ZrtError:
            continue
        errors[record["id"]] = row
        where[record["id"]] = (record["id"].split("-")[0], case.hardware,
                               type_of.get(case.hardware, "other"))
        print(f"{record['id'][:72]:72s} " + " ".join(f"{e:+6.1%}" for e in row.values()),
              flush=True)

    moves = {i for i, row in errors.items() if row[grid[0]] != row[grid[-1]]}

    def fitted(ids: list[str]) -> dict[str, float]:
        return {kind: _grid_fit_value(errors, [i for i in ids if where[i][2] == kind
                                               and (not moved_only or i in moves)], grid, tie,
                                      off)
                for kind in types}

    def mape(pairs: list[float]) -> float | None:
        return statistics.fmean(abs(e) for e in pairs) if pairs else None

    ids = list(errors)
    values = fitted(ids)
    value = {i: values.get(where[i][2], off) for i in ids}
    out: dict[str, Any] = {"fitted_us": values, "records": len(ids), "grid_us": grid,
                           "moved": len(moves)}
    out["in_sample"] = {"off": mape([errors[i][off] for i in ids]),
                        "fitted": mape([errors[i][value[i]] for i in ids])}
    for label, key in (("loso", 0), ("loho", 1)):
        held: list[float] = []
        folds = {}
        for group in sorted({where[i][key] for i in ids}):
            test = [i for i in ids if where[i][key] == group]
            v = fitted([i for i in ids if where[i][key] != group])
            errs = [errors[i][v.get(where[i][2], off)] for i in test]
            held += errs
            folds[group] = {"records": len(test), "fitted_us": v,
                            "off": mape([errors[i][off] for i in test]), "held_out": mape(errs)}
        out[label] = {"off": mape([errors[i][off] for i in ids]), "held_out": mape(held),
                      "folds": folds}
    print(f"{field} fitted: {values}")
    for label in ("in_sample", "loso", "loho"):
        r = out[label]
        after = r.get("fitted", r.get("held_out"))
        print(f"  {label:9s} step-time MAPE {r['off']:.2%} (off) -> {after:.2%}")
    for label in ("loso", "loho"):
        for group, f in out[label]["folds"].items():
            print(f"    {label} {group:22s} {f['records']:3d}  {f['off']:.2%} -> "
                  f"{f['held_out']:.2%}  (fit {f['fitted_us']})")
    return out


def run(path: Path, only: str | None, cache: Path | None, verbose: bool
        ) -> list[dict[str, Any]]:
    from zrt_core.errors import ZrtError
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    rows = []
    for record in load_records(path):
        rid = record["id"]
        if only and only not in rid:
            continue
        row: dict[str, Any] = {"id": rid, "measured": record.get("measured", {})}
        try:
            case = record_case(record)
            cap = captured(case, host, cache)
            start = time.perf_counter()
            report = _estimate(case, cap, host)
            row["estimate_s"] = time.perf_counter() - start
        except ZrtError as exc:
            row.update(status="error", message=str(exc))
            rows.append(row)
            print(f"{rid:62s} error: {exc}", flush=True)
            continue
        predicted = {"step_time_s": report.step_time_s,
                     "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu, "mfu": report.mfu}
        error = {k: (predicted[k] - v) / v for k, v in row["measured"].items()
                 if k in predicted and v}
        row.update(status="ok", predicted=predicted, error=error, report=report,
                   assumptions=case.assumptions)
        rows.append(row)
        e = error.get("step_time_s")
        mem = report.memory
        print(f"{rid:62s} {report.step_time_s:9.3f}s vs "
              f"{row['measured'].get('step_time_s', float('nan')):9.3f}s "
              f"{'' if e is None else f'{e:+7.1%}'} mfu {report.mfu:5.3f} "
              f"{'' if report.feasible else 'INFEASIBLE '}"
              f"{mem.peak_bytes / 2**30 if mem else 0:6.1f}GiB "
              f"[{row['estimate_s'] * 1e3:.0f} ms]", flush=True)
        if verbose:
            print("    " + _breakdown(report), flush=True)
    return rows


def _breakdown(report) -> str:
    exposed = ", ".join(f"{k} {v:.3g}" for k, v in report.exposed_comm_s.items())
    return (f"fwd {report.forward_s:.3g} bwd {report.backward_s:.3g} rec "
            f"{report.recompute_s:.3g} bubble {report.bubble_s:.3g} opt "
            f"{report.optimizer_s:.3g} optcomm {report.optimizer_comm_exposed_s:.3g} | "
            f"exposed {exposed} | m={report.microbatches} {report.schedule}")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [(r["id"], r["error"]["step_time_s"]) for r in rows
              if r["status"] == "ok" and "step_time_s" in r.get("error", {})]
    mape = statistics.fmean(abs(e) for _, e in errors) if errors else None
    times = [r["estimate_s"] for r in rows if "estimate_s" in r]
    return {"records": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
            "with_step_time": len(errors), "mape_step_time": mape,
            "max_abs_error": max((abs(e) for _, e in errors), default=None),
            "worst": sorted(errors, key=lambda x: -abs(x[1]))[:8],
            "estimate_ms_median": statistics.median(times) * 1e3 if times else None,
            "estimate_ms_max": max(times) * 1e3 if times else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--only", help="records whose id contains this")
    parser.add_argument("--json", type=Path, help="write records and summary here")
    parser.add_argument("--cache", type=Path, help="keep captures here between runs")
    parser.add_argument("--verbose", "-v", action="store_true")
    parser.add_argument("--fit", action="store_true",
                        help="fit each hardware's GEMM efficiency per precision instead")
    parser.add_argument("--fit-sustained", action="store_true",
                        help="fit each hardware's matmul_sustained on its training and "
                             "serving records instead")
    parser.add_argument("--fit-host", action="store_true",
                        help="fit host_launch_us per host CPU type, with leave-one-source-"
                             "out and leave-one-hardware-out errors, instead")
    parser.add_argument("--fit-overlap", action="store_true",
                        help="fit comm_overlap_sms (SMs an overlapped collective holds), "
                             "with leave-one-source-out and leave-one-hardware-out errors, "
                             "instead")
    parser.add_argument("--fit-a2a", action="store_true",
                        help="fit the network tier's all_to_all_efficiency, with leave-one-"
                             "source-out and leave-one-hardware-out errors, instead")
    parser.add_argument("--fit-expert", action="store_true",
                        help="fit expert_kernel_us (device time per per-expert GEMM of a "
                             "training MoE layer), with leave-one-source-out and leave-one-"
                             "hardware-out errors, instead")
    args = parser.parse_args(argv)
    if args.cache:
        args.cache.mkdir(parents=True, exist_ok=True)
    if (args.fit or args.fit_sustained or args.fit_host or args.fit_expert
            or args.fit_overlap or args.fit_a2a):
        fitted = (fit_host if args.fit_host else fit_expert if args.fit_expert
                  else fit_overlap if args.fit_overlap else fit_a2a if args.fit_a2a
                  else fit_sustained if args.fit_sustained else fit)(
            args.file, args.only, args.cache)
        if args.json:
            args.json.write_text(json.dumps(fitted, indent=1))
        return 0
    rows = run(args.file, args.only, args.cache, args.verbose)
    s = summary(rows)
    print()
    print(f"records {s['records']}, predicted {s['ok']}, with a measured step time "
          f"{s['with_step_time']}")
    if s["mape_step_time"] is not None:
        print(f"MAPE of step time {s['mape_step_time']:.1%}, worst |error| "
              f"{s['max_abs_error']:.1%}")
        for rid, e in s["worst"]:
            print(f"  {e:+7.1%}  {rid}")
    if s["estimate_ms_median"] is not None:
        print(f"estimate time (capture excluded): median {s['estimate_ms_median']:.0f} ms, "
              f"max {s['estimate_ms_max']:.0f} ms")
    result(f"step-time MAPE over {s['with_step_time']} training records",
           None if s["mape_step_time"] is None else 100 * s["mape_step_time"],
           100 * MAPE_TARGET, "%")
    result("training estimate per record (capture excluded), median", s["estimate_ms_median"],
           ESTIMATE_TARGET_MS, "ms")
    if args.json:
        out = {"records": [_row_json(r) for r in rows], "summary": s}
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


def _row_json(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k != "report"}
    if "report" in row:
        out["report"] = row["report"].to_json()
    return out


if __name__ == "__main__":
    sys.exit(main())
