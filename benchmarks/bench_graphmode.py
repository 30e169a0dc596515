"""Graph mode (torch.compile capture) against eager capture: time on DeepSeek-V3, and the
FLOPs/bytes of both modes on one bundled model per family.

Run: ``python benchmarks/bench_graphmode.py [--families] [--seq-len N] [--json FILE]``.
Speed: DeepSeek-V3 (layer templates), all four phases at batch 1 × ``--seq-len``, with a
fresh, empty ``ZRT_CACHE_DIR`` (a temporary folder); each mode is captured once to warm
imports and Dynamo, then timed ``--repeat`` times (wall and CPU seconds, the least CPU
counts). Graph mode's time is then split by stage (Dynamo's own ``compile_times``: bytecode
tracing, AOTAutograd, guards) and by phase. Target: graph mode within 3x of eager.
``--families`` then captures one bundled model per family
(``FAMILIES``) in both modes and prints, per phase, eager and graph FLOPs and bytes and the
relative difference, or the one-line reason graph mode failed (docs/graph-mode.md).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from _bench import result as report

TARGET_RATIO = 3.0

#: one bundled model per model_type (`zrt models`), the smallest of each
FAMILIES = ("gpt2", "bloom-7b1", "opt-6.7b", "llama3.2-1b", "mistral-7b-v0.3", "qwen2.5-7b",
            "qwen3-8b", "phi3-mini", "gemma2-9b", "gemma3-12b", "nemotron3-8b",
            "nemotron-h-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-20b", "grok-1",
            "llama4-scout", "deepseek-v2-lite", "deepseek-v3", "deepseek-v3.2",
            "deepseek-v4-flash")


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _totals(result) -> dict[str, list[int]]:
    out = {}
    for phase, g in result.graphs.items():
        t = g.totals()
        out[phase] = [int(t.flops), int(t.bytes), int(t.ops)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="deepseek-v3")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--families", action="store_true")
    parser.add_argument("--only", nargs="*", help="family models to compare (default: all)")
    parser.add_argument("--json", help="write the family comparison here")
    parser.add_argument("--repeat", type=int, default=2, help="timed captures per mode")
    args = parser.parse_args(argv)
    # a cold capture cache: nothing captured before by this or another checkout is reused
    os.environ["ZRT_CACHE_DIR"] = tempfile.mkdtemp(prefix="zrt-bench-graphmode-")

    import zrt_core
    from zrt_core.errors import ZrtError

    def run(model: str, graph: bool, seq: int):
        return zrt_core.capture(model, batch=1, seq_len=seq, graph_mode=graph)

    ok = True
    if args.model:
        times = {}
        for graph in (False, True):
            run(args.model, graph, args.seq_len)  # warm: imports, Dynamo, modeling modules
            runs = [_timed(lambda g=graph: run(args.model, g, args.seq_len))
                    for _ in range(max(1, args.repeat))]
            res, wall, cpu = min(runs, key=lambda r: r[2])
            times[graph] = (wall, cpu)
            phases = ", ".join(f"{k} {v:.2f}" for k, v in res.timings_s.items())
            print(f"{args.model} {'graph' if graph else 'eager'} capture: {wall:.2f} s wall, "
                  f"{cpu:.2f} s CPU (least of {len(runs)}; wall s by phase: {phases})",
                  flush=True)
        _print_stages(lambda: run(args.model, True, args.seq_len))
        ratio = times[True][1] / times[False][1]
        ok = report(f"{args.model} graph/eager capture CPU time", ratio, TARGET_RATIO, "x")

    if args.families:
        rows = {}
        for model in args.only or FAMILIES:
            row: dict = {}
            for graph in (False, True):
                try:
                    res, wall, _ = _timed(lambda m=model, g=graph: run(m, g, args.seq_len))
                except ZrtError as exc:
                    row["graph" if graph else "eager"] = {"error": str(exc)}
                    continue
                row["graph" if graph else "eager"] = {"totals": _totals(res), "wall_s": wall}
            rows[model] = row
            _print_row(model, row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    return 0 if ok else 1


def _print_stages(capture) -> None:
    """One more graph-mode capture, split by Dynamo's stage timers (wall seconds, summed
    over the three compiles: prefill, decode, training forward+backward)."""
    import torch
    from torch._dynamo import utils

    seen: dict[str, float] = {}
    reset = torch._dynamo.reset

    def keep_then_reset() -> None:  # graph mode resets Dynamo (and its timers) when done
        for name, values in utils.compilation_time_metrics.items():
            seen[name] = seen.get(name, 0.0) + sum(values)
        reset()

    utils.compilation_time_metrics.clear()
    torch._dynamo.reset = keep_then_reset
    try:
        _, wall, cpu = _timed(capture)
    finally:
        torch._dynamo.reset = reset
    print(f"graph-mode stages ({wall:.2f} s wall, {cpu:.2f} s CPU in all):", flush=True)
    for name in ("_compile.compile_inner", "bytecode_tracing", "get_fake_value",
                 "variable_builder_call", "OutputGraph.call_user_compiler",
                 "create_aot_dispatcher_function", "aot_collect_metadata",
                 "aot_trace_joint_graph", "build_guards"):
        if name in seen:
            print(f"  {name:34} {seen[name]:6.2f} s", flush=True)


def _print_row(model: str, row: dict) -> None:
    eager, graph = row.get("eager", {}), row.get("graph", {})
    if "error" in eager or "error" in graph:
        print(f"{model}: eager {eager.get('error', 'ok')} | graph {graph.get('error', 'ok')}",
              flush=True)
        return
    for phase, (ef, eb, eo) in eager["totals"].items():
        gf, gb, go = graph["totals"].get(phase, (0, 0, 0))
        df = (gf - ef) / ef if ef else 0.0
        db = (gb - eb) / eb if eb else 0.0
        print(f"{model:18} {phase:15} flops {ef:.4g} / {gf:.4g} ({df:+.3%})  bytes "
              f"{eb:.4g} / {gb:.4g} ({db:+.3%})  ops {eo}/{go}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
