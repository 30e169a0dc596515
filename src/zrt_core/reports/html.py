"""Self-contained HTML reports: tables and matplotlib plots inlined as SVG, no script, no
CDN — one file that opens anywhere and can be mailed around.

The building blocks (:func:`page`, :class:`Section`, :func:`table_html`, :func:`figure_svg`,
:func:`breakdown_figure`, :func:`timeline_figure`, :func:`memory_figure`) are shared by
the inference report (:func:`inference_sections`) and the training report, which adds
its own sections. matplotlib is imported only when a figure is drawn (Agg backend).
"""

from __future__ import annotations

import html
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from zrt_core.reports.inference import InferenceReport
    from zrt_core.schedule.timeline import Timeline

#: Category colours, stable across plots (matplotlib's tab20 order).
CATEGORY_COLORS = {
    "matmul": "#1f77b4", "attention": "#ff7f0e", "collective": "#d62728",
    "elementwise": "#2ca02c", "norm": "#9467bd", "softmax": "#8c564b", "copy": "#e377c2",
    "embedding": "#7f7f7f", "moe_router": "#bcbd22", "moe_dispatch": "#17becf",
    "moe_combine": "#aec7e8", "reduction": "#ffbb78", "optimizer": "#98df8a",
    "loss": "#ff9896", "ssm": "#c5b0d5", "creation": "#c49c94", "other": "#dbdb8d",
}
#: Colours for parts that are not op categories (step-time parts, memory items), in order.
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")


def _color(key: str, index: int) -> str:
    """A category's own colour, or the palette's ``index``-th for any other part."""
    return CATEGORY_COLORS.get(key) or _PALETTE[index % len(_PALETTE)]


_STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:1px solid #ddd;
padding-bottom:.2em;margin-top:1.8em}.sub{color:#666;margin-top:0}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.3em .7em;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f6f6f6}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em 1em;margin:.5em 0}
.bad{background:#fdecea;border-left:4px solid #d62728;padding:.5em 1em;margin:.5em 0}
figure{margin:.8em 0}svg{max-width:100%;height:auto}
"""


@frozen
class Section:
    """A titled part of a report; ``body`` is trusted HTML (built with the helpers)."""

    title: str
    body: str


def page(title: str, sections: Iterable[Section], subtitle: str = "") -> str:
    """The whole HTML document."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>"]
    if subtitle:
        parts.append(f"<p class='sub'>{_e(subtitle)}</p>")
    for s in sections:
        parts.append(f"<h2>{_e(s.title)}</h2>{s.body}")
    parts.append("</body></html>")
    return "".join(parts)


def _e(text: Any) -> str:
    return html.escape(str(text))


def table_html(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A table; numbers are right-aligned (floats to 4 significant digits)."""
    out = ["<table><tr>", *(f"<th>{_e(c)}</th>" for c in columns), "</tr>"]
    for row in rows:
        out.append("<tr>")
        for v in row:
            if isinstance(v, bool) or v is None:
                out.append(f"<td>{_e('' if v is None else v)}</td>")
            elif isinstance(v, int):
                out.append(f"<td class='num'>{v:,}</td>")
            elif isinstance(v, float):
                out.append(f"<td class='num'>{v:,.4g}</td>")
            else:
                out.append(f"<td>{_e(v)}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def figure_svg(fig: Any) -> str:
    """A matplotlib figure as inline SVG markup (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    start = text.find("<svg")
    return f"<figure>{text[start:] if start >= 0 else text}</figure>"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def breakdown_figure(series: Mapping[str, Mapping[str, float]], *, unit: str = "ms",
                     title: str = "", of: str = "step time") -> str:
    """Horizontal stacked bars: one bar per series (prefill, decode...), split by key
    (op category), values in ``unit``; the axis reads "% of ``of``"."""
    plt = _pyplot()
    names = list(series)
    keys: list[str] = []
    for values in series.values():
        for k, v in sorted(values.items(), key=lambda kv: -kv[1]):
            if v > 0 and k not in keys:
                keys.append(k)
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 0.9 + 0.8 * len(names)),
                             squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        left = 0.0
        values = series[name]
        total = sum(v for v in values.values() if v > 0) or 1.0
        for i, k in enumerate(keys):
            v = values.get(k, 0.0)
            if v <= 0:
                continue
            ax.barh([0], [v / total * 100], left=left, color=_color(k, i), label=k,
                    edgecolor="white")
            if v / total > 0.06:
                ax.text(left + v / total * 50, 0, f"{k}\n{v:.3g} {unit}", ha="center",
                        va="center", fontsize=7, color="white")
            left += v / total * 100
        ax.set_xlim(0, 100)
        ax.set_yticks([0])
        ax.set_yticklabels([f"{name}\n{total:.4g} {unit}"])
        ax.set_xlabel(f"% of {of}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    fig.legend(seen.values(), seen.keys(), loc="upper center", ncol=min(len(seen), 6),
               fontsize=8, bbox_to_anchor=(0.5, 1.02 + 0.02 * (len(seen) > 6)))
    if title:
        fig.suptitle(title, y=1.1, fontsize=10)
    fig.tight_layout()
    return figure_svg(fig)


def bar_figure(values: Mapping[str, float], *, unit: str, title: str) -> str:
    """Vertical bars of named values (time per layer kind...)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(values) + 2), 2.8))
    names = list(values)
    ax.bar(names, [values[n] for n in names], color="#1f77b4")
    for i, n in enumerate(names):
        ax.text(i, values[n], f"{values[n]:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(unit)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return figure_svg(fig)


def timeline_figure(timeline: Timeline, *, title: str, max_events: int = 600,
                    window_s: float | None = None) -> str:
    """A Gantt chart of a timeline's first events: one row per stream, bars coloured by
    op category (the whole step is in the Chrome trace)."""
    plt = _pyplot()
    events = []
    for e in timeline.iter_events():
        if window_s is not None and e.start_s > window_s:
            continue
        events.append(e)
        if len(events) >= max_events:
            break
    streams = sorted({e.stream for e in events}, key=lambda s: (s != "compute", s))
    rows = {s: i for i, s in enumerate(streams)}
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.45 * max(len(streams), 1)))
    for e in events:
        ax.broken_barh([(e.start_s * 1e3, max(e.duration_s * 1e3, 1e-6))],
                       (rows[e.stream] - 0.4, 0.8),
                       facecolors=CATEGORY_COLORS.get(e.category, "#999999"))
    ax.set_yticks(range(len(streams)))
    ax.set_yticklabels(streams)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    shown = events[-1].end_s * 1e3 if events else 0.0
    ax.set_title(f"{title} — first {len(events)} kernels ({shown:.3g} of "
                 f"{timeline.makespan_s * 1e3:.4g} ms)", fontsize=10)
    cats = sorted({e.category for e in events})
    handles = [plt.Rectangle((0, 0), 1, 1, color=CATEGORY_COLORS.get(c, "#999999"))
               for c in cats]
    ax.legend(handles, cats, fontsize=7, ncol=min(len(cats), 8), loc="upper center",
              bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    return figure_svg(fig)


def memory_figure(parts: Mapping[str, float], capacity: float, *, title: str,
                  unit: str = "GB") -> str:
    """One stacked bar of memory use (in ``unit``) against the device's capacity."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.4))
    left = 0.0
    for i, (name, value) in enumerate(parts.items()):
        if value <= 0:
            continue
        ax.barh([0], [value], left=left, color=_PALETTE[i % len(_PALETTE)],
                label=f"{name} {value:.1f} {unit}", edgecolor="white")
        left += value
    ax.axvline(capacity, color="#d62728", linestyle="--", label=f"capacity {capacity:.1f} {unit}")
    ax.set_yticks([])
    ax.set_xlabel(f"{unit} per device")
    ax.set_xlim(0, max(capacity, left) * 1.05)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.55))
    ax.set_title(title, fontsize=10)
    return figure_svg(fig)


# -- the inference report ---------------------------------------------------------------


