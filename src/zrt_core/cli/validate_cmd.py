"""``zrt validate [FILE | --suite public] [--json PATH] [--explain ID]``: predict every record
of a validation file (the format of ../shared/validation/SCHEMA.md) and print the errors
against the measurements.

A table row per record (predicted, measured and error of its primary quantity), then a
summary: records, predicted, failed (each with its reason), the MAPE of step time and of
throughput, the worst records, and the MAPE and bias grouped by source, model family and
hardware. ``--json PATH`` writes every record and the summary in SCHEMA.md's shape. Without
a file (or with ``--suite public``) the published runs shipped inside zrt are validated.
``--explain ID`` predicts one record and prints its breakdown beside what its source
published. Exit status 0 whenever the file could be read, even when records failed; 2 when
the file is unusable or ``--explain`` names no record.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from zrt_core.cli._output import console, table
from zrt_core.validate import SUITES


def register(sub) -> None:
    p = sub.add_parser("validate", help="predict published measurements and print the error",
                       description="Predict every record of a validation file (the format of "
                       "shared/validation/SCHEMA.md: published, measured training and serving "
                       "runs) and print each error against the measurement, the MAPE of step "
                       "time and throughput, and the worst records. A record that cannot be "
                       "predicted is reported with its reason; the run goes on.")
    p.add_argument("file", metavar="FILE", nargs="?",
                   help="validation YAML (SCHEMA.md's format); default: --suite public")
    p.add_argument("--suite", choices=sorted(SUITES),
                   help="a validation file shipped with zrt: public = the published, "
                   "measured runs (../shared/validation/public.yaml)")
    p.add_argument("--explain", metavar="ID",
                   help="predict one record and print its breakdown beside what the source "
                   "published, with the defaults taken for what it left out")
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


def _path(args) -> Path:
    from zrt_core.errors import SpecError
    from zrt_core.validate import suite_path

    if args.file and args.suite:
        raise SpecError(f"both a file ({args.file}) and --suite {args.suite} were given",
                        "pass one of them")
    return Path(args.file) if args.file else suite_path(args.suite or "public")


def run(args) -> int:
    from zrt_core.validate import validate

    path = _path(args)
    if args.explain:
        return _explain(args, path)
    progress = None
    if not args.quiet:
        def progress(i: int, n: int, r: Any) -> None:
            state = "ok" if r.ok else "error"
            sys.stderr.write(f"[{i + 1}/{n}] {r.id} {state} ({r.elapsed_s:.2f} s)\n")
            sys.stderr.flush()

    run_ = validate(path, frontend=args.frontend, only=args.only, on_result=progress,
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
    for name in ("source", "family", "hardware"):
        out.print(_group_table(name, s[f"by_{name}"]))
    from zrt_core.validate_groups import BIAS_LINE

    biased = {g: {w: v for w, v in ws.items()
                  if v["bias"] is not None and abs(v["bias"]) > BIAS_LINE}
              for g, ws in s.get("by_family_hardware", {}).items()}
    biased = {g: ws for g, ws in biased.items() if ws}
    if biased:
        out.print(_group_table("family_hardware", biased))
    if s["worst"]:
        out.print("worst: " + ", ".join(f"{w['id']} {w['error']:+.1%}" for w in s["worst"]))
    for f in s["failed"]:
        out.print(f"failed: {f['id']}: {f['message']}")


def _group_table(name: str, groups: dict[str, Any]):
    title = {"source": "by source (the id's first token)", "family": "by model family "
             "(model_type)", "hardware": "by hardware",
             "family_hardware": "family × hardware groups biased past ±15%"}[name]
    rows = []
    for group, workloads in groups.items():
        for workload, g in workloads.items():
            rows.append((group, workload, g["records"], g["ok"], g["scored"],
                         _pct(g["mape"]), "—" if g["bias"] is None else f"{g['bias']:+.1%}"))
    return table(f"{title}: step time (train), output tokens/s (infer)",
                 (name.replace("_", " × "), "workload", "records", "predicted", "scored",
                  "MAPE", "bias"), rows,
                 justify=("left", "left", "right", "right", "right", "right", "right"))


def _explain(args, path: Path) -> int:
    from zrt_core.validate import Validator, load_records
    from zrt_core.validate_report import explain, find_record

    record = find_record(load_records(path), args.explain, str(path))
    validator = Validator(frontend=args.frontend,
                          use_cache=False if args.no_cache else None)
    data = explain(validator, record)
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)
    for part in explain_renderables(data):
        out.print(part)
    if args.json_path:
        _write_json(Path(args.json_path), data)
        out.print(f"wrote {args.json_path}")
    return 0


def _write_json(path: Path, data: Any) -> None:
    import json

    from zrt_core.errors import SpecError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot write the JSON ({exc.strerror})",
                        "pass a writable path to --json") from None


def _val(key: str, value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if abs(value) < 1e-12:
        return "0"
    if key.endswith("_s") and "_per_s" not in key:
        return f"{value:.4g} s" if value >= 1 else f"{value * 1e3:.4g} ms"
    if key.endswith("_ms"):
        return f"{value:.4g} ms"
    if key.endswith(("_gib", "_gib_per_device")):
        return f"{value:.2f} GiB"
    if key.endswith(("_gb", "_gb_per_device")):
        return f"{value:.2f} GB"
    if key in ("mfu", "hfu"):
        return f"{value:.3f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4g}"


def explain_renderables(d: dict[str, Any]) -> list[Any]:
    """What ``--explain`` prints: the record, predicted beside published, the breakdown
    and the assumptions."""
    layout = ", ".join(f"{k} {v}" for k, v in d["layout"].items() if v not in (None, False))
    from rich.text import Text

    parts: list[Any] = [
        # styled text, not markup: the console prints brackets literally (ids, configs)
        Text.assemble((d["id"], "bold"), f": {d['model']} ({d['model_type']}) on "
                      f"{d['num_gpus']} × {d['hardware']}, {d['workload']}, precision "
                      f"{d['precision'] or '— (bf16 taken)'}"),
        f"source: {d['source']}",
        "layout published: " + (", ".join(f"{k} {v}" for k, v in d["published_layout"].items()
                                          if v is not None) or "none"),
        f"layout predicted: {layout}",
    ]
    keys = list(dict.fromkeys([*d["published"], *d["predicted"]]))
    rows = [(k, _val(k, d["published"].get(k)), _val(k, d["predicted"].get(k)),
             f"{d['error'][k]:+.1%}" if k in d["error"] else "")
            for k in keys]
    parts.append(table("published and predicted", ("quantity", "published", "predicted",
                                                    "error"), rows,
                       justify=("left", "right", "right", "right")))
    if "step" in d:
        step = d["step"]
        total = step["step_time_s"] or 1.0
        parts.append("step = pipeline + optimizer + optimizer_comm_exposed; pipeline = "
                     "compute + pipeline_exposed_comm + bubble; compute = forward + backward "
                     "+ recompute")
        parts.append(table(
            "step time", ("part", "time", "of step"),
            [(k.removesuffix("_s"), _val(k, v), f"{v / total:.1%}") for k, v in step.items()],
            justify=("left", "right", "right")))
        parts.append(table("compute by op category", ("category", "time", "of compute"),
                           [(k, _val("x_s", v), f"{v / (step['compute_s'] or 1):.1%}")
                            for k, v in d["compute_by_category_s"].items()],
                           justify=("left", "right", "right")))
        comm = d["exposed_comm_s"]
        groups = sorted(set(comm["pipeline"]) | set(comm["step"]) | set(comm["hidden"]))
        parts.append(table("communication by group (exposed: the rank computes nothing)",
                           ("group", "exposed in pipeline", "exposed in step", "hidden"),
                           [(g, _val("x_s", comm["pipeline"].get(g)),
                             _val("x_s", comm["step"].get(g)),
                             _val("x_s", comm["hidden"].get(g))) for g in groups],
                           justify=("left", "right", "right", "right")))
    else:
        for name, phase in d["phases"].items():
            if phase:
                parts.append(f"{name}: batch {phase['batch']}, {phase['tokens']} tokens, "
                             f"{phase['time_ms']:.4g} ms per step")
                parts.append(table(
                    f"{name} by op category", ("category", "time"),
                    [(k, f"{v:.4g} ms") for k, v in phase["by_category_ms"].items()],
                    justify=("left", "right")))
    mem = d.get("memory")
    if mem:
        parts.append(table("memory per device", ("part", "size"),
                           [(k, _val(k, v)) for k, v in mem.items()
                            if isinstance(v, int | float) and not isinstance(v, bool)
                            and (k.endswith(("_gib", "_gb")))],
                           justify=("left", "right")))
    parts.append("assumptions (fields the source left out): "
                 + ("; ".join(d["assumptions"]) or "none"))
    for note in d["estimate_notes"]:
        parts.append(f"note: {note}")
    return parts
