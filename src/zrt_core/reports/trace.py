"""Chrome / Perfetto trace JSON from a :class:`Timeline` or a :class:`PipelineResult`.

The output is the Trace Event Format that ``chrome://tracing`` and ui.perfetto.dev open:
complete events (``"ph": "X"``) with microsecond ``ts``/``dur``, one process per device or
pipeline rank, one thread per stream, and ``args`` saying what each slice is (op, category,
FLOPs, bytes, the cost rule that priced it).

Size stays sane: a model timeline expands every layer's events until ``max_events`` is
reached; the layers after that appear as one slice per stream ("layer 17 (aggregated)")
spanning the layer's time on that stream. A pipeline trace keeps every operation of the
first and last micro-batches and folds the middle ones into one slice per rank on an
"aggregated" thread. Either way the trace covers the whole step.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zrt_core.schedule.pipeline import PipelineResult
    from zrt_core.schedule.timeline import Event, Timeline

#: Default cap on expanded slices per trace (about 10 MB of JSON, a second to write).
MAX_EVENTS = 100_000

_US = 1e6


def _us(seconds: float) -> float:
    return round(seconds * _US, 3)


def _metadata(pid: int, process: str, threads: Mapping[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": pid}},
    ]
    for name, tid in threads.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                    "args": {"sort_index": tid}})
    return out


def _slice(name: str, cat: str, pid: int, tid: int, start_s: float, end_s: float,
           args: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start_s),
            "dur": _us(end_s - start_s), "args": dict(args)}


def _event_slice(e: Event, pid: int, tid: int, offset_s: float = 0.0,
                 layer_index: int | None = None) -> dict[str, Any]:
    args = dict(e.args)
    layer = layer_index if (layer_index is not None and e.layer_index is not None) \
        else e.layer_index
    if layer is not None:
        args["layer"] = layer
    if e.node_id is not None:
        args["node"] = e.node_id
    if e.mode:
        args["overlap"] = e.mode
    if e.phase:
        args["phase"] = e.phase
    return _slice(e.name, e.category, pid, tid, e.start_s + offset_s, e.end_s + offset_s, args)


def timeline_trace(timeline: Timeline, *, device: str = "device 0", pid: int = 0,
                   max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """The trace of one device's timeline (see the module docstring for the size cap)."""
    streams = sorted({e.stream for p in timeline.placements for e in p.region.body}
                     | {e.stream for e in timeline.carried},
                     key=lambda s: (s != "compute", s))
    tids = {s: i for i, s in enumerate(streams)}
    events: list[dict[str, Any]] = _metadata(pid, device, tids)
    budget = max_events - len(timeline.carried)
    for placement in timeline.placements:
        region, offset = placement.region, placement.offset_s
        if len(region.body) <= budget:  # once a region does not fit, the rest aggregate
            budget -= len(region.body)
            events.extend(_event_slice(e, pid, tids[e.stream], offset, placement.layer_index)
                          for e in region.body)
            continue
        budget = -1
        label = (f"layer {placement.layer_index}" if placement.layer_index is not None
                 else region.name)
        for stream, (first, last, count, busy) in _per_stream(region.body).items():
            events.append(_slice(
                f"{label} (aggregated)", "aggregated", pid, tids[stream], first + offset,
                last + offset, {"events": count, "busy_us": _us(busy), "region": region.name}))
    events.extend(_event_slice(e, pid, tids[e.stream]) for e in timeline.carried)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"makespan_s": timeline.makespan_s, "compute_s": timeline.compute_s,
                          "exposed_comm_s": dict(timeline.exposed_comm_s),
                          "hidden_comm_s": dict(timeline.hidden_comm_s)}}


def _per_stream(events: Iterable[Event]) -> dict[str, tuple[float, float, int, float]]:
    out: dict[str, tuple[float, float, int, float]] = {}
    for e in events:
        first, last, count, busy = out.get(e.stream, (e.start_s, e.end_s, 0, 0.0))
        out[e.stream] = (min(first, e.start_s), max(last, e.end_s), count + 1,
                         busy + e.duration_s)
    return out


def pipeline_trace(result: PipelineResult, *, max_events: int = MAX_EVENTS,
                   first_pid: int = 0) -> dict[str, Any]:
    """The trace of a pipeline step: one process per rank, its operations on "compute".

    Slices are named ``F12`` (forward of micro-batch 12), ``B``/``W`` (zero-bubble halves),
    ``BW`` (a whole backward) and ``F12+BW3`` (DualPipe's overlapped pair); ``args`` name
    the virtual stage. Past ``max_events``, the middle micro-batches fold into one slice
    per rank on the "aggregated" thread.
    """
    m = result.microbatches
    keep = m
    if result.num_ops > max_events:
        per_microbatch = max(result.num_ops // m, 1)
        keep = max(max_events // per_microbatch // 2, 1)
    events: list[dict[str, Any]] = []
    for rank in range(result.pp):
        events.extend(_metadata(first_pid + rank, f"pipeline rank {rank}",
                                {"compute": 0, "aggregated": 1}))
    folded: dict[int, list[float]] = {}
    for op in result.iter_ops():
        pid = first_pid + op.rank
        if keep < m and keep <= op.microbatch < m - keep:
            span = folded.setdefault(op.rank, [op.start_s, op.end_s, 0])
            span[0], span[1] = min(span[0], op.start_s), max(span[1], op.end_s)
            span[2] += 1
            continue
        name = f"{op.kind.split('+')[0]}{op.microbatch}"
        args: dict[str, Any] = {"stage": op.stage, "microbatch": op.microbatch}
        if op.other_stage is not None:
            name += f"+BW{op.other_microbatch}"
            args["backward_stage"] = op.other_stage
            args["backward_microbatch"] = op.other_microbatch
        events.append(_slice(name, op.kind, pid, 0, op.start_s, op.end_s, args))
    for rank, (start, end, count) in folded.items():
        events.append(_slice(f"micro-batches {keep}–{m - keep - 1} (aggregated)",
                             "aggregated", first_pid + rank, 1, start, end,
                             {"operations": int(count)}))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schedule": result.schedule, "pp": result.pp, "vp": result.vp,
                          "microbatches": m, "total_s": result.total_s,
                          "bubble_s": result.bubble_s,
                          "bubble_fraction": result.bubble_fraction}}


def merge_traces(*traces: Mapping[str, Any]) -> dict[str, Any]:
    """One trace holding several (give each a distinct ``pid``/``first_pid``)."""
    events: list[dict[str, Any]] = []
    other: dict[str, Any] = {}
    for i, t in enumerate(traces):
        events.extend(t["traceEvents"])
        other[str(i)] = t.get("otherData", {})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def iter_json(trace: Mapping[str, Any]) -> Iterator[str]:
    """The trace as compact JSON, one event per chunk (for streaming to a file)."""
    yield '{"traceEvents":['
    for i, e in enumerate(trace["traceEvents"]):
        yield ("," if i else "") + json.dumps(e, separators=(",", ":"))
    rest = {k: v for k, v in trace.items() if k != "traceEvents"}
    yield ("]," + json.dumps(rest, separators=(",", ":"))[1:]) if rest else "]}"


def write_trace(trace: Mapping[str, Any], path: str | Path) -> Path:
    """Write compact trace JSON; open it in ui.perfetto.dev or chrome://tracing."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for chunk in iter_json(trace):
            f.write(chunk)
    return path
