"""The pipeline: stage times composed by the schedule (GPipe, 1F1B, interleaved, zero-bubble,
DualPipe) and the critical rank's summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from attrs import frozen

from zrt_core.schedule.pipeline import (
    PipelineResult,
    StageTimes,
    simulate,
    stage_rank,
)

if TYPE_CHECKING:
    pass


# -- pipeline ---------------------------------------------------------------------------------


@frozen
class _PipelineSummary:
    total_s: float
    critical_rank: int
    busy_s: tuple[float, ...]
    p2p_exposed_s: tuple[float, ...]
    bubble_s: tuple[float, ...]
    peak_inflight: tuple[int, ...]
    peak_activation_bytes: tuple[float, ...]
    # per rank: seconds from its last operation's end to the step's end, and per virtual
    # stage on the rank, seconds from its last backward's start to the step's end
    end_before_total_s: tuple[float, ...]
    last_backward_before_total_s: Mapping[int, float]
    result: PipelineResult | None


def _pipeline(schedule: str, times: StageTimes, pp: int, vp: int, m: int,
              p2p: Sequence[float], wrap: float) -> _PipelineSummary:
    """Simulate the schedule (exactly, however long: the simulation skips repeated steady
    states itself) and summarise what the step composition needs."""
    r = simulate(schedule, times, pp=pp, vp=vp, microbatches=m, p2p_s=p2p, p2p_wrap_s=wrap)
    return _summarise(r)


def _summarise(r: PipelineResult) -> _PipelineSummary:
    end_before = [r.total_s - e for e in r.rank_end_s]
    last_bwd = {v: r.total_s - s for v, s in r.last_backward_start_s.items()}
    return _PipelineSummary(
        total_s=r.total_s, critical_rank=r.critical_rank,
        busy_s=tuple(s.busy_s for s in r.ranks),
        p2p_exposed_s=tuple(s.exposed_p2p_s for s in r.ranks),
        bubble_s=tuple(s.bubble_s for s in r.ranks),
        peak_inflight=tuple(s.peak_inflight for s in r.ranks),
        peak_activation_bytes=tuple(s.peak_activation_bytes or 0.0 for s in r.ranks),
        end_before_total_s=tuple(end_before), last_backward_before_total_s=last_bwd,
        result=r)


def _rank_stages(schedule: str, pp: int, vp: int, m: int, n_stages: int
                 ) -> list[list[tuple[int, float]]]:
    """Per rank: (stage-report index, micro-batches it runs) for every stage it holds."""
    out: list[list[tuple[int, float]]] = [[] for _ in range(pp)]
    if schedule == "dualpipe":
        for r in range(pp):
            out[r] = [(r, m / 2), (pp - 1 - r, m / 2)]
        return out
    for v in range(n_stages):
        out[stage_rank(schedule, pp, vp, v)].append((v, float(m)))
    return out
