"""Two-tier training search: every layout screened in closed form (:mod:`.screen_model`),
the exact estimator on every layout the screen cannot rule out of the top-k or the front.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import evolve, frozen

from zrt_core.search.screen_model import (
    SCREENED_SCHEDULES,
    GroupModel,
    Screened,
    group_model,
    pipeline_shape,
    screen_layout,
    with_optimizer,
    with_residual,
)

#: each round estimates the undecided layouts with the highest upper bounds: 1/``BATCH_SHARE``
#: of those left, at least ``BATCH_MIN`` (a round's bookkeeping is cheap against an exact
#: estimate; smaller batches stop sooner once the k-th best is known)
BATCH_MIN = 8
BATCH_SHARE = 16

#: the anchor's virtual stages hold at least this many layers where a layout of the group
#: allows it: its per-layer times then carry no one-layer chunk's own costs, and its
#: pipeline simulation, stage schedules and optimizer are those of half as many virtual
#: stages as the deepest split's (Llama-3-70B on 1,024 H100: pp 8 × vp 5, not pp 16 × vp 5;
#: docs/search.md, "Two tiers")
ANCHOR_LAYERS_PER_STAGE = 2


@frozen
class Margins:
    """Bounds on exact ÷ screened: tokens/s per GPU in [``tput_lo``, ``tput_hi``], memory
    in [``mem_lo``, ``mem_hi``] (measured by ``benchmarks/bench_search_screen.py``)."""

    tput_lo: float
    tput_hi: float
    mem_lo: float
    mem_hi: float

    def widened(self, t: Sequence[float], m: Sequence[float]) -> Margins:
        """Also covering the observed ratios ``t`` and ``m`` (with 1% beyond them)."""
        return Margins(min([self.tput_lo, *(x * 0.99 for x in t)]),
                       max([self.tput_hi, *(x * 1.01 for x in t)]),
                       min([self.mem_lo, *(x * 0.99 for x in m)]),
                       max([self.mem_hi, *(x * 1.01 for x in m)]))

    def to_json(self) -> dict[str, float]:
        return {"tput_lo": self.tput_lo, "tput_hi": self.tput_hi, "mem_lo": self.mem_lo,
                "mem_hi": self.mem_hi}


def default_margins() -> Margins:
    """The bounds measured over the benchmark spaces (:mod:`.screen_margins`)."""
    from zrt_core.search.screen_margins import MEASURED

    return Margins(**{k: MEASURED[k] for k in ("tput_lo", "tput_hi", "mem_lo", "mem_hi")})


def anchor_key(cand: Any) -> tuple[Any, ...]:
    """Layouts whose stage times one anchor gives: the layer group. The ZeRO stages and
    FSDP share the per-layer times; the memory model sizes each sharding."""
    from zrt_core.search.evaluate import layer_group

    return layer_group(cand)


def resharded(cand: Any) -> bool:
    """FSDP re-sharding after forward (at pp 1, torchtitan's default): a gather per layer
    and micro-batch in forward and backward, on top of the compute the group's anchor
    prices. Screened as an upper bound only (:func:`two_tier`)."""
    return cand.sharding == "fsdp" and cand.parallel.pp == 1


def anchors_needed(cands: Sequence[Any]) -> int:
    return len({anchor_key(c) for c in cands})


@frozen
class ScreenResult:
    """``rows``: (candidate index, exact row) of the layouts estimated exactly;
    ``screened``: (candidate index, screened value) of every screened layout."""

    rows: list[tuple[int, dict[str, Any]]]
    screened: dict[int, Screened]
    margins: Margins
    rounds: int
    #: interrupted (Ctrl-C): the rows estimated until then
    partial: bool = False

    def summary(self, total: int) -> dict[str, Any]:
        exact = {i for i, _ in self.rows}
        # layouts never estimated exactly whose screened memory is over the device's usable
        # memory: what the memory limit removed among them (the screen's memory is the
        # exact inventory's closed form; docs/search.md gives its error)
        over = sum(1 for i, s in self.screened.items()
                   if i not in exact and s.memory_bytes > s.usable_bytes
                   and not s.memory_unsure)
        return {"screened": len(self.screened), "estimated_exactly": len(self.rows),
                "layouts": total, "memory_screened": over,
                "margins": self.margins.to_json(), "rounds": self.rounds}


def two_tier(evaluator: Any, cands: Sequence[Any], *, top_k: int,
             margins: Margins | None = None,
             progress: Callable[[int, int], None] | None = None) -> ScreenResult:
    """Screen ``cands`` (an anchor per layer group and sharding estimated exactly), then
    estimate exactly, round by round, every layout whose bounds leave it a chance of the
    top-k, of the best per GPU count or of the Pareto front; the bounds widen to cover
    every ratio the exact estimates show."""
    margins = margins or default_margins()
    exact: dict[int, dict[str, Any]] = {}
    screened: dict[int, Screened] = {}
    by_anchor: dict[tuple[Any, ...], list[int]] = {}
    for i, c in enumerate(cands):
        by_anchor.setdefault(anchor_key(c), []).append(i)
    plans: dict[str, Any] = {}
    total = len(cands)

    def estimate(i: int) -> tuple[dict[str, Any], Any]:
        row, report = evaluator.row_and_report(cands[i])
        exact[i] = row
        if progress:
            progress(len(exact), total)
        return row, report

    from zrt_core.search.collector import rare_collections

    try:
        with rare_collections():
            rounds, margins = _run(cands, by_anchor, exact, screened, estimate, evaluator,
                                   plans, margins, top_k)
    except KeyboardInterrupt:
        return ScreenResult(rows=sorted(exact.items()), screened=screened, margins=margins,
                            rounds=0, partial=True)
    return ScreenResult(rows=sorted(exact.items()), screened=screened, margins=margins,
                        rounds=rounds)


def _run(cands: Sequence[Any], by_anchor: dict[tuple[Any, ...], list[int]],
         exact: dict[int, dict[str, Any]], screened: dict[int, Screened],
         estimate: Callable[[int], tuple[dict[str, Any], Any]], evaluator: Any,
         plans: dict[str, Any], margins: Margins, top_k: int) -> tuple[int, Margins]:
    from zrt_core.search.evaluate import train_spec
    from zrt_core.transforms.training import precision_plan

    for key in sorted(by_anchor, key=str):
        idx = by_anchor[key]
        screenable = [i for i in idx if cands[i].pp_schedule in SCREENED_SCHEDULES]
        for i in idx:
            if i not in screenable:
                estimate(i)  # no closed form for this schedule: exact
        model = None
        # the anchor: the most virtual stages of two layers or more (_anchor_order)
        plain = [i for i in screenable if not resharded(cands[i])]
        for i in _anchor_order(plain or screenable, cands,
                               _num_layers(evaluator, cands[idx[0]]))[:3]:
            _, report = estimate(i)
            latest = evaluator.reuse.latest_graphs() if report is not None else None
            if latest is not None:
                fwd, bwd, inventory = latest
                templates = {k: rep for rep, t in fwd.templates.items() for k in t.indices}
                model = _anchored(group_model(report, templates, inventory,
                                              host=_host_tables(evaluator, fwd, bwd)),
                                  report, cands[i], evaluator, plans)
                break
        anchored_resharded = not plain
        for i in screenable:
            if model is None:
                if i not in exact:
                    estimate(i)  # the estimator refused every anchor: all exact
                continue
            c = cands[i]
            plan = plans.get(c.precision) or plans.setdefault(
                c.precision, precision_plan(c.precision, evaluator.hw))
            screened[i] = screen_layout(c, model, global_batch=evaluator.global_batch,
                                        seq_len=evaluator.seq_len, hw=evaluator.hw,
                                        train=train_spec(c, evaluator.global_batch,
                                                         evaluator.seq_len), plan=plan)
            if resharded(c) and not anchored_resharded:
                # the same compute with more gathers: the anchor's time bounds it from
                # below, so its throughput is an upper bound only
                screened[i] = evolve(screened[i], upper_only=True)
    rounds = 0
    table = _table(cands, screened)
    while True:
        margins = margins.widened(*_observed(exact, screened))
        todo = _undecided(cands, exact, screened, margins, top_k, table)
        if not todo:
            break
        rounds += 1
        # best first: the highest screened throughput (so upper bound) first, a batch at a
        # time; their exact values raise the k-th best and the front's sure layouts, which
        # decides most of the rest without estimating them (the same proof at the end: the
        # loop stops only when no layout is left undecided)
        todo.sort(key=lambda j: (-screened[j].tokens_per_s_per_gpu, j))
        batch = todo[:max(BATCH_MIN, len(todo) // BATCH_SHARE)]
        for i in sorted(batch, key=lambda j: (str(anchor_key(cands[j])), j)):
            estimate(i)
    return rounds, margins


def _anchor_order(idx: list[int], cands: Sequence[Any], num_layers: int | None
                  ) -> list[int]:
    """The group's anchor candidates, best first: the most virtual stages (the most
    equations for the per-layer solve) with at least :data:`ANCHOR_LAYERS_PER_STAGE`
    layers each, then the rest by most virtual stages."""
    limit = num_layers // ANCHOR_LAYERS_PER_STAGE if num_layers else None
    return sorted(idx, key=lambda j: (limit is not None and _stages(cands[j]) > limit,
                                      -_stages(cands[j])))


def _host_tables(evaluator: Any, fwd: Any, bwd: Any) -> Any:
    """The group's host launches as the anchor's estimate counted them (the eager host
    model of :meth:`~zrt_core.estimate.host.HostModel.of`, the launch tables the search's
    reuse keeps for these graphs); None where the hardware gives no launch time."""
    from zrt_core.estimate.host import HostModel
    from zrt_core.search.screen_model import HostTables

    model = HostModel.of(evaluator.hw)
    if model.launch_s <= 0.0:
        return None
    reuse = evaluator.reuse
    backends = reuse.backends(evaluator.hw, evaluator.host)
    costs = {"fwd": reuse.costs(fwd, backends), "bwd": reuse.costs(bwd, backends)}
    fwd_host, bwd_host = reuse.launch_tables(model, fwd, bwd, costs, evaluator.hw)
    return HostTables(model=model, fwd=fwd_host, bwd=bwd_host)


def _num_layers(evaluator: Any, cand: Any) -> int | None:
    """The model's decoder layers (the evaluator's dims of the capture), None where
    unknown."""
    from zrt_core.errors import ZrtError

    try:
        return evaluator.dims(cand.micro_batch, cand.precision).layers
    except ZrtError:  # no count: the anchor is the one with the most stages
        return None


def _stages(c: Any) -> int:
    return c.parallel.pp * (c.parallel.vp if c.pp_schedule == "interleaved" else 1)


def _anchored(g: GroupModel, report: Any, cand: Any, evaluator: Any,
              plans: dict[str, Any]) -> GroupModel:
    from zrt_core.search.evaluate import train_spec
    from zrt_core.transforms.training import precision_plan

    plan = plans.get(cand.precision) or plans.setdefault(
        cand.precision, precision_plan(cand.precision, evaluator.hw))
    train = train_spec(cand, evaluator.global_batch, evaluator.seq_len)

    def screen(model: GroupModel) -> Screened:
        return screen_layout(cand, model, global_batch=evaluator.global_batch,
                             seq_len=evaluator.seq_len, hw=evaluator.hw, train=train,
                             plan=plan)

    g = evolve(g, p2p_bytes=_p2p_bytes(evaluator, cand, train, plan),
               **_layer_split(evaluator, cand))
    g = with_optimizer(g, report, screen(g), cand.parallel,
                       train.zero >= 1 or train.fsdp, evaluator.hw)
    g = evolve(g, anchor_sync_s=screen(g).sync_s)
    return with_residual(g, report, screen(g), pipeline_shape(cand, evaluator.global_batch))


def _layer_split(evaluator: Any, cand: Any) -> dict[str, int]:
    """The decoder layers and the MTP modules the evaluator trains (:attr:`GroupModel.
    decoder_layers`): the stages split them as the estimator does."""
    layers = _num_layers(evaluator, cand)
    if not layers:
        return {}
    out = {"decoder_layers": layers}
    spec = evaluator.mtp_spec(evaluator.capture(cand.micro_batch, cand.precision))
    if spec is not None and spec.depths:
        out.update(mtp_depths=spec.depths, mtp_per_depth=max(1, spec.layers // spec.depths))
    return out


def _p2p_bytes(evaluator: Any, cand: Any, train: Any, plan: Any) -> float:
    """One micro-batch's activation between stages, per rank, as the estimator sizes it
    (the group's tp, cp, micro-batch and precision: every layout of the group sends it)."""
    from zrt_core.estimate.training.stages import _p2p_message_bytes

    return _p2p_message_bytes(cand.parallel, train,
                              evaluator.dims(cand.micro_batch, cand.precision), plan)


def _observed(exact: dict[int, dict[str, Any]], screened: dict[int, Screened]
              ) -> tuple[list[float], list[float]]:
    """Exact ÷ screened tokens/s and memory of the layouts both tiers priced."""
    t: list[float] = []
    m: list[float] = []
    for i, row in exact.items():
        s = screened.get(i)
        if s is None or "rejected" in row:
            continue
        if row["fits"]:  # only the layouts that fit are ranked
            ratio = row["tokens_per_s_per_gpu"] / s.tokens_per_s_per_gpu
            # an upper bound only: it may widen t_hi, never t_lo
            t.append(max(ratio, 1.0) if s.upper_only else ratio)
        if row.get("memory_gib") is not None and s.memory_bytes > 0:
            m.append(row["memory_gib"] * 2.0 ** 30 / s.memory_bytes)
    return t, m


@frozen
class _Table:
    """The screened values as arrays (fixed once every layout is screened), so each round's
    bounds are a few vector operations: candidate index, tokens/s per GPU, memory, usable
    memory, upper bound only, GPU count."""

    idx: Any
    tput: Any
    mem: Any
    usable: Any
    upper_only: Any
    gpus: Any
    mem_unsure: Any


def _table(cands: Sequence[Any], screened: dict[int, Screened]) -> _Table:
    import numpy as np

    items = list(screened.items())
    return _Table(idx=np.array([i for i, _ in items], dtype=np.int64),
                  tput=np.array([s.tokens_per_s_per_gpu for _, s in items], dtype=float),
                  mem=np.array([s.memory_bytes for _, s in items], dtype=float),
                  usable=np.array([s.usable_bytes for _, s in items], dtype=float),
                  upper_only=np.array([s.upper_only for _, s in items], dtype=bool),
                  mem_unsure=np.array([s.memory_unsure for _, s in items], dtype=bool),
                  gpus=np.array([cands[i].gpus for i, _ in items], dtype=np.int64))


def _undecided(cands: Sequence[Any], exact: dict[int, dict[str, Any]],
               screened: dict[int, Screened], mg: Margins, top_k: int,
               table: _Table | None = None) -> list[int]:
    """Screened layouts not yet estimated whose bounds could put them in the top-k, first
    per GPU count, or on the front (tokens/s per GPU against memory). ``table``:
    :func:`_table` of ``screened`` (made here when not given)."""
    import numpy as np

    tb = table if table is not None else _table(cands, screened)
    # the layouts estimated exactly that fit: their exact values, certain
    known = [(row["tokens_per_s_per_gpu"], row["memory_gib"] * 2.0 ** 30, cands[i].gpus)
             for i, row in exact.items() if "rejected" not in row and row["fits"]]
    done = np.fromiter(exact, dtype=np.int64, count=len(exact))
    # a layout whose memory is not bounded (Screened.memory_unsure) is never out on memory,
    # never certain to fit and may be the smallest: its memory's lower bound is 0
    mem_lo = np.where(tb.mem_unsure, 0.0, tb.mem * mg.mem_lo)
    open_ = ~np.isin(tb.idx, done) & (mem_lo <= tb.usable)  # else out on memory
    sure = open_ & (tb.mem * mg.mem_hi <= tb.usable) & ~tb.upper_only & ~tb.mem_unsure
    # bounds: throughput [lo, hi], memory [mem_lo, mem_hi] (each the same product as a
    # scalar would give)
    hi = tb.tput * mg.tput_hi
    low_s = (tb.tput * mg.tput_lo)[sure]
    mem_hi_s = (tb.mem * mg.mem_hi)[sure]
    # lower bounds, upper memory and GPU count of the layouts certain to fit
    lows = np.concatenate([np.array([k[0] for k in known], dtype=float), low_s])
    mems = np.concatenate([np.array([k[1] for k in known], dtype=float), mem_hi_s])
    gpus = np.concatenate([np.array([k[2] for k in known], dtype=np.int64), tb.gpus[sure]])
    kth = float(np.sort(lows)[::-1][top_k - 1]) if len(lows) >= top_k else 0.0
    best = np.zeros(len(tb.idx))  # the best sure lower bound of each layout's GPU count
    for g in np.unique(gpus).tolist():
        best[tb.gpus == g] = lows[gpus == g].max()
    keep = (hi >= kth) | (hi >= best)
    # the front: x is out if a sure layout is faster (lower bound above x's upper) and
    # smaller (its upper memory at most x's lower)
    order = np.argsort(-lows, kind="stable")
    keys = -lows[order]
    prefix_min = np.minimum.accumulate(mems[order]) if len(order) else mems
    j = np.searchsorted(keys, -hi, side="left")  # sure layouts with lower bound > hi
    beaten = np.zeros(len(tb.idx), dtype=bool)
    has = j > 0
    beaten[has] = prefix_min[j[has] - 1] < mem_lo[has]
    keep |= ~beaten
    return sorted(tb.idx[open_ & keep].tolist())
