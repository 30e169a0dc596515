"""Run every benchmark script in this folder and summarise their targets.

    python benchmarks/run_all.py [--shared DIR] [--only NAME ...] [--strict]

Each ``bench_*.py`` (but those in :data:`NOT_BY_DEFAULT`, which ``--only`` names) runs in
its own process with ``ZRT_CACHE_DIR`` pointing at a fresh temporary directory (captures
are cold at the start of each script; a script that measures a warm run warms it itself),
so nothing is written into the repository or the user's cache. Their output streams through; at the end a summary lists every ``RESULT`` line
(target, measurement, PASS/MISS) and each script's wall time. Exit 1 when a script fails
(and, with ``--strict``, when a target is missed). ``nox -s benchmarks`` runs this.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULT = re.compile(r"^RESULT (?P<script>\S+): (?P<what>.+?) = (?P<value>\S+) (?P<rest>.*) "
                    r"(?P<verdict>PASS|MISS)$")
#: Scripts that take the validation file as their first argument.
TAKES_FILE = {"bench_validate", "bench_train_validation", "bench_infer_validation",
              "bench_crossval", "bench_search_quality"}
#: Scripts left out of a run unless ``--only`` names them: the cross-validated calibration
#: (every record at every searched parameter value, after a cold capture of all of them)
#: takes longer than the rest of the session together (docs/benchmarks.md); so does the
#: search-quality check (a layout search per Megatron-Bridge record, docs/search.md).
NOT_BY_DEFAULT = {"bench_crossval", "bench_search_quality"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, help="the shared folder (default ../shared)")
    ap.add_argument("--only", nargs="*", help="script names (without .py) to run")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    scripts = sorted(HERE.glob("bench_*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem in args.only]
    else:
        scripts = [s for s in scripts if s.stem not in NOT_BY_DEFAULT]
    env = dict(os.environ)
    if args.shared:
        env["ZRT_SHARED"] = str(args.shared.resolve())
    sys.path.insert(0, str(HERE))
    os.environ.update({k: v for k, v in env.items() if k == "ZRT_SHARED"})
    from _bench import VALIDATION

    results: list[re.Match[str]] = []
    timings: list[tuple[str, float, int]] = []
    for script in scripts:
        cmd = [sys.executable, str(script)]
        if script.stem in TAKES_FILE:
            cmd.append(str(VALIDATION))
        print(f"\n=== {script.name} {'=' * max(0, 70 - len(script.name))}", flush=True)
        with tempfile.TemporaryDirectory(prefix="zrt-bench-") as cache:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, env={**env, "ZRT_CACHE_DIR": cache}, cwd=cache,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                m = RESULT.match(line.rstrip("\n"))
                if m:
                    results.append(m)
            code = proc.wait()
            timings.append((script.name, time.perf_counter() - t0, code))

    print(f"\n=== summary {'=' * 62}")
    width = max((len(m["script"]) + len(m["what"]) for m in results), default=20) + 3
    for m in results:
        print(f"{m['verdict']:4s}  {m['script'] + ': ' + m['what']:<{width}} {m['value']:>10} "
              f"{m['rest']}")
    passed = sum(m["verdict"] == "PASS" for m in results)
    missed = len(results) - passed
    print()
    for name, wall, code in timings:
        print(f"{name:34s} {wall:7.1f} s wall  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    failed = [name for name, _, code in timings if code != 0]
    print(f"\n{passed} passed, {missed} missed targets; {len(timings) - len(failed)} of "
          f"{len(timings)} scripts ran")
    return 1 if failed or (args.strict and missed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
