"""Capture speed and memory: full-depth DeepSeek-V3 (61 layers) and Llama-3-8B, all four
phases at batch 1 × sequence 4096.

Run: ``python benchmarks/bench_capture.py [model ...]``. Prints the import time of torch +
transformers + zrt_core and the plugin host, then of transformers' modeling stack and the
models' modeling modules (``AutoModelForCausalLM`` pulls in torch._dynamo: about 2 s that
any use of transformers pays), then per model: the first capture in the process and the
best of ``--repeat`` warm captures, in wall and CPU seconds (CPU time is what other work on
a shared machine does not inflate), each phase, and the process's peak RSS; then
DeepSeek-V3 at full depth (every one of its 61 layers recorded, no templates), all four
phases. Targets: DeepSeek-V3's first capture after import under 2 s CPU, a warm Llama-3-8B
capture under 2 s CPU, the full-depth capture under 30 s CPU, peak RSS under 1 GiB.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import resource
import sys
import time

from _bench import result as report

TARGET_S = 2.0
FULL_DEPTH_TARGET_S = 30.0
TARGET_RSS_GIB = 1.0


def _peak_rss_gib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / (1024 * 1024) if sys.platform != "darwin" else kib / 1024**3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["deepseek-v3", "llama3-8b"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="warm captures per model")
    parser.add_argument("--full-depth", default="deepseek-v3",
                        help="model captured at full depth at the end ('' to skip)")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import zrt_core
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    print(f"import torch+transformers+zrt_core, plugin host: "
          f"{time.perf_counter() - start:.2f} s")
    start = time.perf_counter()
    from transformers import AutoModelForCausalLM  # noqa: F401  (pulls in torch._dynamo)

    for name in args.models:
        model_type = host.models.get(name).model_type if name in host.models else ""
        module = f"transformers.models.{model_type}.modeling_{model_type}"
        if model_type and importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    print(f"import transformers' modeling stack and the models' modeling modules: "
          f"{time.perf_counter() - start:.2f} s")
    for name in args.models:
        times = []  # (wall s, CPU s of this process): CPU time is what load on a shared
        for _ in range(1 + args.repeat):  # machine does not inflate
            t0, c0 = time.perf_counter(), time.process_time()
            result = zrt_core.capture(name, batch=args.batch, seq_len=args.seq_len, host=host)
            times.append((time.perf_counter() - t0, time.process_time() - c0))
        first = times[0]
        warm_wall = min(t[0] for t in times[1:])
        warm_cpu = min(t[1] for t in times[1:])
        phases = ", ".join(f"{k} {v:.2f}" for k, v in result.timings_s.items())
        ops = sum(len(g.nodes) for g in result.graphs.values())
        total_ops = sum(g.totals().ops for g in result.graphs.values())
        kinds = ", ".join(f"{t.kind}×{t.count}" for t in result.templates)
        print(f"{name}: first capture in the process {first[0]:.2f} s wall / {first[1]:.2f} s "
              f"CPU; warm {warm_wall:.2f} s wall / "
              f"{warm_cpu:.2f} s CPU (best of {args.repeat}; last run: {phases}); "
              f"{ops} captured nodes standing for {total_ops} ops; layers {kinds}; "
              f"peak RSS {_peak_rss_gib():.2f} GiB")
        for phase, check in result.flops_checks.items():
            gap = f"{check.gap:+.1%}" if check.gap is not None else "n/a"
            print(f"  {phase:15s} FLOPs {check.captured:.4e} analytic {check.analytic:.4e} "
                  f"gap {gap}")
        if name == "deepseek-v3":
            report(f"{name} ({len(result_layers(result))} layers, {len(result.graphs)} "
                   "phases) first capture after import, CPU", first[1], TARGET_S, "s")
        else:
            report(f"{name} warm capture ({len(result.graphs)} phases), CPU", warm_cpu,
                   TARGET_S, "s")
    if args.full_depth:
        c0, t0 = time.process_time(), time.perf_counter()
        full = zrt_core.capture(args.full_depth, batch=args.batch, seq_len=args.seq_len,
                                host=host, full_depth=True)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        ops = sum(len(g.nodes) for g in full.graphs.values())
        print(f"{args.full_depth} full depth: {wall:.2f} s wall / {cpu:.2f} s CPU, "
              f"{ops} captured nodes; phases "
              + ", ".join(f"{k} {v:.2f}" for k, v in full.timings_s.items()))
        report(f"{args.full_depth} full depth ({len(result_layers(full))} layers, "
               f"{len(full.graphs)} phases), CPU", cpu, FULL_DEPTH_TARGET_S, "s")
    report("peak RSS of the process", _peak_rss_gib(), TARGET_RSS_GIB, "GiB")
    return 0


def result_layers(captured) -> list[int]:  # type: ignore[no-untyped-def]
    """Every layer index the capture stands for (templates carry their counts)."""
    return [i for t in captured.templates for i in t.indices]


if __name__ == "__main__":
    raise SystemExit(main())
