"""A weak-scaling curve: one training step estimated at several GPU counts with the same
per-GPU batch (``zrt run --train --gpus 64,128,...``), as a table, a JSON value and an HTML
section."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:
    from zrt_core.reports.html import Section
    from zrt_core.reports.training import TrainingReport

#: relative tolerance of "the step time never falls" (float rounding of sums of times)
MONOTONE_TOLERANCE = 1e-9


@frozen
class ScalingPoint:
    """One GPU count of the curve."""

    gpus: int
    dp: int
    global_batch: int
    step_time_s: float
    mfu: float
    tokens_per_s_per_gpu: float
    exposed_dp_s: float
    hidden_dp_s: float
    exposed_comm_s: float
    peak_memory_bytes: float
    feasible: bool

    @classmethod
    def of(cls, report: TrainingReport) -> ScalingPoint:
        return cls(
            gpus=report.num_gpus, dp=report.parallel.dp, global_batch=report.train.global_batch,
            step_time_s=report.step_time_s, mfu=report.mfu,
            tokens_per_s_per_gpu=report.tokens_per_s_per_gpu,
            exposed_dp_s=sum(v for k, v in report.exposed_comm_s.items()
                             if k in ("dp", "dp_cp", "edp")),
            hidden_dp_s=sum(v for k, v in report.hidden_comm_s.items()
                            if k in ("dp", "dp_cp", "edp")),
            exposed_comm_s=report.exposed_comm_total_s, peak_memory_bytes=report.memory.peak_bytes,
            feasible=report.memory.feasible)

    def to_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "dp": self.dp, "global_batch": self.global_batch,
                "step_time_s": self.step_time_s, "mfu": self.mfu,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                "exposed_dp_s": self.exposed_dp_s, "hidden_dp_s": self.hidden_dp_s,
                "exposed_comm_s": self.exposed_comm_s,
                "peak_memory_gib": self.peak_memory_bytes / 2**30, "feasible": self.feasible}


@frozen
class WeakScaling:
    """The curve, smallest GPU count first.

    :param batch_per_replica: sequences per data-parallel replica per step, the same at
        every point (the per-GPU batch is fixed).
    """

    model: str
    hardware_id: str
    layout: str
    batch_per_replica: int
    points: tuple[ScalingPoint, ...]

    @property
    def monotone(self) -> bool:
        """The step time never falls as GPUs are added (each GPU does the same work, and
        the data-parallel communication only grows)."""
        steps = [p.step_time_s for p in self.points]
        return all(b >= a * (1 - MONOTONE_TOLERANCE) for a, b in pairwise(steps))

    def efficiency(self, point: ScalingPoint) -> float:
        """Weak-scaling efficiency: the smallest run's step time over this one's."""
        return self.points[0].step_time_s / point.step_time_s if point.step_time_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware_id, "layout": self.layout,
                "batch_per_replica": self.batch_per_replica, "monotone": self.monotone,
                "points": [{**p.to_json(), "efficiency": self.efficiency(p)}
                           for p in self.points]}

    def rows(self) -> list[tuple[str, ...]]:
        return [(f"{p.gpus:,}", str(p.dp), f"{p.global_batch:,}", f"{p.step_time_s:.3f}",
                 f"{p.exposed_dp_s:.3f}", f"{p.hidden_dp_s:.3f}", f"{p.mfu * 100:.1f}%",
                 f"{self.efficiency(p) * 100:.1f}%",
                 f"{p.peak_memory_bytes / 2**30:.1f}" + ("" if p.feasible else " (does not fit)"))
                for p in self.points]


COLUMNS = ("GPUs", "dp", "global batch", "step s", "exposed DP s", "hidden DP s", "MFU",
           "efficiency", "peak GiB")


def scaling_section(curve: WeakScaling) -> Section:
    """The curve as an HTML section: step time and exposed DP communication against the
    GPU count (log scale), and the table."""
    from zrt_core.reports.html import Section, _pyplot, figure_svg, table_html

    plt = _pyplot()
    gpus = [p.gpus for p in curve.points]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(gpus, [p.step_time_s for p in curve.points], marker="o", label="step time")
    ax.plot(gpus, [p.exposed_dp_s for p in curve.points], marker="s",
            label="exposed DP communication")
    ax.plot(gpus, [p.hidden_dp_s for p in curve.points], marker="^", linestyle=":",
            label="hidden DP communication")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus)
    ax.set_xticklabels([f"{g:,}" for g in gpus], fontsize=7)
    ax.set_xlabel("GPUs (same batch per GPU)")
    ax.set_ylabel("s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    body = figure_svg(fig) + table_html(COLUMNS, curve.rows())
    if not curve.monotone:
        body += "<p><b>The step time falls somewhere along the curve.</b></p>"
    return Section("Weak scaling", body)


def write_scaling_outputs(curve: WeakScaling, reports: Sequence[TrainingReport],
                          directory: Path) -> list[Path]:
    """The largest point's ``report.html`` / ``report.json`` / ``trace.json`` with the curve:
    a first section of the HTML, ``weak_scaling`` in the JSON."""
    import json

    from zrt_core.reports.files import write_training_outputs
    from zrt_core.reports.html import page
    from zrt_core.reports.training import training_sections

    report = reports[-1]
    files = write_training_outputs(report, directory)
    title = f"zrt weak scaling: {curve.model} on {curve.hardware_id}, {curve.layout}"
    subtitle = (f"{curve.batch_per_replica} sequences per data-parallel replica; the sections "
                f"after the curve are the {report.num_gpus:,}-GPU step")
    (directory / "report.html").write_text(
        page(title, [scaling_section(curve), *training_sections(report)], subtitle),
        encoding="utf-8")
    data = {**report.to_json(), "weak_scaling": curve.to_json()}
    (directory / "report.json").write_text(json.dumps(data, indent=1, default=str),
                                           encoding="utf-8")
    return files
