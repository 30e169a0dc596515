"""``zrt validate FILE [--json PATH]``: predict every record of a validation file (the format
of ../shared/validation/SCHEMA.md) and print the errors against the measurements.

A table row per record (predicted, measured and error of its primary quantity), then a
summary: records, predicted, failed (each with its reason), the MAPE of step time and of
throughput, and the worst records. ``--json PATH`` writes every record and the summary in
SCHEMA.md's shape. Exit status 0 whenever the file could be read, even when records
failed; 2 when the file is unusable.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from zrt_core.cli._output import console, table


def register(sub) -> None:
    p = sub.add_parser("validate", help="predict published measurements and print the error",
                       description="Predict every record of a validation file (the format of "
                       "shared/validation/SCHEMA.md: published, measured training and serving "
                       "runs) and print each error against the measurement, the MAPE of step "
                       "time and throughput, and the worst records. A record that cannot be "
                       "predicted is reported with its reason; the run goes on.")
    p.add_argument("file", metavar="FILE",
                   help="validation YAML (../shared/validation/public.yaml, ...)")
    p.add_argument("--json", metavar="PATH", dest="json_path",
                   help="write records and summary as JSON (SCHEMA.md's shape)")
    p.add_argument("--frontend", choices=("capture", "analytic"), default="capture",
                   help="capture the HF model (default) or build the graphs from the "
                   "model numbers (no torch)")
    p.add_argument("--only", metavar="TEXT", help="records whose id contains TEXT")
    p.add_argument("--no-cache", action="store_true",
                   help="capture again instead of reading the capture cache")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress lines on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    from zrt_core.validate import validate

    progress = None
    if not args.quiet:
        def progress(i: int, n: int, r: Any) -> None:
            state = "ok" if r.ok else "error"
            sys.stderr.write(f"[{i + 1}/{n}] {r.id} {state} ({r.elapsed_s:.2f} s)\n")
            sys.stderr.flush()

    run_ = validate(args.file, frontend=args.frontend, only=args.only, on_result=progress,
                    use_cache=False if args.no_cache else None)
    summary = run_.summary()
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)  # a log file keeps whole record ids
    out.print(_records_table(run_))
    _print_summary(out, summary)
    if args.json_path:
        import json

        path = Path(args.json_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(run_.to_json(), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            from zrt_core.errors import SpecError

            raise SpecError(f"{path}: cannot write the JSON ({exc.strerror})",
                            "pass a writable path to --json") from None
        out.print(f"wrote {path}")
    return 0


def _fmt(value: float | None, quantity: str | None) -> str:
    if value is None:
        return "—"
    if quantity == "step_time_s":
        return f"{value:.4g} s"
    if quantity and (quantity.endswith("_ms") or "_ms_" in quantity):
        return f"{value:.4g} ms"
    if quantity == "mfu":
        return f"{value:.3f}"
    return f"{value:,.0f}"


def _short(quantity: str | None) -> str:
    return {"step_time_s": "step", "tokens_per_s_per_gpu": "tok/s/GPU", "mfu": "MFU",
            "output_tokens_per_s": "out tok/s", "output_tokens_per_s_per_gpu":
            "out tok/s/GPU", "ttft_ms": "TTFT", "tpot_ms": "TPOT",
            "fwd_plus_bwd_ms_per_layer": "fwd+bwd/layer", "fwd_ms_per_layer": "fwd/layer",
            "bwd_ms_per_layer": "bwd/layer"}.get(quantity or "", quantity or "")


def _records_table(run_: Any):
    rows = []
    for r in run_.results:
        if not r.ok:
            rows.append((r.id, r.workload, r.hardware, r.num_gpus, "", "", "",
                         f"error: {r.message}"))
            continue
        q = r.primary
        if q is None:  # measured nothing zrt predicts
            rows.append((r.id, r.workload, r.hardware, r.num_gpus, "", "", "", "—"))
            continue
        rows.append((r.id, r.workload, r.hardware, r.num_gpus, _short(q),
                     _fmt(r.predicted.get(q), q), _fmt(r.measured.get(q), q),
                     f"{r.error[q]:+.1%}"))
    return table(f"zrt validate: {run_.path} ({run_.frontend} front-end)",
                 ("id", "workload", "hardware", "GPUs", "quantity", "predicted", "measured",
                  "error"), rows,
                 justify=("left", "left", "left", "right", "left", "right", "right", "right"))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _print_summary(out: Any, s: dict[str, Any]) -> None:
    out.print(f"records {s['records']}, predicted {s['ok']}, failed {s['errors']} "
              f"in {s['elapsed_s']:.1f} s")
    out.print(f"MAPE step time {_pct(s['mape_step_time'])} "
              f"({s['mape_by_quantity'].get('step_time_s', {}).get('records', 0)} records), "
              f"MAPE throughput {_pct(s['mape_throughput'])}")
    for q, v in s["mape_by_quantity"].items():
        note = " (as each source defined it; informational)" if q == "mfu" else ""
        out.print(f"  {_short(q):>14}: MAPE {_pct(v['mape'])}, bias {v['bias']:+.1%} over "
                  f"{v['records']}{note}")
    if s["worst"]:
        out.print("worst: " + ", ".join(f"{w['id']} {w['error']:+.1%}" for w in s["worst"]))
    for f in s["failed"]:
        out.print(f"failed: {f['id']}: {f['message']}")
