"""Timelines: where each costed node ran on one device's streams, and what was exposed.

A :class:`Region` is one scheduled piece of a graph (a layer template's nodes, or the nodes
before or after the layers), times relative to its own start. A :class:`Timeline` is a
sequence of regions placed one after another on one device: a layer template's region
appears once per layer it stands for without copying its events, so a 61-layer model holds
two layer regions, not 61. Communication that frameworks carry across layers (bucketed
gradient reduction, prefetched parameter gathers) is re-timed when regions are composed;
see ``docs/overlap-rules.md``.

Accounting, per timeline: ``makespan_s == compute_s + exposed_comm_total_s + idle_s``.
Exposed communication is communication time during which the device computes nothing;
when several groups are exposed at once the time is split evenly among them. The rest of a
group's stream time is hidden (under compute, or under another group's exposed time).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from attrs import evolve, field, frozen

from zrt_core.errors import SpecError

COMPUTE = "compute"
COMM_PREFIX = "comm."

# Communication modes (see docs/overlap-rules.md). A region waits for SYNC, ASYNC and
# PIPELINED collectives through its dependencies; DEFERRED and NEXT_STEP ones are off its
# critical path; PREFETCH ones are issued during the previous region, ahead of what that
# region defers; PREFETCH_BEHIND ones likewise, but queued behind what it defers (an engine
# that waits for its earlier communication before it issues a gather).
SYNC, ASYNC, PIPELINED, DEFERRED, PREFETCH, NEXT_STEP, PREFETCH_BEHIND = (
    "sync", "async", "pipelined", "deferred", "prefetch", "next_step", "prefetch_behind")
MODES = (SYNC, ASYNC, PIPELINED, DEFERRED, PREFETCH, NEXT_STEP, PREFETCH_BEHIND)
PREFETCHED = frozenset({PREFETCH, PREFETCH_BEHIND})
CARRIED = frozenset({DEFERRED, PREFETCH, NEXT_STEP, PREFETCH_BEHIND})


def comm_stream(group: str) -> str:
    return COMM_PREFIX + group


def stream_group(stream: str) -> str | None:
    """``"comm.tp"`` → ``"tp"``; the compute stream has no group."""
    return stream[len(COMM_PREFIX):] if stream.startswith(COMM_PREFIX) else None


def _shallow_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A dict is copied and frozen; any other mapping is taken as read-only already (the
    scheduler passes one that builds its items when first read)."""
    if value is None or isinstance(value, dict):
        return MappingProxyType(dict(value or {}))
    return value


@frozen
class Event:
    """One node's execution on one stream.

    :param stream: ``"compute"`` or ``"comm.<group>"``.
    :param mode: for communication, how it overlaps (one of :data:`MODES`); "" for compute.
    :param args: what a trace shows beside it (op, flops, bytes, the cost rule...).
    """

    name: str
    node_id: int | None
    stream: str
    start_s: float
    end_s: float
    category: str
    layer_index: int | None = None
    phase: str | None = None
    mode: str = ""
    args: Mapping[str, Any] = field(factory=dict, converter=_shallow_mapping)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def group(self) -> str | None:
        return stream_group(self.stream)

    def shifted(self, dt_s: float, layer_index: int | None = None) -> Event:
        """The event moved by ``dt_s`` (and relabelled to ``layer_index`` when given)."""
        return self.placed(self.start_s + dt_s, self.end_s + dt_s, layer_index)

    def placed(self, start_s: float, end_s: float, layer_index: int | None = None) -> Event:
        """The event from ``start_s`` to ``end_s`` (relabelled to ``layer_index`` when
        given): ``evolve`` without its per-call field lookup (the scheduler places tens of
        thousands of events per search)."""
        return Event(self.name, self.node_id, self.stream, start_s, end_s, self.category,
                     self.layer_index if layer_index is None else layer_index, self.phase,
                     self.mode, self.args)


