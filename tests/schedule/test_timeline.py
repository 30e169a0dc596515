"""Timeline values: exposure accounting, composition helpers and event expansion."""

from __future__ import annotations

import pytest

from zrt_core.errors import SpecError
from zrt_core.schedule.timeline import (
    DEFERRED,
    PREFETCH,
    PREFETCH_BEHIND,
    SYNC,
    Event,
    Region,
    Timeline,
    exposure,
)


def ev(name: str, stream: str, start: float, end: float, *, mode: str = "",
       layer: int | None = None) -> Event:
    return Event(name=name, node_id=None, stream=stream, start_s=start, end_s=end,
                 category="collective" if stream != "compute" else "matmul",
                 layer_index=layer, mode=mode)


def test_exposure_splits_concurrent_groups_evenly() -> None:
    # compute 0-2; tp 1-4; ep 3-5.
    # tp: 1-2 under compute (hidden 1); 2-3 alone (exposed 1); 3-4 with ep (0.5 each).
    # ep: 3-4 shared (exposed 0.5, hidden 0.5); 4-5 alone (exposed 1).
    exposed, hidden, compute = exposure([
        ev("mm", "compute", 0, 2), ev("ar", "comm.tp", 1, 4, mode=SYNC),
        ev("a2a", "comm.ep", 3, 5, mode=SYNC)])
    assert compute == 2.0
    assert exposed == {"tp": 1.5, "ep": 1.5}
    assert hidden == {"tp": 1.5, "ep": 0.5}


def test_region_accounting_and_identity() -> None:
    region = Region.from_events("r", [
        ev("mm", "compute", 0, 2), ev("ar", "comm.tp", 2, 3, mode=SYNC),
        ev("mm", "compute", 3, 4), ev("rs", "comm.dp", 2, 6, mode=DEFERRED)])
    assert region.body_s == 4.0           # the deferred reduce-scatter is not on its path
    assert region.compute_s == 3.0
    assert [e.name for e in region.carried] == ["rs"]
    assert region.busy_intervals == ((0.0, 4.0),)
    tl = Timeline.of(region)
    # the reduce-scatter runs to 6: 4-6 exposed, 2-4 hidden (under the body)
    assert tl.makespan_s == 6.0
    assert dict(tl.exposed_comm_s) == {"tp": 1.0, "dp": 2.0}
    assert dict(tl.hidden_comm_s) == {"tp": 0.0, "dp": 2.0}
    assert tl.idle_s == 0.0


def layer_region(layer: int = 0) -> Region:
    return Region.from_events("layer", [ev("mm", "compute", 0, 3, layer=layer),
                                        ev("ar", "comm.tp", 3, 4, mode=SYNC, layer=layer)])


def test_repeat_relabels_layers_and_shares_events() -> None:
    one = Timeline.of(layer_region())
    tl = one.repeat(3, layer_indices=[5, 6, 7])
    assert tl.makespan_s == 12.0
    assert tl.compute_s == 9.0
    assert dict(tl.exposed_comm_s) == {"tp": 3.0}
    assert [(e.name, e.layer_index, e.start_s) for e in tl.events] == [
        ("mm", 5, 0.0), ("ar", 5, 3.0), ("mm", 6, 4.0), ("ar", 6, 7.0), ("mm", 7, 8.0),
        ("ar", 7, 11.0)]
    # three placements of the one region: its events are not copied
    assert {id(p.region) for p in tl.placements} == {id(one.placements[0].region)}
    assert one.repeat(2).makespan_s == 8.0
    with pytest.raises(SpecError, match="one layer index per copy"):
        one.repeat(2, layer_indices=[1])
    with pytest.raises(SpecError, match="must be ≥ 1"):
        one.repeat(0)


def test_compute_is_split_by_category_and_by_layer() -> None:
    norm = Event(name="rms", node_id=None, stream="compute", start_s=3.0, end_s=3.5,
                 category="norm")
    region = Region.from_events("layer", [ev("mm", "compute", 0, 3), norm,
                                          ev("ar", "comm.tp", 3.5, 4, mode=SYNC)])
    # compute events only: matmul 0-3 (3 s) and norm 3-3.5 (0.5 s); the all-reduce is not
    assert dict(region.compute_by_category) == {"matmul": 3.0, "norm": 0.5}
    head = Region.from_events("head", [ev("mm", "compute", 0, 2)])
    tl = Timeline.compose([(region, 4), (region, 5), (head, None)])
    # two layers of 3.5 s each and the head's 2 s: matmul 3 + 3 + 2, norm 0.5 + 0.5
    assert tl.compute_by_category() == {"matmul": 8.0, "norm": 1.0}
    assert tl.compute_by_layer() == {4: 3.5, 5: 3.5, None: 2.0}
    assert sum(tl.compute_by_category().values()) == tl.compute_s == 9.0


