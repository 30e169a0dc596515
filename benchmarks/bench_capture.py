"""Capture speed and memory: full-depth DeepSeek-V3 (61 layers) and Llama-3-8B, all four
phases at batch 1 × sequence 4096.

Run: ``python benchmarks/bench_capture.py [model ...]``. Prints, per model, the import time
of torch + transformers + zrt_core (once, first), the time of the first capture in the
process (which imports the family's modeling module), the time of a second capture
(steady state), each phase, and the process's peak RSS. Targets: DeepSeek-V3 under 2 s
after import, peak RSS under 1 GiB.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

TARGET_S = 2.0
TARGET_RSS_GIB = 1.0


def _peak_rss_gib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / (1024 * 1024) if sys.platform != "darwin" else kib / 1024**3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["deepseek-v3", "llama3-8b"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import zrt_core
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    print(f"import torch+transformers+zrt_core, plugin host: "
          f"{time.perf_counter() - start:.2f} s")
    failed = False
    for name in args.models:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            result = zrt_core.capture(name, batch=args.batch, seq_len=args.seq_len, host=host)
            times.append(time.perf_counter() - t0)
        phases = ", ".join(f"{k} {v:.2f}" for k, v in result.timings_s.items())
        ops = sum(len(g.nodes) for g in result.graphs.values())
        total_ops = sum(g.totals().ops for g in result.graphs.values())
        kinds = ", ".join(f"{t.kind}×{t.count}" for t in result.templates)
        print(f"{name}: first capture {times[0]:.2f} s, second {times[1]:.2f} s "
              f"({phases}); {ops} captured nodes standing for {total_ops} ops; "
              f"layers {kinds}; peak RSS {_peak_rss_gib():.2f} GiB")
        for phase, check in result.flops_checks.items():
            gap = f"{check.gap:+.1%}" if check.gap is not None else "n/a"
            print(f"  {phase:15s} FLOPs {check.captured:.4e} analytic {check.analytic:.4e} "
                  f"gap {gap}")
        if name == "deepseek-v3" and times[0] > TARGET_S:
            print(f"  over target: {times[0]:.2f} s > {TARGET_S} s")
            failed = True
    if _peak_rss_gib() > TARGET_RSS_GIB:
        print(f"peak RSS over target: {_peak_rss_gib():.2f} GiB > {TARGET_RSS_GIB} GiB")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
