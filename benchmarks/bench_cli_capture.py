"""``zrt capture`` end to end as a user runs it: a new process that imports torch and
transformers, captures all four phases of DeepSeek-V3 (61 layers, two layer kinds) and
writes the raw and fused graphs, op tables, workbooks and DOT files into a temporary
``--out`` folder.

    python benchmarks/bench_cli_capture.py [--model deepseek-v3] [--seq-len 4096]

Prints the wall and CPU time of the command and its peak RSS. Targets: under 10 s wall,
peak RSS under 1 GiB.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import result

TARGET_S = 10.0
TARGET_RSS_GIB = 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--seq-len", type=int, default=4096)
    args = ap.parse_args(argv)
    zrt = Path(sys.executable).with_name("zrt")
    with tempfile.TemporaryDirectory(prefix="zrt-bench-") as out:
        cmd = [str(zrt) if zrt.exists() else sys.executable,
               *([] if zrt.exists() else ["-m", "zrt_core.cli.main"]),
               "capture", args.model, "--seq-len", str(args.seq_len), "--out", out]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        written = sorted(p.name for p in Path(out).iterdir())
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    rss_gib = after.ru_maxrss / (1024 * 1024)  # KiB on Linux: the largest child's peak
    print(proc.stdout[-1500:])
    if proc.returncode != 0:
        print(proc.stderr[-2000:])
    print(f"zrt {' '.join(cmd[1:])}: exit {proc.returncode}, {wall:.2f} s wall, "
          f"{cpu:.2f} s CPU, peak RSS {rss_gib:.2f} GiB; wrote {', '.join(written)}")
    ok = proc.returncode == 0
    result(f"zrt capture {args.model} (four phases, files written), wall",
           wall if ok else None, TARGET_S, "s")
    result(f"zrt capture {args.model}, peak RSS", rss_gib if ok else None, TARGET_RSS_GIB,
           "GiB")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
