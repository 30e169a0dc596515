"""The files a run writes into a directory (``--out DIR``, and the server's job files):
``report.html`` (self-contained), ``report.json`` and ``trace.json`` (Chrome/Perfetto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_inference_outputs(report: Any, directory: Path) -> list[Path]:
    """``report.html``, ``report.json`` and ``trace.json`` of a serving report."""
    from zrt_core.reports.html import write_inference_html
    from zrt_core.reports.trace import merge_traces, timeline_trace, write_trace

    files = [write_inference_html(report, directory / "report.html")]
    path = directory / "report.json"
    path.write_text(json.dumps(report.to_json(), indent=1, default=str), encoding="utf-8")
    files.append(path)
    traces = [timeline_trace(t, device=f"{name} (one device)", pid=i)
              for i, (name, t) in enumerate(report.timelines.items()) if t is not None]
    if traces:
        files.append(write_trace(merge_traces(*traces), directory / "trace.json"))
    return files


def write_training_outputs(report: Any, directory: Path) -> list[Path]:
    """``report.html``, ``report.json`` and ``trace.json`` of a training report: the
    pipeline schedule (one process per pipeline rank) and the first stage's kernels."""
    from zrt_core.reports.trace import merge_traces, pipeline_trace, timeline_trace, write_trace
    from zrt_core.reports.training import write_training_html

    files = [write_training_html(report, directory / "report.html")]
    path = directory / "report.json"
    path.write_text(json.dumps(report.to_json(), indent=1, default=str), encoding="utf-8")
    files.append(path)
    traces = []
    if report.pipeline is not None:
        traces.append(pipeline_trace(report.pipeline))
    first = report.parallel.pp
    for i, (name, timeline) in enumerate(report.timelines.items()):
        traces.append(timeline_trace(timeline, device=f"stage 0 {name} (one micro-batch)",
                                     pid=first + i))
    if traces:
        files.append(write_trace(merge_traces(*traces), directory / "trace.json"))
    return files
