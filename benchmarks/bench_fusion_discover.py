"""``zrt fusion discover`` end to end as a user runs it: a new process that imports torch
and transformers, captures the four phases of a bundled model (one layer per kind), drafts
the rule pack and writes it into a temporary folder.

    python benchmarks/bench_fusion_discover.py [--model deepseek-v3 llama3-8b ...]

Prints the wall and CPU time of each command and the rules it wrote. Target: under 10 s
wall per model (issue 14).
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", nargs="+", default=["deepseek-v3", "llama3-8b"])
    ap.add_argument("--platform", default="cuda")
    args = ap.parse_args(argv)
    zrt = Path(sys.executable).with_name("zrt")
    failed = 0
    for model in args.model:
        with tempfile.TemporaryDirectory(prefix="zrt-bench-") as out:
            pack = Path(out) / "rules.yaml"
            cmd = [str(zrt) if zrt.exists() else sys.executable,
                   *([] if zrt.exists() else ["-m", "zrt_core.cli.main"]),
                   "fusion", "discover", model, "--platform", args.platform, "-o", str(pack)]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            rules = pack.read_text().count("\n  - name: ") if pack.is_file() else 0
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        print(proc.stdout[-400:])
        if proc.returncode != 0:
            print(proc.stderr[-2000:])
            failed += 1
        print(f"zrt {' '.join(cmd[1:])}: exit {proc.returncode}, {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU, {rules} active rules written")
        result(f"zrt fusion discover {model} (four phases captured, pack written), wall",
               wall if proc.returncode == 0 else None, TARGET_S, "s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
