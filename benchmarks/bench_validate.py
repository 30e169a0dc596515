"""``zrt validate`` end to end: the command cold and warm, then wall and CPU time per
front-end in one process, the summary, and how far the analytic front-end's predictions
are from the capture front-end's on every record both predict.

    python benchmarks/bench_validate.py [FILE] [--only TEXT] [--frontend capture|analytic|both]
        [--json OUT]

The command runs twice as a user runs it (a new process each), with ``ZRT_CACHE_DIR`` at
an empty temporary directory: cold (every model captured: what a first run on a new
machine costs), then warm (the captures cached). The in-process front-ends then use that
warm cache. CPU time is reported beside wall time: a shared machine inflates the wall
time, not the CPU time. Targets: cold under 60 s, warm under 20 s (99 records).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench import VALIDATION as DEFAULT_FILE
from _bench import result as report_target

COLD_TARGET_S = 60.0
WARM_TARGET_S = 20.0


def run_cli(path: Path, cache: str, only: str | None, out: Path) -> tuple[float, float, int]:
    """``zrt validate FILE --json OUT`` in a new process: wall s, CPU s, exit code."""
    import resource
    import subprocess

    zrt = Path(sys.executable).with_name("zrt")
    cmd = [str(zrt) if zrt.exists() else sys.executable,
           *([] if zrt.exists() else ["-m", "zrt_core.cli.main"]),
           "validate", str(path), "--json", str(out), "--quiet",
           *(["--only", only] if only else [])]
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = usage.ru_utime + usage.ru_stime
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, "ZRT_CACHE_DIR": cache},
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
    return wall, usage.ru_utime + usage.ru_stime - cpu0, proc.returncode


def run_frontend(path: Path, frontend: str, only: str | None) -> tuple[Any, float, float]:
    from zrt_core.validate import validate

    wall, cpu = time.perf_counter(), time.process_time()
    result = validate(path, frontend=frontend, only=only)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def agreement(a: Any, c: Any) -> dict[str, Any]:
    """Largest relative difference of any predicted quantity, per record predicted by both."""
    by_id = {r.id: r for r in c.results}
    rows = []
    for r in a.results:
        other = by_id.get(r.id)
        if not (r.ok and other is not None and other.ok):
            continue
        diffs = [abs(v - other.predicted[k]) / abs(other.predicted[k])
                 for k, v in r.predicted.items() if other.predicted.get(k)]
        rows.append((max(diffs, default=0.0), r.id))
    rows.sort(reverse=True)
    only_capture = [r.id for r in c.results if r.ok and not next(
        (x for x in a.results if x.id == r.id and x.ok), None)]
    return {"records_compared": len(rows), "max_relative_difference": rows[0][0] if rows
            else None, "largest": rows[:5], "capture_only": only_capture}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE)
    ap.add_argument("--only", help="records whose id contains this")
    ap.add_argument("--frontend", choices=("capture", "analytic", "both"), default="both")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="zrt-bench-")
    os.environ["ZRT_CACHE_DIR"] = cache
    out: dict[str, Any] = {"file": str(args.file)}
    for label, target in (("cold", COLD_TARGET_S), ("warm", WARM_TARGET_S)):
        summary_json = Path(cache) / f"validate-{label}.json"
        wall, cpu, code = run_cli(args.file, cache, args.only, summary_json)
        out[f"cli_{label}"] = {"wall_s": wall, "cpu_s": cpu, "exit": code}
        line = f"zrt validate {args.file.name} ({label}): {wall:6.1f} s wall, {cpu:6.1f} s CPU"
        if code == 0:
            s = json.loads(summary_json.read_text()).get("summary", {})
            line += (f"; MAPE step {_pct(s.get('mape_step_time'))}, throughput "
                     f"{_pct(s.get('mape_throughput'))}")
        print(line, flush=True)
        report_target(f"zrt validate public.yaml, {label} capture cache, wall",
               wall if code == 0 else None, target, "s")
    runs = {}
    for frontend in (("analytic", "capture") if args.frontend == "both" else
                     (args.frontend,)):
        result, wall, cpu = run_frontend(args.file, frontend, args.only)
        runs[frontend] = result
        s = result.summary()
        out[frontend] = {"wall_s": wall, "cpu_s": cpu, "records": s["records"], "ok": s["ok"],
                         "mape_step_time": s["mape_step_time"],
                         "mape_throughput": s["mape_throughput"], "worst": s["worst"],
                         "failed": s["failed"]}
        print(f"{frontend:>8}: {wall:6.1f} s wall, {cpu:6.1f} s CPU; {s['ok']}/{s['records']} "
              f"predicted; MAPE step {_pct(s['mape_step_time'])}, throughput "
              f"{_pct(s['mape_throughput'])}")
    if len(runs) == 2:
        agree = agreement(runs["analytic"], runs["capture"])
        out["agreement"] = agree
        print(f"analytic vs capture on {agree['records_compared']} records: largest relative "
              f"difference of any prediction {_pct(agree['max_relative_difference'])}")
        for diff, rid in agree["largest"]:
            print(f"    {diff:.2e}  {rid}")
        if agree["capture_only"]:
            print(f"only the capture front-end predicts {len(agree['capture_only'])} records "
                  "(families the analytic front-end does not build)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.2%}"


if __name__ == "__main__":
    sys.exit(main())