def _merge(intervals: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The union of intervals given sorted by start, as disjoint sorted intervals."""
    out: list[list[float]] = []
    for a, b in intervals:
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def exposure(events: Iterable[Event], *, busy_intervals: Sequence[tuple[float, float]] = ()
             ) -> tuple[dict[str, float], dict[str, float], float]:
    """Split each group's communication into exposed and hidden time.

    Exposed: the group's stream is busy and no compute runs (nor anything in
    ``busy_intervals``, used for carried communication under other regions); time exposed
    for several groups at once is split evenly. Returns ``(exposed, hidden, compute_s)``
    where ``compute_s`` is the measure of the compute stream's busy time (0 when
    ``busy_intervals`` are given).

    A sweep over every start and end: between two consecutive times each stream is active
    or not (counts of starts minus ends so far), and the interval's length goes to the
    groups as above.
    """
    keys: dict[str, int] = {COMPUTE: 0}
    times: list[float] = []
    key_of: list[int] = []
    delta: list[int] = []
    for e in events:
        if e.end_s > e.start_s:
            k = keys.setdefault(e.stream, len(keys))
            times += (e.start_s, e.end_s)
            key_of += (k, k)
            delta += (1, -1)
    for lo, hi in busy_intervals:
        if hi > lo:
            times += (lo, hi)
            key_of += (0, 0)
            delta += (1, -1)
    streams = [k for k in keys if k != COMPUTE]
    if not times:
        return {}, {}, 0.0
    t = np.asarray(times)
    order = np.lexsort((np.asarray(delta), t))     # by time, ends before starts
    t = t[order]
    change = np.zeros((len(keys), len(t)))
    change[np.asarray(key_of)[order], np.arange(len(t))] = np.asarray(delta, dtype=float)[order]
    active = np.cumsum(change, axis=1)[:, :-1] > 0.5   # during [t_i, t_{i+1})
    dt = np.diff(t)
    computing = active[0]
    comm = active[1:]
    count = comm.sum(axis=0)
    alone = ~computing & (count > 0)
    share = np.where(alone, dt / np.maximum(count, 1), 0.0)
    busy = comm @ dt
    exposed_v = comm @ share
    exposed = {stream_group(s) or s: float(exposed_v[i]) for i, s in enumerate(streams)}
    hidden = {stream_group(s) or s: float(busy[i] - exposed_v[i]) for i, s in enumerate(streams)}
    compute = 0.0 if busy_intervals else float(dt[computing].sum())
    return exposed, hidden, compute


@frozen(eq=False)
class Region:
    """One scheduled region, times relative to its start.

    :param body: events on the region's critical path (compute, and communication it
        waits for), sorted by start.
    :param carried: DEFERRED and NEXT_STEP communication, as placed in isolation.
    :param prefetch: PREFETCH communication as ``(stream, duration)``, in issue order.
    :param body_s: when the last body event ends: where the next region may start.
    :param busy_intervals: the union of the body's events, merged.
    :param compute_by_category: the compute stream's busy time per op category (sums to
        ``compute_s``: one compute stream runs one kernel at a time).
    """

    name: str
    body: tuple[Event, ...]
    carried: tuple[Event, ...]
    prefetch: tuple[Event, ...]
    body_s: float
    compute_s: float
    stream_busy_s: Mapping[str, float]
    exposed_comm_s: Mapping[str, float]
    hidden_comm_s: Mapping[str, float]
    busy_intervals: tuple[tuple[float, float], ...]
    compute_by_category: Mapping[str, float] = field(factory=dict, converter=MappingProxyType)

    @classmethod
    def from_events(cls, name: str, events: Iterable[Event]) -> Region:
        """Split events by mode and account the body (see the module docstring)."""
        body, carried, prefetch = [], [], []
        for e in events:
            if e.mode in PREFETCHED:
                prefetch.append(e)
            elif e.mode in CARRIED:
                carried.append(e)
            else:
                body.append(e)
        body.sort(key=lambda e: (e.start_s, e.end_s))
        busy: dict[str, float] = defaultdict(float)
        by_category: dict[str, float] = defaultdict(float)
        for e in body:
            busy[e.stream] += e.duration_s
            if e.stream == COMPUTE:
                by_category[e.category] += e.duration_s
        exposed, hidden, compute = exposure(body)
        return cls(
            name=name, body=tuple(body), carried=tuple(carried), prefetch=tuple(prefetch),
            body_s=max((e.end_s for e in body), default=0.0), compute_s=compute,
            stream_busy_s=MappingProxyType(dict(busy)),
            exposed_comm_s=MappingProxyType(exposed), hidden_comm_s=MappingProxyType(hidden),
            busy_intervals=_merge((e.start_s, e.end_s) for e in body),
            compute_by_category=dict(by_category))


@frozen(eq=False)
class Placement:
    """A region placed at ``offset_s``; its layer events are relabelled ``layer_index``."""

    region: Region
    offset_s: float
    layer_index: int | None = None


@frozen(eq=False)
class Timeline:
    """Regions placed in order on one device, with the carried communication re-timed.

    Build one with :meth:`compose` (or :meth:`of` for a single region); :meth:`concat`,
    :meth:`repeat` and :meth:`shift` give new timelines.
    """

    placements: tuple[Placement, ...]
    carried: tuple[Event, ...]
    makespan_s: float
    compute_s: float
    stream_busy_s: Mapping[str, float]
    exposed_comm_s: Mapping[str, float]
    hidden_comm_s: Mapping[str, float]
    start_s: float = 0.0
    parts: tuple[tuple[Region, int | None], ...] = ()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def of(cls, region: Region, layer_index: int | None = None) -> Timeline:
        return cls.compose([(region, layer_index)])

    @classmethod
    def compose(cls, parts: Iterable[tuple[Region, int | None] | Region]) -> Timeline:
        """Place regions one after another, re-timing the communication they carry.

        Region k starts when region k-1's body ends and its own prefetched collectives have
        arrived; those are issued (in order, on their streams) when region k-1 starts, or
        at time 0 for the first region — the one-layer-ahead prefetch of ZeRO-3/FSDP.
        Deferred collectives (bucketed gradient reduction) start at their offset in their
        region or when their stream frees, whichever is later; whatever runs past the last
        body is the exposed tail.

        A stream serves its collectives in issue order: region k's prefetched gathers
        (PREFETCH) are issued when region k-1 starts, before anything region k-1 defers
        (its gradient reduce-scatter is issued when its backward produces the gradients),
        so they take the stream first. FSDP2 issues the next layer's unshard in the
        pre-backward hook, ahead of the layer's own ``post_backward`` reduce-scatter
        (``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``), and Megatron-FSDP
        prefetches the next bucket's all-gather before the current one's gradients are
        reduced (``megatron_fsdp.py``: ``side_stream_for_param_gather`` beside the
        reduce-scatter's ``side_stream_for_buffer_copy_and_grad_accum``). PREFETCH_BEHIND
        gathers queue behind region k-1's deferred collectives instead: DeepSpeed's ZeRO-3
        of early 2021, whose every all-gather first waited for the communication before it
        (``torch.cuda.synchronize()``, deepspeedai/DeepSpeed PR #1188).
        """
        items = [(p, None) if isinstance(p, Region) else p for p in parts]
        stream_free: dict[str, float] = defaultdict(float)
        placements: list[Placement] = []
        carried: list[Event] = []
        # the previous region's deferred collectives, issued after this region's prefetch
        pending: list[tuple[Event, float, int | None]] = []

        def place_pending() -> None:
            for e, offset_s, at_layer in pending:
                start = max(offset_s + e.start_s, stream_free[e.stream])
                end = start + e.duration_s
                stream_free[e.stream] = end
                carried.append(e.placed(start, end, at_layer))
            pending.clear()

        def place_gathers(events: Iterable[Event], issue: float, layer: int | None) -> float:
            """Place prefetched gathers issued at ``issue``; when the last one arrives."""
            arrived = 0.0
            for e in events:
                start = max(issue, stream_free[e.stream])
                end = start + e.duration_s
                stream_free[e.stream] = end
                carried.append(e.placed(start, end, layer))
                arrived = max(arrived, end)
            return arrived

        previous_start = previous_end = 0.0
        for region, layer in items:
            ahead = [e for e in region.prefetch if e.mode != PREFETCH_BEHIND]
            behind = [e for e in region.prefetch if e.mode == PREFETCH_BEHIND]
            ready = max(previous_end, place_gathers(ahead, previous_start, layer))
            place_pending()
            ready = max(ready, place_gathers(behind, previous_start, layer))
            offset = ready
            pending.extend((e, offset, layer) for e in region.carried)
            placements.append(Placement(region, offset, layer))
            previous_start, previous_end = offset, offset + region.body_s
        place_pending()

        makespan = max([previous_end, *(e.end_s for e in carried)], default=0.0)
        busy: dict[str, float] = defaultdict(float)
        exposed: dict[str, float] = defaultdict(float)
        hidden: dict[str, float] = defaultdict(float)
        compute = 0.0
        for p in placements:
            r = p.region
            compute += r.compute_s
            for table, source in ((busy, r.stream_busy_s), (exposed, r.exposed_comm_s),
                                  (hidden, r.hidden_comm_s)):
                for k, v in source.items():
                    table[k] += v
        if carried:
            for e in carried:
                busy[e.stream] += e.duration_s
            exposed_c, hidden_c = _carried_exposure(carried, placements)
            for k, v in exposed_c.items():
                exposed[k] += v
            for k, v in hidden_c.items():
                hidden[k] += v
        return cls(
            placements=tuple(placements), carried=tuple(carried), makespan_s=makespan,
            compute_s=compute, stream_busy_s=MappingProxyType(dict(busy)),
            exposed_comm_s=MappingProxyType(dict(exposed)),
            hidden_comm_s=MappingProxyType(dict(hidden)), parts=tuple(items))

    def concat(self, *others: Timeline) -> Timeline:
        """This timeline followed by ``others``, carried communication flowing across."""
        parts = list(self.parts)
        for o in others:
            parts.extend(o.parts)
        return Timeline.compose(parts).shift(self.start_s)

    def repeat(self, count: int, layer_indices: Sequence[int] | None = None) -> Timeline:
        """The timeline ``count`` times in a row; with ``layer_indices`` (one per copy), a
        single-region timeline's copies are relabelled to those layers — a layer template
        repeated over the layers it stands for."""
        if count < 1:
            raise SpecError(f"repeat count must be ≥ 1, got {count}")
        if layer_indices is not None:
            if len(layer_indices) != count:
                raise SpecError(f"{len(layer_indices)} layer indices for {count} copies",
                                "give one layer index per copy")
            if len(self.parts) != 1:
                raise SpecError("only a single-region timeline can be relabelled per layer",
                                "repeat the layer region's timeline, then concat")
            region = self.parts[0][0]
            return Timeline.compose([(region, i) for i in layer_indices]).shift(self.start_s)
        return Timeline.compose(list(self.parts) * count).shift(self.start_s)

    def shift(self, dt_s: float) -> Timeline:
        """Everything moved later by ``dt_s``; the time before it counts as idle."""
        if not dt_s:
            return self
        return evolve(
            self, start_s=self.start_s + dt_s, makespan_s=self.makespan_s + dt_s,
            placements=tuple(evolve(p, offset_s=p.offset_s + dt_s) for p in self.placements),
            carried=tuple(e.shifted(dt_s) for e in self.carried))

    # -- reading ------------------------------------------------------------------------

    @property
    def exposed_comm_total_s(self) -> float:
        return sum(self.exposed_comm_s.values())

    @property
    def hidden_comm_total_s(self) -> float:
        return sum(self.hidden_comm_s.values())

    @property
    def idle_s(self) -> float:
        """Time nothing runs: ``makespan - compute - exposed communication``."""
        return self.makespan_s - self.compute_s - self.exposed_comm_total_s

    def compute_by_category(self) -> dict[str, float]:
        """The compute stream's busy time per op category; sums to ``compute_s``."""
        out: dict[str, float] = defaultdict(float)
        for p in self.placements:
            for k, v in p.region.compute_by_category.items():
                out[k] += v
        return dict(out)

    def compute_by_layer(self) -> dict[int | None, float]:
        """The compute stream's busy time per placed layer index (``None``: regions outside
        the decoder layers); sums to ``compute_s``."""
        out: dict[int | None, float] = defaultdict(float)
        for p in self.placements:
            out[p.layer_index] += p.region.compute_s
        return dict(out)

    @property
    def num_events(self) -> int:
        return sum(len(p.region.body) for p in self.placements) + len(self.carried)

    def iter_events(self) -> Iterator[Event]:
        """Every event in time order of regions: each region's body, shifted and
        relabelled, then the carried communication."""
        for p in self.placements:
            if p.offset_s == 0.0 and p.layer_index is None:
                yield from p.region.body
            else:
                for e in p.region.body:
                    yield e.shifted(p.offset_s, p.layer_index if e.layer_index is not None
                                    else None)
        yield from self.carried

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self.iter_events())

    def summary(self) -> dict[str, Any]:
        """Plain numbers for reports and JSON."""
        return {
            "makespan_s": self.makespan_s,
            "compute_s": self.compute_s,
            "exposed_comm_s": dict(self.exposed_comm_s),
            "hidden_comm_s": dict(self.hidden_comm_s),
            "idle_s": self.idle_s,
            "stream_busy_s": dict(self.stream_busy_s),
        }


def _carried_exposure(carried: Sequence[Event], placements: Sequence[Placement]
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """Carried communication is exposed only where no region's body runs.

    NEXT_STEP collectives run under the next training step's forward: always hidden.
    """
    counted = [e for e in carried if e.mode != NEXT_STEP]
    hidden_next: dict[str, float] = defaultdict(float)
    for e in carried:
        if e.mode == NEXT_STEP:
            hidden_next[e.group or e.stream] += e.duration_s
    if not counted:
        return dict.fromkeys(hidden_next, 0.0), dict(hidden_next)
    lo = min(e.start_s for e in counted)
    hi = max(e.end_s for e in counted)
    starts = [p.offset_s for p in placements]
    first = max(bisect.bisect_right(starts, lo) - 1, 0)
    busy: list[tuple[float, float]] = []
    for p in placements[first:]:
        if p.offset_s > hi:
            break
        busy.extend((p.offset_s + a, p.offset_s + b) for a, b in p.region.busy_intervals)
    exposed, hidden, _ = exposure(counted, busy_intervals=busy)
    for k, v in hidden_next.items():
        hidden[k] = hidden.get(k, 0.0) + v
        exposed.setdefault(k, 0.0)
    return exposed, hidden
