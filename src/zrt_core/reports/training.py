"""The training report: what :func:`zrt_core.estimate.training.estimate_training` returns,
its JSON for machines and its tables for people.

Times are seconds of one step on the critical pipeline rank; the identities
(docs/training-model.md) hold to rounding::

    step_time_s = pipeline_s + optimizer_s + optimizer_comm_exposed_s
    pipeline_s  = compute_s + Σ pipeline_exposed_comm_s + bubble_s
    compute_s   = forward_s + backward_s + recompute_s
    compute_s   = Σ compute_by_category_s = Σ compute_by_layer_kind_s

``to_json`` puts those fields, ``tokens_per_s_per_gpu``, ``mfu``, ``hfu`` and the memory
fields at the top (what ``zrt run --train --json`` promises).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

if TYPE_CHECKING:
    from zrt_core.goodput import Goodput
    from zrt_core.schedule.pipeline import PipelineResult, StageTimes
    from zrt_core.schedule.timeline import Timeline
    from zrt_core.strategy import Parallel, TrainSpec

GIB = 2.0 ** 30


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@frozen
class StageReport:
    """One virtual stage, per micro-batch.

    ``forward_s``/``backward_s`` are its timelines' makespans (what the pipeline schedule
    takes); the ``*_compute_s`` parts are kernels on the compute stream, ``exposed_comm_s``
    communication during which the stage computes nothing, ``hidden_comm_s`` the rest.
    """

    stage: int
    rank: int
    layers: tuple[int, int]
    first: bool
    last: bool
    forward_s: float
    backward_s: float
    weight_s: float
    forward_compute_s: float
    backward_compute_s: float
    recompute_s: float
    exposed_comm_s: Mapping[str, float] = field(converter=_ro)
    hidden_comm_s: Mapping[str, float] = field(converter=_ro)
    activation_bytes: float = 0.0
    transient_bytes: float = 0.0
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    compute_by_category_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    compute_by_layer_kind_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    #: host time the device waits for in one micro-batch's forward and backward (eager
    #: launches: :func:`zrt_core.estimate.host.exposed_host_s`), part of ``forward_s``,
    #: ``backward_s`` and ``exposed_comm_s["host"]``
    host_forward_s: float = 0.0
    host_backward_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "rank": self.rank, "layers": list(self.layers),
                "first": self.first, "last": self.last, "forward_s": self.forward_s,
                "backward_s": self.backward_s, "weight_s": self.weight_s,
                "forward_compute_s": self.forward_compute_s,
                "backward_compute_s": self.backward_compute_s,
                "recompute_s": self.recompute_s,
                "exposed_comm_s": dict(self.exposed_comm_s),
                "hidden_comm_s": dict(self.hidden_comm_s),
                "activation_bytes": self.activation_bytes,
                "transient_bytes": self.transient_bytes,
                "compute_by_category_s": dict(self.compute_by_category_s),
                "compute_by_layer_kind_s": dict(self.compute_by_layer_kind_s),
                "host_forward_s": self.host_forward_s,
                "host_backward_s": self.host_backward_s}


@frozen
class TrainingMemory:
    """Memory of one device (the pipeline rank that needs the most), in bytes.

    ``peak = weights + gradients + optimizer_states + activations + transient +
    comm_buffers``; ``activations`` is the most the schedule keeps in flight (1F1B's first
    rank: ``pp`` micro-batches), ``transient`` the largest working set of one layer's
    backward (recomputed activations and gradient temporaries).
    """

    rank: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    comm_buffer_bytes: float
    capacity_bytes: float
    usable_bytes: float
    inflight_microbatches: int
    activation_bytes_per_microbatch: float
    host_optimizer_bytes: float = 0.0

    @property
    def peak_bytes(self) -> float:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
                + self.activations_bytes + self.transient_bytes + self.comm_buffer_bytes)

    @property
    def feasible(self) -> bool:
        return self.peak_bytes <= self.usable_bytes

    def to_json(self) -> dict[str, Any]:
        gib = 2.0 ** 30
        return {"rank": self.rank, "weights_gib": self.weights_bytes / gib,
                "gradients_gib": self.gradients_bytes / gib,
                "optimizer_gib": self.optimizer_bytes / gib,
                "activations_gib": self.activations_bytes / gib,
                "transient_gib": self.transient_bytes / gib,
                "comm_buffers_gib": self.comm_buffer_bytes / gib,
                "peak_gib": self.peak_bytes / gib, "capacity_gib": self.capacity_bytes / gib,
                "usable_gib": self.usable_bytes / gib, "feasible": self.feasible,
                "inflight_microbatches": self.inflight_microbatches,
                "activation_gib_per_microbatch": self.activation_bytes_per_microbatch / gib,
                "host_optimizer_gib": self.host_optimizer_bytes / gib}


@frozen(eq=False)
class TrainingReport:
    """One training step, broken down (see the module docstring for the identities).

    Times are seconds on the critical pipeline rank; ``exposed_comm_s`` is by group (``tp``,
    ``cp``, ``ep``, ``pp``, ``dp``...) over the whole step and ``pipeline_exposed_comm_s``
    the part inside the pipeline. ``mfu`` counts model FLOPs (analytic, 3 × forward, causal
    attention) and ``hfu`` the FLOPs the device executes (the graph's, with recompute), both
    against the dense peak of the run's 16-bit dtype (bf16, or fp16) times the GPU count.
    """

    model: str
    hardware_id: str
    parallel: Parallel
    train: TrainSpec
    num_gpus: int
    schedule: str
    microbatches: int
    step_time_s: float
    pipeline_s: float
    optimizer_s: float
    optimizer_comm_exposed_s: float
    compute_s: float
    forward_s: float
    backward_s: float
    recompute_s: float
    bubble_s: float
    pipeline_exposed_comm_s: Mapping[str, float] = field(converter=_ro)
    exposed_comm_s: Mapping[str, float] = field(converter=_ro)
    hidden_comm_s: Mapping[str, float] = field(converter=_ro)
    tokens_per_s_per_gpu: float = 0.0
    mfu: float = 0.0
    hfu: float = 0.0
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    peak_tflops: float = 0.0
    memory: TrainingMemory | None = None
    stages: tuple[StageReport, ...] = ()
    critical_rank: int = 0
    precision: str = ""
    notes: tuple[str, ...] = ()
    timings_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    pipeline: PipelineResult | None = None
    stage_times: StageTimes | None = None
    p2p_s: tuple[float, ...] = ()
    p2p_wrap_s: float = 0.0
    timelines: Mapping[str, Timeline] = field(factory=dict, converter=_ro)
    compute_by_category_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    compute_by_layer_kind_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    #: a checkpoint of the model state (trained weights and optimizer states): in all, and
    #: what the device that writes most writes (docs/goodput.md)
    checkpoint_bytes: float = 0.0
    checkpoint_bytes_per_device: float = 0.0
    #: the whole run (``zrt run --train --tokens``/``--steps``), when asked for
    goodput: Goodput | None = None
    collectives: Mapping[str, Any] = field(factory=dict, converter=_ro)
    #: where the prices came from (``zrt_core.cost.coverage``), when asked for
    price_coverage: Mapping[str, Any] = field(factory=dict, converter=_ro)

    @property
    def exposed_comm_total_s(self) -> float:
        return sum(self.exposed_comm_s.values())

    @property
    def pipeline_exposed_comm_total_s(self) -> float:
        return sum(self.pipeline_exposed_comm_s.values())

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.pipeline_s if self.pipeline_s else 0.0

    @property
    def feasible(self) -> bool:
        return self.memory is None or self.memory.feasible

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model, "hardware": self.hardware_id, "num_gpus": self.num_gpus,
            "parallel": self.parallel.to_json(), "train": self.train.to_json(),
            "precision": self.precision, "schedule": self.schedule,
            "microbatches": self.microbatches,
            "step_time_s": self.step_time_s, "pipeline_s": self.pipeline_s,
            "optimizer_s": self.optimizer_s,
            "optimizer_comm_exposed_s": self.optimizer_comm_exposed_s,
            "compute_s": self.compute_s, "forward_s": self.forward_s,
            "backward_s": self.backward_s, "recompute_s": self.recompute_s,
            "bubble_s": self.bubble_s, "bubble_fraction": self.bubble_fraction,
            "pipeline_exposed_comm_s": dict(self.pipeline_exposed_comm_s),
            "exposed_comm_s": dict(self.exposed_comm_s),
            "hidden_comm_s": dict(self.hidden_comm_s),
            "compute_by_category_s": dict(self.compute_by_category_s),
            "compute_by_layer_kind_s": dict(self.compute_by_layer_kind_s),
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
            "hfu": self.hfu, "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops, "peak_tflops": self.peak_tflops,
            "critical_rank": self.critical_rank, "feasible": self.feasible,
            "memory": self.memory.to_json() if self.memory else None,
            "stages": [s.to_json() for s in self.stages],
            "notes": list(self.notes), "timings_s": dict(self.timings_s),
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_bytes_per_device": self.checkpoint_bytes_per_device,
            "collectives": {k: dict(v) for k, v in self.collectives.items()},
            "price_coverage": dict(self.price_coverage),
        }
        if self.goodput is not None:
            out["goodput"] = self.goodput.to_json()
        return out


def identities(report: TrainingReport) -> dict[str, tuple[float, float]]:
    """Each identity of the module docstring as ``(left side, right side)``."""
    return {
        "step = pipeline + optimizer + exposed optimizer comm": (
            report.step_time_s,
            report.pipeline_s + report.optimizer_s + report.optimizer_comm_exposed_s),
        "pipeline = compute + exposed comm + bubble": (
            report.pipeline_s,
            report.compute_s + report.pipeline_exposed_comm_total_s + report.bubble_s),
        "compute = forward + backward + recompute": (
            report.compute_s, report.forward_s + report.backward_s + report.recompute_s),
        "compute = Σ by op category": (
            report.compute_s, sum(report.compute_by_category_s.values())),
        "compute = Σ by layer kind": (
            report.compute_s, sum(report.compute_by_layer_kind_s.values())),
    }


def _s(value: float) -> str:
    if value >= 1.0:
        return f"{value:.3f} s"
    return f"{value * 1e3:.2f} ms"


def _shares(parts: Mapping[str, float], total: float, *, most: int = 6) -> str:
    """``"matmul 62.1%, attention 20.3%, ..."``: the largest parts of ``total``, the rest
    summed as ``other``."""
    if not parts or total <= 0:
        return "—"
    ranked = sorted(parts.items(), key=lambda kv: -kv[1])
    shown = [f"{k} {v / total:.1%}" for k, v in ranked[:most]]
    rest = sum(v for _, v in ranked[most:])
    if rest > 0:
        shown.append(f"other {rest / total:.1%}")
    return ", ".join(shown)


def summary_rows(report: TrainingReport) -> list[tuple[str, str]]:
    """``(label, value)`` rows for the people's table."""
    p, t = report.parallel, report.train
    rows = [
        ("model", report.model),
        ("hardware", f"{report.hardware_id} × {report.num_gpus}"),
        ("layout", f"{p.describe()} (sp {'on' if p.sp else 'off'}, zero {t.zero}"
                   f"{', fsdp' if t.fsdp else ''}), {report.schedule} schedule, "
                   f"{report.microbatches} micro-batches of {t.micro_batch} × {t.seq_len}"),
        ("recipe", f"{report.precision}, recompute {t.recompute}, {t.optimizer}"
                   f"{', optimizer offloaded' if t.offload_optimizer else ''}"),
        ("step", _s(report.step_time_s)),
        ("  pipeline", _s(report.pipeline_s)),
        ("    compute", f"{_s(report.compute_s)} (forward {_s(report.forward_s)}, backward "
                        f"{_s(report.backward_s)}, recompute {_s(report.recompute_s)})"),
        ("      by op category", _shares(report.compute_by_category_s, report.compute_s)),
        ("      by layer kind", _shares(report.compute_by_layer_kind_s, report.compute_s)),
        ("    exposed comm", ", ".join(f"{k} {_s(v)}" for k, v in
                                       report.pipeline_exposed_comm_s.items()) or "none"),
        ("    bubble", f"{_s(report.bubble_s)} ({report.bubble_fraction:.1%})"),
        ("  optimizer", _s(report.optimizer_s)),
        ("  exposed optimizer comm", _s(report.optimizer_comm_exposed_s)),
        ("hidden comm", ", ".join(f"{k} {_s(v)}" for k, v in report.hidden_comm_s.items())
         or "none"),
        ("throughput", f"{report.tokens_per_s_per_gpu:,.0f} tokens/s per GPU"),
        ("MFU / HFU", f"{report.mfu:.1%} / {report.hfu:.1%} of {report.peak_tflops:g} "
                      "TFLOP/s"),
    ]
    mem = report.memory
    if mem is not None:
        rows.append(("memory / device", (
            f"{mem.peak_bytes / GIB:.1f} of {mem.usable_bytes / GIB:.1f} GiB usable "
            f"(weights {mem.weights_bytes / GIB:.1f}, grads {mem.gradients_bytes / GIB:.1f}, "
            f"optimizer {mem.optimizer_bytes / GIB:.1f}, activations "
            f"{mem.activations_bytes / GIB:.1f} = {mem.inflight_microbatches} in flight, "
            f"transient {mem.transient_bytes / GIB:.1f}, buffers "
            f"{mem.comm_buffer_bytes / GIB:.1f}) on rank {mem.rank}")))
        if not mem.feasible:
            rows.append(("DOES NOT FIT", f"needs {mem.peak_bytes / GIB:.1f} GiB, "
                                         f"{mem.usable_bytes / GIB:.1f} usable"))
    for note in report.notes:
        rows.append(("note", note))
    return rows


def stage_rows(report: TrainingReport) -> list[tuple[Any, ...]]:
    """One row per virtual stage (per micro-batch times)."""
    rows = []
    for s in report.stages:
        exposed = sum(s.exposed_comm_s.values())
        rows.append((s.stage, s.rank, f"{s.layers[0]}-{s.layers[1] - 1}",
                     f"{s.forward_s * 1e3:.2f}", f"{s.backward_s * 1e3:.2f}",
                     f"{s.recompute_s * 1e3:.2f}", f"{exposed * 1e3:.2f}",
                     f"{s.activation_bytes / GIB:.2f}"))
    return rows


def _key_value_table(title: str, rows: Sequence[tuple[str, str]]) -> Any:
    """A rich table of (label, value) rows, labels bold, no header."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    for label, value in rows:
        t.add_row(label, value)
    return t


def render(report: TrainingReport, console: Any) -> None:
    """Print the summary, the per-stage table and, when asked for, the whole run with
    rich."""
    from rich.table import Table

    console.print(_key_value_table("training step", summary_rows(report)))
    stages = Table(title="stages (one micro-batch)", title_justify="left",
                   header_style="bold")
    for c in ("stage", "rank", "layers", "forward ms", "backward ms", "recompute ms",
              "exposed comm ms", "activations GiB"):
        stages.add_column(c, justify="right")
    rows = stage_rows(report)
    if len(rows) > 12:
        rows = [*rows[:6], ("…",) * 8, *rows[-6:]]
    for r in rows:
        stages.add_row(*(str(v) for v in r))
    console.print(stages)
    if report.goodput is not None:
        from zrt_core.reports.goodput import goodput_rows

        console.print(_key_value_table("training run", goodput_rows(report.goodput)))


# -- HTML ----------------------------------------------------------------------------------------


def pipeline_figure(result: PipelineResult, *, max_ops: int = 4000) -> str:
    """A Gantt chart of the pipeline schedule: one row per rank, forward and backward passes
    of each micro-batch (the first ``max_ops`` operations)."""
    from zrt_core.reports.html import _pyplot, figure_svg

    plt = _pyplot()
    colors = {"F": "#1f77b4", "B": "#ff7f0e", "W": "#2ca02c", "BW": "#ff7f0e",
              "F+BW": "#9467bd"}
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.35 * max(result.pp, 1)))
    shown = 0
    for op in result.iter_ops():
        if shown >= max_ops:
            break
        ax.broken_barh([(op.start_s, max(op.duration_s, 1e-9))], (op.rank - 0.4, 0.8),
                       facecolors=colors.get(op.kind, "#999999"), edgecolor="white",
                       linewidth=0.3)
        shown += 1
    ax.set_yticks(range(result.pp))
    ax.set_yticklabels([f"rank {r}" for r in range(result.pp)])
    ax.invert_yaxis()
    ax.set_xlabel("s")
    ax.set_title(f"{result.schedule}: pp={result.pp}, vp={result.vp}, "
                 f"{result.microbatches} micro-batches, bubble {result.bubble_fraction:.1%}",
                 fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("#1f77b4", "#ff7f0e")]
    ax.legend(handles, ["forward", "backward"], fontsize=8, loc="upper right")
    fig.tight_layout()
    return figure_svg(fig)


def collective_rows(report: TrainingReport) -> list[tuple[Any, ...]]:
    """One row per phase/group/kind of :attr:`TrainingReport.collectives`."""
    rows = []
    for key, c in report.collectives.items():
        calls = c["calls"] or 1
        algorithms = ", ".join(f"{a} ({n})" for a, n in sorted(
            c["algorithms"].items(), key=lambda kv: -kv[1]))
        rows.append((key, c["group_size"], c["calls"], c["bytes"] / calls / 1e6, algorithms,
                     c["time_s"] * 1e3))
    return rows


def training_sections(report: TrainingReport) -> list[Any]:
    """Summary, step breakdown, memory, stages, pipeline, timelines and the identities."""
    from zrt_core.reports.html import (
        Section,
        _e,
        breakdown_figure,
        memory_figure,
        table_html,
        timeline_figure,
    )

    sections = []
    # the notes follow the table as highlighted lines, not as rows of it too
    body = table_html(("", ""), [r for r in summary_rows(report) if r[0] != "note"])
    mem = report.memory
    if mem is not None and not mem.feasible:
        body = (f"<div class='bad'>Does not fit: needs {mem.peak_bytes / GIB:.1f} GiB per "
                f"device, {mem.usable_bytes / GIB:.1f} GiB usable</div>") + body
    for note in report.notes:
        body += f"<div class='note'>{_e(note)}</div>"
    sections.append(Section("Summary", body))
    if report.goodput is not None:
        from zrt_core.reports.goodput import goodput_section

        sections.append(goodput_section(report.goodput))

    parts = {"forward": report.forward_s, "backward": report.backward_s,
             "recompute": report.recompute_s}
    parts.update({f"exposed {k}": v for k, v in report.pipeline_exposed_comm_s.items()})
    parts["bubble"] = report.bubble_s
    parts["optimizer"] = report.optimizer_s
    parts["exposed optimizer comm"] = report.optimizer_comm_exposed_s
    rows = [(k, v) for k, v in parts.items()]
    rows.append(("step", report.step_time_s))
    sections.append(Section("Step time", breakdown_figure(
        {"step": parts}, unit="s", title="where the step goes (critical rank)") +
        table_html(("part", "seconds"), rows) + table_html(
            ("group", "exposed s", "hidden s"),
            [(g, report.exposed_comm_s.get(g, 0.0), report.hidden_comm_s.get(g, 0.0))
             for g in dict.fromkeys([*report.exposed_comm_s, *report.hidden_comm_s])])))

    if report.compute_by_category_s:
        kinds = dict(report.compute_by_layer_kind_s)
        sections.append(Section("Compute by op category and layer kind", breakdown_figure(
            {"op category": dict(report.compute_by_category_s)}, unit="s",
            title="kernel time of the step (critical rank)", of="compute time") +
            (breakdown_figure({"layer kind": kinds}, unit="s", of="compute time")
             if kinds else "") +
            table_html(("op category", "seconds", "share"), [
                (k, v, f"{v / report.compute_s:.1%}" if report.compute_s else "")
                for k, v in sorted(report.compute_by_category_s.items(),
                                   key=lambda kv: -kv[1])]) +
            table_html(("layer kind", "seconds", "share"), [
                (k, v, f"{v / report.compute_s:.1%}" if report.compute_s else "")
                for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])])))

    if mem is not None:
        gib = {"weights": mem.weights_bytes / GIB, "gradients": mem.gradients_bytes / GIB,
               "optimizer": mem.optimizer_bytes / GIB,
               "activations": mem.activations_bytes / GIB,
               "transient": mem.transient_bytes / GIB,
               "buffers": mem.comm_buffer_bytes / GIB}
        sections.append(Section("Memory per device", memory_figure(
            gib, mem.usable_bytes / GIB, title=f"rank {mem.rank} (line: usable)", unit="GiB") +
            table_html(("item", "GiB"), [*gib.items(), ("peak", mem.peak_bytes / GIB),
                                        ("usable", mem.usable_bytes / GIB)]) +
            f"<p>{mem.inflight_microbatches} micro-batches in flight on rank {mem.rank}; "
            f"{mem.activation_bytes_per_microbatch / GIB:.3f} GiB of activations each.</p>"))

    sections.append(Section("Pipeline stages (one micro-batch)", table_html(
        ("stage", "rank", "layers", "forward ms", "backward ms", "recompute ms",
         "exposed comm ms", "activations GiB"), stage_rows(report))))
    if report.collectives:
        sections.append(Section("Collectives (one micro-batch, every layer and stage)",
                                table_html(("phase / group / kind", "ranks", "calls",
                                            "MB per call", "algorithm (calls)", "ms total"),
                                           collective_rows(report)) +
                                "<p>The algorithm is the one NCCL's cost model picks at that "
                                "size and scale (docs/collectives.md).</p>"))
    if report.pipeline is not None:
        sections.append(Section("Pipeline schedule", pipeline_figure(report.pipeline)))
    timelines = [(name, t) for name, t in report.timelines.items() if t is not None]
    if timelines:
        body = "".join(timeline_figure(t, title=f"stage 0 {name}") for name, t in timelines)
        body += ("<p>The whole step is in <code>trace.json</code> (ui.perfetto.dev or "
                 "chrome://tracing).</p>")
        sections.append(Section("Stage timelines", body))
    sections.append(Section("Identities", table_html(
        ("identity", "left s", "right s"),
        [(k, a, b) for k, (a, b) in identities(report).items()])))
    sections.append(Section("How this was computed", table_html(("", ""), [
        ("model", "docs/training-model.md"),
        ("estimate time", f"{report.timings_s.get('total', 0) * 1e3:.0f} ms"),
        ("MFU", "model FLOPs: 3 × the analytic forward (causal attention), over "
                f"{report.peak_tflops:g} TFLOP/s × GPUs"),
        ("HFU", "FLOPs the devices execute (the graphs, recompute included)")])))
    return sections


def write_training_html(report: TrainingReport, path: Any) -> Any:
    """Write the training report as one self-contained HTML file."""
    from pathlib import Path

    from zrt_core.reports.html import page

    path = Path(path)
    title = f"zrt training: {report.model} on {report.hardware_id} × {report.num_gpus}"
    subtitle = (f"{report.parallel.describe()}, {report.schedule}, micro-batch "
                f"{report.train.micro_batch} × {report.train.seq_len}, global batch "
                f"{report.train.global_batch}, {report.precision}")
    path.write_text(page(title, training_sections(report), subtitle), encoding="utf-8")
    return path
