"""The whole-run part of the training report: time to train, GPU-hours, interruptions,
checkpoints and goodput (:class:`zrt_core.goodput.Goodput`), as rows and as HTML."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zrt_core.goodput import Goodput

GB = 1e9


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.2f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.2f} s"


def _tokens(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:,.3g}{unit}"
    return f"{n:,.0f}"


def goodput_rows(g: Goodput) -> list[tuple[str, str]]:
    """``(label, value)`` rows: the run, what it loses and the best checkpoint interval."""
    lost = g.wall_s - g.useful_s

    def share(s: float) -> str:
        return f"{_duration(s)} ({s / g.wall_s:.2%} of the run)"

    every = (f"every {g.checkpoint_every_steps:,} steps = {_duration(g.checkpoint_interval_s)}"
             f" ({'the optimum' if g.interval_source == 'optimal' else 'given'})")
    return [
        ("run", f"{g.steps:,} steps, {_tokens(g.tokens)} tokens on {g.num_gpus:,} GPUs"),
        ("time to train", f"{_duration(g.wall_s)} ({_duration(g.useful_s)} of useful steps), "
                          f"{g.gpu_hours:,.0f} GPU-hours"),
        ("goodput", f"{g.goodput:.2%} (useful / total time)"),
        ("failures", f"MTBF {g.mtbf_gpu_hours:,.0f} GPU-hours per GPU → one every "
                     f"{_duration(g.system_mtbf_s)}; {g.interruptions:,.1f} expected "
                     "interruptions"),
        ("checkpoint", f"{g.checkpoint_bytes / GB:,.1f} GB ({g.checkpoint_bytes_per_device / GB:,.2f}"
                       f" GB per device), written in {_duration(g.checkpoint_write_s)}, {every}"),
        ("time lost", f"{_duration(lost)}: checkpoints {share(g.checkpoint_lost_s)}; restarts "
                      f"{share(g.restart_lost_s)}, {_duration(g.restart_s)} each with the "
                      f"load; recomputation {share(g.recompute_lost_s)}"),
        ("best interval", f"every {g.optimal_every_steps:,} steps = "
                          f"{_duration(g.optimal_every_steps * g.step_time_s)} → goodput "
                          f"{g.optimal_goodput:.2%} (optimum {_duration(g.optimal_interval_s)};"
                          f" Young–Daly sqrt(2 C M) {_duration(g.young_daly_interval_s)})"),
    ]


def goodput_section(g: Goodput) -> Any:
    """The HTML section: the rows and where the time goes."""
    from zrt_core.reports.html import Section, breakdown_figure, table_html

    parts = {"useful steps": g.useful_s, "checkpoints": g.checkpoint_lost_s,
             "restarts": g.restart_lost_s, "recomputation": g.recompute_lost_s}
    body = (table_html(("", ""), goodput_rows(g))
            + breakdown_figure({"run": parts}, unit="s", title="where the run's time goes",
                               of="wall time")
            + "<p>Model, defaults and sources: docs/goodput.md.</p>")
    return Section("Training run: time to train and goodput", body)