def test_concat_carries_deferred_communication_across() -> None:
    # Layer A: compute 0-1 then a 3 s deferred reduce-scatter from 1; layer B: compute 2 s.
    a = Region.from_events("a", [ev("g", "compute", 0, 1),
                                 ev("rs", "comm.dp", 1, 4, mode=DEFERRED)])
    b = Region.from_events("b", [ev("g", "compute", 0, 2)])
    tl = Timeline.of(a).concat(Timeline.of(b))
    # B starts at 1 (A's body end): 1-3; the reduce-scatter 1-4 is hidden 1-3, exposed 3-4.
    assert tl.makespan_s == 4.0
    assert dict(tl.exposed_comm_s) == {"dp": 1.0}
    assert dict(tl.hidden_comm_s) == {"dp": 2.0}


def test_prefetch_is_issued_during_the_previous_region() -> None:
    prefetching = Region.from_events("l", [ev("ag", "comm.dp", 0, 2, mode=PREFETCH),
                                           ev("mm", "compute", 0, 3)])
    tl = Timeline.compose([(prefetching, 0), (prefetching, 1)])
    # gather 0 at 0-2, layer 0 at 2-5; gather 1 issued at 2: 2-4, layer 1 at 5-8.
    assert [p.offset_s for p in tl.placements] == [2.0, 5.0]
    assert [(e.start_s, e.end_s, e.layer_index) for e in tl.carried] == [
        (0.0, 2.0, 0), (2.0, 4.0, 1)]
    assert tl.makespan_s == 8.0


def _backward_layer(gather_mode: str) -> Region:
    # a backward layer: the next layer's gather (2) prefetched, its own compute (4), its
    # gradient reduce-scatter (3) deferred from the end of the compute, on the same stream
    return Region.from_events("l", [ev("ag", "comm.dp", 0, 2, mode=gather_mode),
                                    ev("mm", "compute", 0, 4),
                                    ev("rs", "comm.dp", 4, 7, mode=DEFERRED)])


def test_prefetched_gather_takes_the_stream_before_the_previous_reduce_scatter() -> None:
    tl = Timeline.compose([(_backward_layer(PREFETCH), i) for i in range(3)])
    # gather 0 at 0-2, layer 0 at 2-6. Gather 1 is issued when layer 0 starts (2), before
    # layer 0's reduce-scatter (issued at 6): 2-4; the reduce-scatter 6-9; layer 1 at 6-10.
    # Gather 2 (issued at 6) waits for the stream: 9-11; reduce-scatter 1 11-14; layer 2
    # at 11-15; reduce-scatter 2 15-18 is the exposed tail.
    assert [p.offset_s for p in tl.placements] == [2.0, 6.0, 11.0]
    assert [(e.name, e.start_s, e.end_s) for e in tl.carried] == [
        ("ag", 0.0, 2.0), ("ag", 2.0, 4.0), ("rs", 6.0, 9.0), ("ag", 9.0, 11.0),
        ("rs", 11.0, 14.0), ("rs", 15.0, 18.0)]
    assert tl.makespan_s == 18.0


def test_gather_behind_the_reduce_scatter_waits_for_it() -> None:
    tl = Timeline.compose([(_backward_layer(PREFETCH_BEHIND), i) for i in range(3)])
    # DeepSpeed's 2021 ZeRO-3: gather 1 queues behind layer 0's reduce-scatter (6-9): 9-11,
    # layer 1 at 11-15; its reduce-scatter 15-18, gather 2 18-20, layer 2 at 20-24,
    # reduce-scatter 2 24-27.
    assert [p.offset_s for p in tl.placements] == [2.0, 11.0, 20.0]
    assert tl.makespan_s == 27.0


def test_shift_moves_everything_and_counts_the_gap_as_idle() -> None:
    tl = Timeline.of(layer_region()).shift(2.0)
    assert tl.makespan_s == 6.0
    assert tl.idle_s == 2.0
    assert [e.start_s for e in tl.events] == [2.0, 5.0]
    assert tl.shift(0.0) is tl


def test_summary_is_plain_numbers() -> None:
    s = Timeline.of(layer_region()).summary()
    assert s == {"makespan_s": 4.0, "compute_s": 3.0, "exposed_comm_s": {"tp": 1.0},
                 "hidden_comm_s": {"tp": 0.0}, "idle_s": 0.0,
                 "stream_busy_s": {"compute": 3.0, "comm.tp": 1.0}}