def inference_sections(report: InferenceReport) -> list[Section]:
    """Summary, memory, time breakdown by category and layer, timelines, collectives."""
    from zrt_core.reports.inference import summary_rows

    sections = []
    body = table_html(("", ""), summary_rows(report))
    mem = report.memory
    if mem is not None and not mem.fits:
        body = f"<div class='bad'>Does not fit: {_e(mem.message)}</div>" + body
    for note in report.notes:
        body += f"<div class='note'>{_e(note)}</div>"
    sections.append(Section("Summary", body))

    if mem is not None:
        gib = 2.0**30  # GiB, as the JSON and the training report
        parts = {"weights": mem.weights / gib, "KV cache": mem.kv_in_use / gib,
                 "activations": mem.activations / gib, "runtime": mem.reserve / gib}
        rows = [("capacity", mem.capacity / gib), ("weights", mem.weights / gib),
                ("KV cache in use", mem.kv_in_use / gib),
                ("KV budget", mem.kv_budget / gib), ("activations", mem.activations / gib),
                ("runtime reserve", mem.reserve / gib),
                ("KV bytes per token", mem.kv_per_token),
                ("KV bytes per sequence", mem.kv_per_sequence)]
        sections.append(Section("Memory per device", memory_figure(
            parts, mem.capacity / gib, title="memory per device", unit="GiB") +
            table_html(("item", "GiB (bytes for per-token rows)"), rows)))

    phases = {p.phase: p for p in (report.prefill, report.decode) if p is not None}
    if phases:
        series = {f"{name} (batch {p.batch})": {k: v * 1e3 for k, v in
                                                p.by_category_s.items()}
                  for name, p in phases.items()}
        cats = sorted({k for p in phases.values() for k in p.by_category_s},
                      key=lambda k: -sum(p.by_category_s.get(k, 0) for p in phases.values()))
        rows = [(c, *(p.by_category_s.get(c, 0.0) * 1e3 for p in phases.values()))
                for c in cats]
        rows.append(("total", *(p.time_s * 1e3 for p in phases.values())))
        sections.append(Section("Time by op category", breakdown_figure(
            series, title="step time by op category") + table_html(
            ("category", *(f"{n} ms" for n in phases)), rows)))

        kinds = sorted({k for p in phases.values() for k in p.by_layer_kind_s})
        rows = []
        for k in kinds:
            row: list[Any] = [k]
            for p in phases.values():
                row.extend([p.layer_counts.get(k), p.per_layer_s.get(k, 0.0) * 1e3,
                            p.by_layer_kind_s.get(k, 0.0) * 1e3])
            rows.append(row)
        columns = ["layer kind"]
        for n in phases:
            columns += [f"{n} layers", f"{n} ms / layer", f"{n} ms total"]
        decode = report.decode
        fig = bar_figure({k: v * 1e3 for k, v in decode.per_layer_s.items()}, unit="ms",
                         title="decode time per layer, by kind") if decode and \
            decode.per_layer_s else ""
        sections.append(Section("Time by layer", fig + table_html(columns, rows)))

        rows = []
        for name, p in phases.items():
            for key, c in sorted(p.collectives.items()):
                rows.append((name, key, int(c["count"]), c["bytes"] / 1e6,
                             c["time_s"] * 1e3))
        if rows:
            sections.append(Section("Collectives", table_html(
                ("phase", "group / kind", "per step", "MB per step", "ms per step"), rows)))

    timelines = [(name, t) for name, t in report.timelines.items() if t is not None]
    if timelines:
        body = "".join(timeline_figure(t, title=f"{name} step") for name, t in timelines)
        body += ("<p>The whole steps are in <code>trace.json</code> (open it in "
                 "ui.perfetto.dev or chrome://tracing).</p>")
        sections.append(Section("Timeline", body))

    if report.throughput:
        sections.append(Section("Throughput model", table_html(
            ("quantity", "value"), [(k, v) for k, v in report.throughput.items()])))
    sections.append(Section("How this was computed", table_html(
        ("", ""), [("transforms", ", ".join(report.transforms)),
                   ("tensor-parallel plan", report.params.get("tp_plan", "")),
                   ("price sources (decode)", ", ".join(
                       f"{k} {v:.0%}" for k, v in (report.decode.coverage.items()
                                                  if report.decode else []) if v)),
                   ("estimate time", f"{report.timings_s.get('total_s', 0) * 1e3:.0f} ms"),
                   ("model", "docs/inference-model.md")])))
    return sections


def write_inference_html(report: InferenceReport, path: str | Path) -> Path:
    """Write the inference report as one self-contained HTML file."""
    path = Path(path)
    title = f"zrt inference: {report.model} on {report.hardware_name}"
    subtitle = (f"{report.parallel.get('describe', '')}, input {report.workload.get('input_len')}"
                f", output {report.workload.get('output_len')}, {report.mode}")
    path.write_text(page(title, inference_sections(report), subtitle), encoding="utf-8")
    return path
