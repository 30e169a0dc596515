"""Scheduling speed: one layer region of a few thousand nodes, a whole 61-layer phase built
from it, and every pipeline schedule at 64 stages × ~1000 micro-batches.

Run: ``python benchmarks/bench_schedule.py [--repeat N] [--nodes N] [--pp N] [--m N]``.
Prints, per case, the best of ``--repeat`` runs in wall and CPU milliseconds (CPU time is
what other work on a shared machine does not inflate), how many pipeline operations the
event loop ran (the rest follow from the periodic steady state) and the target. Targets:
a few-thousand-node layer in milliseconds, a 64 × 1000 pipeline well under 100 ms.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from _bench import result

LAYER_TARGET_MS = 10.0
PIPELINE_TARGET_MS = 100.0


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    wall = cpu = float("inf")
    out = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall * 1e3, cpu * 1e3, out


def layer_graph(nodes: int, layers: int):  # type: ignore[no-untyped-def]
    """A layer template of ``nodes`` ops: GEMM chains with a TP all-reduce every 50 ops, a
    deferred DP reduce-scatter every 200 and random short skips (residuals), priced at
    10 µs per op; standing for ``layers`` layers."""
    from zrt_core.cost.backend import NodeCost
    from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode

    rng = random.Random(0)
    ns, edges = [], []
    for i in range(nodes):
        if i % 50 == 25:
            ns.append(OpNode(id=i, op="comm.all_reduce", category="collective",
                             phase="train_backward", layer_index=0,
                             attrs={"group": "tp", "collective": "all_reduce", "bytes": 1 << 20}))
        elif i % 200 == 199:
            ns.append(OpNode(id=i, op="comm.reduce_scatter", category="collective",
                             phase="train_backward", layer_index=0,
                             attrs={"group": "dp", "collective": "reduce_scatter",
                                    "bytes": 1 << 22}))
        else:
            ns.append(OpNode(id=i, op="aten.mm", category="matmul", phase="train_backward",
                             layer_index=0, flops=1 << 30, bytes_read=1 << 20))
        if i:
            edges.append((i - 1, i))
            if i > 5 and rng.random() < 0.5:
                edges.append((i - rng.randint(2, 5), i))
    graph = OpGraph(phase="train_backward", nodes=ns, edges=edges,
                    templates=[LayerTemplate("dense", 0, tuple(range(layers)))])
    costs = {i: NodeCost(1e-5, "bench", "fixed", "roofline") for i in range(nodes)}
    return graph, costs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3000, help="ops in the layer template")
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--pp", type=int, default=64)
    parser.add_argument("--m", type=int, default=1000, help="micro-batches")
    args = parser.parse_args(argv)

    w0 = time.perf_counter()
    from zrt_core.reports.trace import pipeline_trace, timeline_trace
    from zrt_core.schedule import StageTimes, schedule_phase, schedule_region, simulate
    print(f"import zrt_core.schedule: {(time.perf_counter() - w0) * 1e3:.0f} ms")

    graph, costs = layer_graph(args.nodes, args.layers)
    print(f"\n{'case':44s} {'wall ms':>8s} {'cpu ms':>8s}  target")
    wall, cpu, _ = _best(lambda: schedule_region(graph, costs), args.repeat)
    print(f"{'layer region, ' + str(args.nodes) + ' nodes':44s} {wall:8.1f} {cpu:8.1f}  "
          f"< {LAYER_TARGET_MS:.0f} ms")
    result(f"schedule a {args.nodes}-node layer region, CPU", cpu, LAYER_TARGET_MS, "ms")
    wall, cpu, tl = _best(lambda: schedule_phase(graph, costs), args.repeat)
    print(f"{f'phase, {args.layers} layers from one template':44s} {wall:8.1f} {cpu:8.1f}  "
          f"({tl.num_events} events, makespan {tl.makespan_s * 1e3:.1f} ms)")
    wall, cpu, trace = _best(lambda: timeline_trace(tl), 1)
    print(f"{'  its trace':44s} {wall:8.1f} {cpu:8.1f}  "
          f"({len(trace['traceEvents'])} trace events)")

    print(f"\npipelines, pp={args.pp}, ~{args.m} micro-batches, uneven first/last stage, "
          "P2P 10 µs")
    for schedule, vp in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                         ("zb-v", 1), ("dualpipe", 1), ("dualpipev", 1)):
        from zrt_core.schedule.pipeline import virtual_stages

        m = args.m if schedule != "interleaved" else -(-args.m // args.pp) * args.pp
        stages = virtual_stages(schedule, args.pp, vp)
        fwd = [1e-3] * stages
        fwd[0], fwd[-1] = 1.3e-3, 1.8e-3  # embedding, head + loss
        times = StageTimes(fwd, [2 * f for f in fwd], weight_s=[0.8 * f for f in fwd],
                           forward_comm_s=[0.2 * f for f in fwd],
                           backward_comm_s=[0.3 * f for f in fwd])

        def run(schedule: str = schedule, m: int = m, vp: int = vp,
                times: StageTimes = times):  # type: ignore[no-untyped-def]
            return simulate(schedule, times, pp=args.pp, vp=vp, microbatches=m, p2p_s=1e-5)

        wall, cpu, r = _best(run, args.repeat)
        label = f"{schedule} (m={m}{f', vp={vp}' if vp > 1 else ''})"
        print(f"{label:44s} {wall:8.1f} {cpu:8.1f}  < {PIPELINE_TARGET_MS:.0f} ms  "
              f"(ran {r.simulated_ops} of {r.num_ops} ops, bubble {r.bubble_fraction:.1%})")
        result(f"simulate {label} at pp={args.pp}, CPU", cpu, PIPELINE_TARGET_MS, "ms")
    wall, cpu, trace = _best(lambda: pipeline_trace(r), 1)
    print(f"{'  its trace (capped)':44s} {wall:8.1f} {cpu:8.1f}  "
          f"({len(trace['traceEvents'])} trace events)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
