"""Chrome/Perfetto trace export of timelines and pipeline steps."""

from __future__ import annotations

import json
from pathlib import Path

from zrt_core.cost.backend import NodeCost
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode
from zrt_core.reports.trace import merge_traces, pipeline_trace, timeline_trace, write_trace
from zrt_core.schedule.pipeline import StageTimes, simulate
from zrt_core.schedule.scheduler import schedule_phase


def model(layers: int) -> OpGraph:
    # embedding 1 ms → [mm 2 ms (2 GFLOP) → tp all-reduce 0.5 ms] × layers → head 1 ms
    ns = [OpNode(id=0, op="embedding", category="embedding", phase="train_forward"),
          OpNode(id=1, op="aten.mm", category="matmul", phase="train_forward", layer_index=0,
                 flops=2_000_000_000, bytes_read=3000, bytes_written=1000),
          OpNode(id=2, op="comm.all_reduce", category="collective", phase="train_forward",
                 layer_index=0, attrs={"group": "tp", "collective": "all_reduce",
                                       "bytes": 4096}),
          OpNode(id=3, op="head", category="matmul", phase="train_forward")]
    return OpGraph(phase="train_forward", nodes=ns, edges=[(0, 1), (1, 2), (2, 3)],
                   templates=[LayerTemplate("dense", 0, tuple(range(layers)))])


COSTS = {0: NodeCost(1e-3, "roofline", "embedding", "roofline"),
         1: NodeCost(2e-3, "roofline", "gemm", "roofline"),
         2: NodeCost(5e-4, "collectives", "ring_all_reduce", "roofline"),
         3: NodeCost(1e-3, "roofline", "gemm", "roofline")}


def slices(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_timeline_trace_has_streams_microseconds_and_args() -> None:
    trace = timeline_trace(schedule_phase(model(2), COSTS), device="rank 0", pid=3)
    meta = {(e["name"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "rank 0"}
    assert meta[("thread_name", 0)] == {"name": "compute"}
    assert meta[("thread_name", 1)] == {"name": "comm.tp"}
    xs = slices(trace)
    # embedding 0-1000 µs, mm 1000-3000, AR 3000-3500, mm 3500-5500, AR 5500-6000, head
    assert [(e["name"], e["ts"], e["dur"], e["tid"]) for e in xs] == [
        ("embedding", 0.0, 1000.0, 0), ("aten.mm", 1000.0, 2000.0, 0),
        ("comm.all_reduce", 3000.0, 500.0, 1), ("aten.mm", 3500.0, 2000.0, 0),
        ("comm.all_reduce", 5500.0, 500.0, 1), ("head", 6000.0, 1000.0, 0)]
    assert all(e["pid"] == 3 for e in xs)
    mm = xs[3]["args"]
    assert mm == {"op": "aten.mm", "category": "matmul", "flops": 2_000_000_000,
                  "bytes": 4000, "rule": "roofline:gemm", "source": "roofline",
                  "layer": 1, "node": 1, "phase": "train_forward"}
    ar = xs[2]["args"]
    assert ar["group"] == "tp" and ar["comm_bytes"] == 4096 and ar["overlap"] == "sync"
    assert trace["otherData"]["exposed_comm_s"] == {"tp": 1e-3}


def test_long_models_aggregate_layers_past_the_cap() -> None:
    # 100 layers × 2 events + 2 outer = 202 slices; with a cap of 50 the embedding and the
    # first 24 layers expand (1 + 24 × 2 = 49 ≤ 50); every later region becomes one slice
    # per stream: layers 24-99 on two streams, then the head.
    tl = schedule_phase(model(100), COSTS)
    trace = timeline_trace(tl, max_events=50)
    xs = slices(trace)
    expanded = [e for e in xs if e["cat"] != "aggregated"]
    folded = [e for e in xs if e["cat"] == "aggregated"]
    assert len(expanded) == 1 + 24 * 2
    assert len(folded) == 76 * 2 + 1
    assert folded[0]["name"] == "layer 24 (aggregated)"
    assert folded[0]["args"]["events"] == 1
    # the whole step is still covered: the last slice ends at the makespan
    assert max(e["ts"] + e["dur"] for e in xs) == round(tl.makespan_s * 1e6, 3)


def test_pipeline_trace_names_operations_per_rank() -> None:
    r = simulate("1f1b", StageTimes(1e-3, 2e-3), pp=2, microbatches=2)
    xs = slices(pipeline_trace(r))
    # rank 0 warms up with one forward: F0, F1, B0, B1; rank 1 alternates: F0 B0 F1 B1.
    assert [(e["pid"], e["name"]) for e in xs] == [
        (0, "F0"), (0, "F1"), (0, "BW0"), (0, "BW1"),
        (1, "F0"), (1, "BW0"), (1, "F1"), (1, "BW1")]
    assert xs[0]["args"] == {"stage": 0, "microbatch": 0}
    # rank 1's B0: F0 ran 0-1 ms on rank 0 and 1-2 ms on rank 1, then B0 2-4 ms
    assert xs[5]["ts"] == 2000.0 and xs[5]["dur"] == 2000.0


def test_pipeline_trace_names_dualpipe_pairs_and_folds_the_middle() -> None:
    r = simulate("dualpipe", StageTimes(1.0, 2.0, weight_s=1.0), pp=4, microbatches=16)
    xs = slices(pipeline_trace(r))
    pair = next(e for e in xs if "+" in e["name"])
    assert pair["cat"] == "F+BW" and "backward_stage" in pair["args"]
    folded = slices(pipeline_trace(r, max_events=40))
    assert any(e["cat"] == "aggregated" for e in folded)
    assert len(folded) < len(xs)


def test_written_trace_is_compact_valid_json(tmp_path: Path) -> None:
    tl = schedule_phase(model(2), COSTS)
    r = simulate("gpipe", StageTimes(1e-3, 2e-3), pp=2, microbatches=2)
    both = merge_traces(timeline_trace(tl, pid=100), pipeline_trace(r))
    path = write_trace(both, tmp_path / "step.json")
    text = path.read_text()
    assert ", " not in text and ": " not in text
    loaded = json.loads(text)
    assert loaded["displayTimeUnit"] == "ms"
    assert len(loaded["traceEvents"]) == len(both["traceEvents"])
    assert write_trace({"traceEvents": []}, tmp_path / "empty.json").read_text() == \
        '{"traceEvents":[]}'
