"""The screen's closed form (docs/search.md, "Two tiers"): per layer group, per-layer stage
times and activation bytes solved from one exactly estimated anchor layout; per layout, the
stage times, the pipeline schedule's closed form, the gradient sync, optimizer and memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from attrs import field, frozen

from zrt_core.fsdp import sharding_plan
from zrt_core.ir.graph import dtype_bytes
from zrt_core.transforms.training import dp_groups, grad_dtype

#: Schedules the screen has a closed form for; a layout with another goes to the exact tier.
SCREENED_SCHEDULES = ("1f1b", "gpipe", "interleaved")

#: Adam's fp32 master weights and two moments per element (the optimizer's default).
STATE_BYTES_DEFAULT = 12


@frozen
class HostTables:
    """A group's host launches: the host model and, per representative layer (None: the
    outside-layers part), the forward's :class:`~zrt_core.estimate.host.LayerHost` and the
    backward's (launches, GPU seconds)."""

    model: Any
    fwd: dict[Any, Any]
    bwd: dict[Any, tuple[int, float]]


@frozen
class GroupModel:
    """What one layer group's layouts share, per sharding family (``zero`` or ``fsdp``):
    ``fwd_s``/``bwd_s``/``act_bytes``: per template representative (one layer) and the
    outer ``embedding``/``head`` parts of a stage, solved from the anchor's stage reports;
    ``transient_bytes``: per key (as ``fwd_s``), the smallest transient of an anchor stage
    holding it (a stage's transient is the largest of its keys': :func:`group_model`);
    ``p2p_s``: one
    point-to-point message; ``dp_exposed_s``: the anchor's exposed data-parallel
    communication; ``opt_s_per_element``: optimizer seconds per sharded element on the
    worst rank; ``templates``: layer index → representative; ``inventory``: the per-device
    parameter inventory (ZeRO and FSDP do not change it)."""

    fwd_s: dict[Any, float]
    bwd_s: dict[Any, float]
    act_bytes: dict[Any, float]
    transient_bytes: dict[Any, float]
    p2p_s: float
    dp_exposed_s: float
    opt_s_per_element: float
    templates: dict[int, int]
    inventory: Any
    num_layers: int
    #: data-parallel communication seconds per parameter element on the anchor's worst rank
    #: (gradient sync and parameter gathers together)
    dp_s_per_element: float = 0.0
    #: gradient-sync seconds per parameter element and per second of ``dp_sync`` priced on
    #: a layout's groups (:func:`_sync_s`; on the anchor, its own per-element sync time)
    sync_s_per_element: float = 0.0
    #: the anchor's exact step minus its closed form, its pipeline's part aside
    #: (:func:`with_residual`)
    residual_s: float = 0.0
    #: the anchor's simulated pipeline minus its pipeline closed form, and the shape it
    #: holds for: (schedule, pp, vp, micro-batches); layouts of another shape have their
    #: own closed form's error, not the anchor's
    pipeline_residual_s: float = 0.0
    anchor_shape: tuple[Any, ...] | None = None
    #: the anchor's gradient sync on its rank with the most parameters (:attr:`Screened.sync_s`)
    anchor_sync_s: float = 0.0
    #: the anchor's gradient reductions (one micro-batch's backward over the whole model,
    #: the report's collective table): (group, kind, calls, bytes) per entry; a layout's
    #: per-element sync time is the anchor's scaled by these collectives priced on its own
    #: groups (:func:`_sync_scale`); empty: the anchor's per-element time as it is
    dp_sync: tuple[tuple[str, str, int, float], ...] = ()
    #: the group's host launches (:class:`HostTables`): a stage waits for what its
    #: launches take beyond its device time, per stage as the estimator's
    #: :func:`zrt_core.estimate.host.exposed_host_s` (not linear in the layers: a stage
    #: with a device-heavy end hides more of its launches); ``fwd_s``/``bwd_s`` are then
    #: device times. None: the host's time stays in the per-layer solve
    host: Any = None
    #: the decoder layers and the MTP modules trained after them (depths, captured layers
    #: per depth): the stages split them as the estimator does (:func:`stage_ranges`);
    #: 0 decoder layers: ``num_layers`` split evenly
    decoder_layers: int = 0
    mtp_depths: int = 0
    mtp_per_depth: int = 1
    #: one micro-batch's activation (or its gradient) one rank sends to the next stage:
    #: with it each layout's P2P is priced per boundary on its own ranks (:func:`_p2p_chain_s`);
    #: 0: the anchor's slowest boundary for every hop
    p2p_bytes: float = 0.0
    #: per stage split, what :func:`_geometry` derives from the tables and the inventory
    #: (shared by the copies :func:`with_optimizer`/:func:`with_residual` make: they keep
    #: those fields; keyed on the tables' identity besides)
    memo: dict[Any, Any] = field(factory=dict, eq=False, repr=False)


def _solve(rows: Sequence[dict[Any, float]], values: Sequence[float],
           keys: Sequence[Any]) -> dict[Any, float]:
    """Least squares: each stage's value = Σ count × per-key value (numpy's minimum-norm
    solution where the stages do not separate the keys: it reproduces every anchor stage)."""
    import numpy as np

    a = np.array([[r.get(k, 0.0) for k in keys] for r in rows], dtype=float)
    x = np.linalg.lstsq(a, np.array(values, dtype=float), rcond=None)[0]
    return {k: float(v) for k, v in zip(keys, x, strict=True)}


def group_model(report: Any, templates: dict[int, int], inventory: Any,
                host: HostTables | None = None) -> GroupModel:
    """Solve the per-layer quantities from an exact ``report`` (a ``TrainingReport``); the
    optimizer's seconds per element are set by :func:`with_optimizer`. With ``host``
    (:attr:`GroupModel.host`) each anchor stage's host wait is taken out of its forward
    and backward before the solve, and :func:`_geometry` adds it per stage again."""
    num_layers = max(s.layers[1] for s in report.stages)
    rows: list[dict[Any, float]] = []
    transient: dict[Any, float] = {}
    for s in report.stages:
        counts: dict[Any, float] = {}
        for i in range(*s.layers):
            if i < num_layers:
                rep = templates.get(i, i)
                counts[rep] = counts.get(rep, 0.0) + 1.0
        if s.first:
            counts["embedding"] = 1.0
        if s.last:
            counts["head"] = 1.0
        rows.append(counts)
        # the estimator's stage transient is the largest of its keys' (stages.py: layer
        # templates, the head on the last, the embedding on the first), so a key's own is at
        # most the smallest transient of a stage that holds it (equal for a stage of one
        # layer; the embedding's and head's stages also hold the first and last layer,
        # which every stage holding them holds too)
        for k in counts:
            transient[k] = min(transient.get(k, s.transient_bytes), s.transient_bytes)
    keys = sorted({k for r in rows for k in r}, key=str)
    on = host is not None
    fwd = _solve(rows, [s.forward_s - (s.host_forward_s if on else 0.0)
                        for s in report.stages], keys)
    bwd = _solve(rows, [s.backward_s - (s.host_backward_s if on else 0.0)
                        for s in report.stages], keys)
    act = _solve(rows, [s.activation_bytes for s in report.stages], keys)
    dp = report.exposed_comm_s.get("dp", 0.0)
    sync = tuple((group, kind, int(e["calls"]), float(e["bytes"]))
                 for group, kind, e in _gradient_reductions(report))
    return GroupModel(fwd_s=fwd, bwd_s=bwd, act_bytes=act, dp_sync=sync,
                      transient_bytes=transient,
                      p2p_s=max(report.p2p_s, default=0.0), dp_exposed_s=dp,
                      opt_s_per_element=0.0, templates=templates, inventory=inventory,
                      num_layers=num_layers, host=host)


#: the data-parallel groups gradients are reduced over and the reductions (the collective
#: table's ``backward/<group>/<kind>``: transforms/training/data_parallel.py)
SYNC_GROUPS = ("dp", "dp_cp", "edp")
SYNC_KINDS = ("reduce_scatter", "all_reduce")


def _gradient_reductions(report: Any) -> list[tuple[str, str, Any]]:
    """(group, kind, collective-table entry) of a report's gradient reductions: its
    backward's reduce-scatters / all-reduces over the data-parallel groups, in key order."""
    return [(group, kind, e) for key, e in sorted((report.collectives or {}).items())
            for phase, group, kind in [key.split("/", 2)]
            if phase == "backward" and group in SYNC_GROUPS and kind in SYNC_KINDS]


def with_optimizer(g: GroupModel, report: Any, anchor: Screened, parallel: Any = None,
                   sharded: bool = True, hw: Any = None) -> GroupModel:
    """``g`` with the anchor's optimizer seconds per state element on its worst rank (the
    optimizer's kernels stream the rank's shard: time ∝ elements) and its gradient sync
    seconds per parameter element: the gradient reductions of its backward (every layer's
    bucket, the collective table) over the elements they reduce (the sum over its ranks),
    without the optimizer's parameter gather, which runs after the step or beside the next
    forward, not beside the backward; without the table, every data-parallel second of
    the anchor over its worst rank's elements."""
    from attrs import evolve

    per = report.optimizer_s / anchor.opt_elements if anchor.opt_elements else 0.0
    dp = report.exposed_comm_s.get("dp", 0.0) + report.hidden_comm_s.get("dp", 0.0)
    dp_per = dp / anchor.rank_elements if anchor.rank_elements else 0.0
    g = evolve(g, opt_s_per_element=per, dp_s_per_element=dp_per)
    sync_s = sum(e["time_s"] for _, _, e in _gradient_reductions(report))
    base = _sync_s(g, parallel, sharded, hw) if g.dp_sync and parallel is not None else 0.0
    if sync_s > 0 and anchor.total_elements > 0 and base > 0:
        return evolve(g, sync_s_per_element=sync_s / anchor.total_elements / base)
    return evolve(g, dp_sync=())


def _sync_s(g: GroupModel, parallel: Any, sharded: bool, hw: Any) -> float:
    """The anchor's gradient reductions priced on ``parallel``'s groups (reduce-scatter
    when the optimizer is sharded, all-reduce otherwise: data_parallel.py), one collective
    of the average bucket per call; memoised per group sizes and spans."""
    from zrt_core.cost.collectives import collective_cost

    kind = "reduce_scatter" if sharded else "all_reduce"
    spans = tuple(parallel.span(group) for group, _, _, _ in g.dp_sync)
    key = ("sync", g.dp_sync, kind, spans)
    hit = g.memo.get(key)
    if hit is None:
        hit = 0.0
        for (_, _, calls, nbytes), (size, span) in zip(g.dp_sync, spans, strict=True):
            if size > 1 and calls:
                hit += collective_cost(kind, nbytes / calls, size, span, hw).time_s * calls
        g.memo[key] = hit
    return hit


def with_residual(g: GroupModel, report: Any, anchor: Screened,
                  shape: tuple[Any, ...] | None = None) -> GroupModel:
    """``g`` with the anchor's step minus its closed form: the pipeline's part (its
    simulation against the schedule's closed form) added to the layouts of the anchor's
    ``shape`` (:func:`pipeline_shape`), the rest to every layout's step (the anchor is then
    screened exactly; its neighbours keep the difference)."""
    from attrs import evolve

    pipe = report.pipeline_s - anchor.pipeline_s if shape is not None else 0.0
    return evolve(g, residual_s=report.step_time_s - anchor.step_s - pipe,
                  pipeline_residual_s=pipe, anchor_shape=shape)


def pipeline_shape(cand: Any, global_batch: int) -> tuple[Any, ...]:
    """What a layout's pipeline simulation follows from besides its stage times: the
    schedule, pp, vp and the micro-batch count."""
    p = cand.parallel
    return (cand.pp_schedule, p.pp, p.vp if cand.pp_schedule == "interleaved" else 1,
            global_batch // (cand.micro_batch * p.dp))


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """The even split of ``num_layers`` over ``stages``, in virtual-stage order."""
    n = num_layers // stages
    return [range(v * n, (v + 1) * n) for v in range(stages)]


def stage_ranges(g: GroupModel, pp: int, stages: int) -> list[range]:
    """Each virtual stage's layers as the estimator splits them for the search
    (``stage_split="auto"``, the split the ``pp_layers`` rule admits: even, else the
    embedding and the loss counted as layers, else the balanced layout; MTP layers on the
    last stage): :func:`zrt_core.schedule.stages.plan_stages`."""
    if not g.decoder_layers:
        return stage_layers(g.num_layers, stages)
    from zrt_core.schedule.stages import plan_stages

    return list(plan_stages(g.decoder_layers, stages, pp, "auto", mtp_depths=g.mtp_depths,
                            mtp_layers_per_depth=g.mtp_per_depth).ranges)


@frozen
class _Split:
    """One stage split of a group (pp ranks, pp × vp virtual stages): per virtual stage the
    forward, backward and activation bytes; per rank its virtual stages, its parameter
    elements (dense, expert) and its largest layer's elements."""

    f: list[float]
    b: list[float]
    a: list[float]
    mine: list[list[int]]
    dense: list[int]
    expert: list[int]
    largest: list[int]
    #: per rank, the largest transient of its keys (the estimator's per-stage maximum)
    transient: list[float]
    #: per rank, the backward time from its first chunk's last backward to its end: what
    #: the gradient sync, started there, runs beside
    window: list[float]
    #: the busiest rank's forward and backward, Σ over its chunks (one micro-batch)
    work: float = 0.0
    #: Σ over the virtual stages of forward + backward
    chunks: float = 0.0
    #: per virtual stage, its layers' representatives and whether it is the first / last
    sigs: list[tuple[tuple[Any, ...], bool, bool]] = field(factory=list)


def _stage_sums(g: GroupModel, reps: tuple[Any, ...], first: bool, last: bool
                ) -> tuple[float, float, float]:
    """One stage's forward, backward (with the host's wait: :attr:`GroupModel.host`) and
    activation bytes from its layers' representatives, in layer order."""
    f, b, a = (sum(table.get(rep, 0.0) for rep in reps)
               + (table.get("embedding", 0.0) if first else 0.0)
               + (table.get("head", 0.0) if last else 0.0)
               for table in (g.fwd_s, g.bwd_s, g.act_bytes))
    if g.host is not None:
        from zrt_core.estimate.host import exposed_host_s

        # the outside-layers part, as the estimator's stages list it
        listed = (None, *reps) if first else (*reps, None) if last else reps
        host_f, host_b = exposed_host_s(g.host.model, listed, g.host.fwd, g.host.bwd, f, b)
        f, b = f + host_f, b + host_b
    return f, b, a


def _geometry(g: GroupModel, pp: int, vp: int) -> _Split:
    """:class:`_Split` of ``g`` for ``pp`` ranks of ``vp`` chunks, computed once per group
    and split (every layout of the group with that split shares it: the same sums)."""
    key = (id(g.fwd_s), id(g.bwd_s), id(g.act_bytes), id(g.templates), id(g.inventory),
           id(g.host), g.num_layers, g.decoder_layers, g.mtp_depths, g.mtp_per_depth, pp, vp)
    hit = g.memo.get(key)
    if hit is not None:
        return hit
    n_stages = pp * vp
    templates, inv = g.templates, g.inventory
    # a stage's sums follow from its layers' templates and whether it holds an end: stages
    # alike (most of them) share one computation, and ranks alike their parameter counts
    sigs: list[tuple[tuple[Any, ...], bool, bool]] = []
    sums = g.memo.setdefault(("stage_sums", id(g.fwd_s), id(g.bwd_s), id(g.act_bytes),
                              id(g.host)), {})  # per signature, shared by the splits
    for v, r in enumerate(stage_ranges(g, pp, n_stages)):
        sig = (tuple([templates.get(i, i) for i in r]), v == 0, v == n_stages - 1)
        sigs.append(sig)
        if sig not in sums:
            sums[sig] = _stage_sums(g, *sig)
    f = [sums[sig][0] for sig in sigs]
    b = [sums[sig][1] for sig in sigs]
    a = [sums[sig][2] for sig in sigs]
    mine_all, dense_all, expert_all, largest_all, trans_all, window_all = \
        [], [], [], [], [], []
    ranks: dict[tuple[Any, ...], tuple[int, int, int, float]] = {}
    for r in range(pp):
        mine = [v for v in range(n_stages) if v % pp == r]  # chunk v on rank v mod pp
        rank_sig = tuple(sigs[v] for v in mine)
        hit_r = ranks.get(rank_sig)
        if hit_r is None:
            reps = [rep for sig in rank_sig for rep in sig[0]]
            first, last = any(sig[1] for sig in rank_sig), any(sig[2] for sig in rank_sig)
            # the representatives stand for their layers (``{}``: each its own)
            dense, expert = inv.stage_of(reps, {}, first=first, last=last, pp=pp)
            largest = max([inv.layers[rep].total for rep in reps if rep in inv.layers]
                          + [0])
            keys: set[Any] = set(reps)
            if first:
                keys.add("embedding")
            if last:
                keys.add("head")
            hit_r = ranks[rank_sig] = (dense, expert, largest, max(
                [g.transient_bytes.get(k, 0.0) for k in keys] + [0.0]))
        dense, expert, largest, trans = hit_r
        trans_all.append(trans)
        # the estimator starts a rank's gradient sync at the earliest last backward of its
        # chunks (compose.py); Megatron's interleaved order ends with pp backwards of each
        # chunk, the last chunk first (schedule/pipeline/orders.py), so the earliest is
        # chunk vp − 1's, followed by pp backwards of every other chunk (at least that long:
        # waits in the drain only lengthen it); one chunk (1F1B, GPipe): its backward
        bs = [b[v] for v in mine]
        window_all.append(bs[-1] + pp * sum(bs[:-1]) if len(bs) > 1 else sum(bs))
        mine_all.append(mine)
        dense_all.append(dense)
        expert_all.append(expert)
        largest_all.append(largest)
    split = _Split(f=f, b=b, a=a, mine=mine_all, dense=dense_all, expert=expert_all,
                   largest=largest_all, transient=trans_all, window=window_all,
                   work=max(sum(f[v] + b[v] for v in mine) for mine in mine_all),
                   chunks=sum([f[v] + b[v] for v in range(n_stages)]), sigs=sigs)
    g.memo[key] = split
    return split


def dp_exposed_floor_s(g: GroupModel, sync_s: float) -> float:
    """The anchor's exposed data-parallel time, the least a layout's tail is taken to be,
    scaled down with the layout's gradient sync ``sync_s`` against the anchor's (the rank
    with the most parameters, per element on its own groups: :attr:`Screened.sync_s`): a
    layout with smaller data-parallel groups or fewer parameters per rank has less to
    expose (Mixtral 8x7B on 64 H100, dp 1 at cp 8 and pp 8 against a dp 4 × pp 2 anchor:
    screened up to 5.4% slow on the anchor's whole floor). Never above the anchor's."""
    if g.anchor_sync_s <= 0:
        return g.dp_exposed_s
    return g.dp_exposed_s * min(1.0, sync_s / g.anchor_sync_s)


def pipeline_closed_form(split: _Split, pp: int, vp: int, m: int) -> float:
    """The schedule's compute over a step, P2P aside (see :func:`screen_layout`)."""
    if vp == 1:
        return (m - 1) * split.work + split.chunks
    return m * split.work + sum(split.f[v] + split.b[v] for v in range(pp - 1))


@frozen
class Screened:
    """A layout's screened step and memory."""

    step_s: float
    tokens_per_s_per_gpu: float
    memory_bytes: float
    usable_bytes: float
    #: optimizer-state elements on the worst rank (the optimizer step's work)
    opt_elements: float
    #: parameter elements on the rank with the most
    rank_elements: float = 0.0
    #: parameter elements summed over the ranks (each stage's once)
    total_elements: float = 0.0
    #: the throughput bounds the exact one from above only (more communication than the
    #: anchor's per-layer times hold: :func:`~zrt_core.search.screen.resharded`)
    upper_only: bool = False
    #: the pipeline's closed form (the schedule's steps and fill, P2P, FSDP's gather delay)
    pipeline_s: float = 0.0
    #: the gradient sync of the rank with the most parameters (before its window)
    sync_s: float = 0.0
    #: the memory is not bounded by the screen's measured memory bounds: an uneven split
    #: or MTP stages (their chunks unlike each other; the two tiers then never drop the
    #: layout on memory nor count it certain to fit)
    memory_unsure: bool = False


def screen_layout(cand: Any, g: GroupModel, *, global_batch: int, seq_len: int, hw: Any,
                  train: Any, plan: Any) -> Screened:
    """The closed form of one layout (1F1B, GPipe or interleaved; the even stage split)."""
    p = cand.parallel
    pp = p.pp
    vp = p.vp if cand.pp_schedule == "interleaved" else 1
    n_stages = pp * vp
    m = global_batch // (cand.micro_batch * p.dp)
    split = _geometry(g, pp, vp)
    a = split.a
    # the bottleneck rank runs every micro-batch; the fill and drain add one pass of each
    # other virtual stage (1F1B: Σ_v (f+b) − the slowest), interleaved the first model
    # chunk's stages before the last rank (the (pp − 1)/vp bubble of Narayanan et al. 2021
    # in chunks: the rank holding the head waits for those forwards before its first and
    # their backwards after its last; exact against the simulation for even chunks and a
    # heavier head), and the P2P of every hop of the first micro-batch's way through the
    # virtual stages and back (2 (pp·vp − 1) hops: each chunk boundary is a transfer)
    pipeline = pipeline_closed_form(split, pp, vp, m)
    if pp > 1:
        pipeline += _p2p_chain_s(g, p, vp, hw) if g.p2p_bytes > 0 \
            else 2 * (n_stages - 1) * g.p2p_s
    # static memory per rank: the parameter elements on it (inventory.stage) under the
    # sharding, as the estimator's optimizer sizes them
    dense_group, expert_group = dp_groups(p)
    dense_dp, expert_dp = p.span(dense_group)[0], p.span(expert_group)[0]
    shard_states = train.zero >= 1 or train.fsdp
    shard_grads = train.zero >= 2 or train.fsdp
    shard_params = train.zero == 3 or train.fsdp
    reshard = "full"
    per_micro = True
    sp = None
    if train.fsdp:
        sp = sharding_plan(p, train)
        dense_dp, expert_dp = sp.shard.size, sp.expert_shard.size
        reshard, per_micro = sp.reshard, sp.grads_per_microbatch
    pbytes = dtype_bytes(plan.activation_dtype)
    gbytes = dtype_bytes(grad_dtype(train.precision))
    state = STATE_BYTES_DEFAULT
    usable = hw.memory.capacity_gb * 2.0 ** 30 * _usable_fraction()
    worst_mem = 0.0
    worst_opt = 0.0
    tail = 0.0
    most = 0.0
    total = 0.0
    # gradient sync seconds per element: the anchor's scaled to this layout's groups and
    # reduction (:func:`with_optimizer`), or the anchor's own
    dp_per = g.sync_s_per_element * _sync_s(g, p, shard_states, hw) \
        if g.dp_sync and not (train.fsdp and reshard != "none" and pp == 1) \
        else g.dp_s_per_element
    for r in range(pp):
        mine = split.mine[r]
        dense, expert = split.dense[r], split.expert[r]
        states = (dense / (dense_dp if shard_states else 1)
                  + expert / (expert_dp if shard_states else 1)) * state
        grads = (dense / dense_dp + expert / expert_dp) if shard_grads else dense + expert
        if shard_params and not per_micro:
            grads += dense + expert
        grads *= gbytes
        params = (dense / dense_dp + expert / expert_dp) if shard_params else dense + expert
        if shard_params and reshard == "none":
            params += dense + expert
        weights = params * pbytes
        if plan.low_precision:
            weights += plan.copies * plan.quantized_bytes(int(dense + expert),
                                                          plan.gemm_dtype or "")
        buffers = 0.0
        if shard_params and reshard != "none":
            buffers = 2 * split.largest[r] * pbytes
        # activations in flight: 1F1B holds pp − r micro-batches on rank r, GPipe all m,
        # interleaved Megatron's warm-up of 2 (pp − r − 1) + (vp − 1) pp + 1 chunks
        if cand.pp_schedule == "gpipe":
            held = sum(a[v] for v in mine) * m
        elif vp == 1:
            held = sum(a[v] for v in mine) * min(pp - r, m)
        else:
            # the warm-up's forwards k = 0, 1, ... run chunk (k // pp) mod vp (orders.py)
            w = min(m * vp, 2 * (pp - r - 1) + (vp - 1) * pp + 1)
            full, rem = divmod(w, pp * vp)
            held = sum(a[v] * (full * pp + min(pp, max(0, rem - j * pp)))
                       for j, v in enumerate(mine))
        mem = weights + grads + states + buffers + held + split.transient[r]
        worst_mem = max(worst_mem, mem)
        # the gradient sync of the rank's parameters runs beside its last micro-batch's
        # backward; what does not fit under it is the tail
        tail = max(tail, dp_per * (dense + expert) - split.window[r])
        most = max(most, dense + expert)
        total += dense + expert
        worst_opt = max(worst_opt, (dense / (dense_dp if shard_states else 1)
                                    + expert / (expert_dp if shard_states else 1)))
    if sp is not None and sp.gather_once:
        pipeline += _gather_delay_s(g, split, sp, pbytes, hw)
    sync = dp_per * most
    step = pipeline + max(dp_exposed_floor_s(g, sync), tail) \
        + g.opt_s_per_element * worst_opt + g.residual_s
    if g.anchor_shape is not None and g.anchor_shape == (cand.pp_schedule, pp, vp, m):
        step += g.pipeline_residual_s
    if sp is not None and sp.gather and not sp.gather_once and sp.reshard != "none":
        # re-sharded after forward (FSDP at pp 1): every micro-batch gathers every layer in
        # forward and again in backward, and reduce-scatters its gradients, one collective
        # at a time on its group's stream, so the step takes at least m times one stream's
        # collectives (the upper bound stays an upper bound: screen.resharded); the
        # anchor's per-layer times hold none of them
        rs_bytes = dtype_bytes(grad_dtype(train.precision, train.grad_reduce_in_fp32)) \
            if sp.grads_per_microbatch else 0.0
        step = max(step, m * _regather_busy_s(g, sp, p, pbytes, rs_bytes, hw))
    tokens = global_batch * seq_len
    return Screened(step_s=step, tokens_per_s_per_gpu=tokens / (step * p.world_size),
                    memory_bytes=worst_mem, usable_bytes=usable, opt_elements=worst_opt,
                    rank_elements=most, total_elements=total, pipeline_s=pipeline,
                    sync_s=sync, memory_unsure=_uneven(g, n_stages))


def _gather_delay_s(g: GroupModel, split: _Split, sp: Any, pbytes: float, hw: Any) -> float:
    """How much later the step starts because each stage's first forward gathers its
    layers' parameters (FSDP under a pipeline gathers once per step:
    :func:`zrt_core.estimate.training.fsdp.first_forward_delay_s`'s rule in closed form):
    per virtual stage, the layers' all-gathers issued one layer ahead of the forward that
    needs them (a gather starts when the previous one ends and the previous layer's
    forward starts), less the forwards of the stages before it; the largest over stages.
    Memoised per split and shard groups."""
    from zrt_core.cost.collectives import collective_cost

    groups = (sp.shard, sp.expert_shard, pbytes)
    key = ("gather", id(split), *groups)
    hit = g.memo.get(key)
    if hit is not None:
        return hit
    gather = g.memo.get(("gathers", *groups))
    if gather is None:
        gather = g.memo[("gathers", *groups)] = {}
        for rep, group in g.inventory.layers.items():
            t = 0.0
            for elements, sub in ((group.dense, sp.shard), (group.expert, sp.expert_shard)):
                if elements > 0 and sub.size > 1:
                    t += collective_cost("all_gather", elements * pbytes, sub.size, sub.span,
                                         hw).time_s
            gather[rep] = t
    delay = wait = 0.0
    for v, (reps, first, _) in enumerate(split.sigs):
        late = g.memo.get(("gather_stage", reps, first, *groups))
        if late is None:  # the stage's first forward with its gathers, less the forward
            g_end = f_start = f_end = f_sum = g.fwd_s.get("embedding", 0.0) if first else 0.0
            for rep in reps:
                g_end = max(g_end, f_start) + gather.get(rep, 0.0)
                f = g.fwd_s.get(rep, 0.0)
                f_start = max(f_end, g_end)
                f_end = f_start + f
                f_sum += f
            late = g.memo[("gather_stage", reps, first, *groups)] = f_end - f_sum
        delay = max(delay, late - wait)
        wait += split.f[v]
    g.memo[key] = delay
    return delay


def _regather_busy_s(g: GroupModel, sp: Any, parallel: Any, pbytes: float, rs_bytes: float,
                     hw: Any) -> float:
    """One micro-batch's data-parallel collectives when every layer is gathered before its
    forward and again before its backward (over the re-shard group with ``reshard =
    "partial"``) and, with ``rs_bytes`` per gradient element, its gradients reduce-scattered
    (``ParamGather`` and ``GradientSync``, priced as the estimator prices them): the
    busier stream's sum, the dense weights' group or the experts'. The outer parameters
    and HSDP's replica all-reduce are left out, so it stays below what the estimator's
    stream carries. Memoised per groups and sizes."""
    from zrt_core.cost.collectives import collective_cost

    dense_group, expert_group = dp_groups(parallel)
    spans = (parallel.span(dense_group), parallel.span(expert_group))
    key = ("regather", sp.shard, sp.expert_shard, sp.post_forward, sp.expert_post_forward,
           sp.reshard, sp.replicas, spans, pbytes, rs_bytes)
    hit = g.memo.get(key)
    if hit is not None:
        return hit
    forward = (sp.shard, sp.expert_shard)
    backward = (sp.post_forward, sp.expert_post_forward) if sp.reshard == "partial" \
        else forward
    inv = g.inventory
    trainable = inv.trainable.layers if inv.trainable is not None else inv.layers
    per_rep: dict[Any, tuple[float, float]] = {}
    for rep, group in inv.layers.items():
        busy = [0.0, 0.0]  # the dense group's stream, the experts'
        grads = trainable.get(rep)
        for k, elements in enumerate((group.dense, group.expert)):
            for sub in (forward[k], backward[k]):
                if elements > 0 and sub.size > 1:
                    busy[k] += collective_cost("all_gather", elements * pbytes, sub.size,
                                               sub.span, hw).time_s
            reduced = (grads.dense, grads.expert)[k] if grads is not None else 0
            # the reduce-scatter runs over the shard group with HSDP, the whole group else
            size, span = (forward[k].size, forward[k].span) if sp.replicas > 1 else spans[k]
            if rs_bytes and reduced > 0 and size > 1:
                busy[k] += collective_cost("reduce_scatter", reduced * rs_bytes, size, span,
                                           hw).time_s
        per_rep[rep] = (busy[0], busy[1])
    dense = expert = 0.0
    for i in range(g.num_layers):
        d, e = per_rep.get(g.templates.get(i, i), (0.0, 0.0))
        dense += d
        expert += e
    hit = g.memo[key] = max(dense, expert)
    return hit


def _p2p_chain_s(g: GroupModel, parallel: Any, vp: int, hw: Any) -> float:
    """The P2P on a step's critical path: the first micro-batch's forward through every
    virtual stage and its backward back, each hop priced on the boundary it crosses
    (``p2p_times_s``, the estimator's prices: rank ``r`` to ``r + 1``, interleaved's chunk
    wrap from rank ``pp − 1`` to 0). The schedule's fill and drain wait on every hop
    (the simulation of even stages gives exactly this against its steady work).
    Memoised per pipeline layout."""
    pp = parallel.pp
    key = ("p2p_chain", parallel.tp * parallel.cp * parallel.dp, pp, vp, g.p2p_bytes)
    hit = g.memo.get(key)
    if hit is None:
        boundaries, wrap = _p2p_prices(hw, parallel.tp * parallel.cp * parallel.dp, pp,
                                       g.p2p_bytes)
        hops = [boundaries[v % pp] if v % pp < pp - 1 else wrap for v in range(pp * vp - 1)]
        hit = g.memo[key] = 2 * sum(hops)
    return hit


@lru_cache(maxsize=1024)
def _p2p_prices(hw: Any, stride: int, pp: int, nbytes: float
                ) -> tuple[tuple[float, ...], float]:
    """``p2p_times_s`` for ``pp`` stages ``stride`` ranks apart (all a boundary's tiers
    depend on), shared by every group of a search."""
    from zrt_core.schedule.pipeline import p2p_times_s
    from zrt_core.strategy import Parallel

    return p2p_times_s(hw, Parallel(dp=stride, pp=pp), nbytes)


def _uneven(g: GroupModel, stages: int) -> bool:
    """Whether the layout's stages are not the even split of plain decoder layers (the
    split the screen's memory bounds were measured on): MTP layers, or layers that
    ``stages`` does not divide. Its memory is screened, not bounded (Screened.memory_unsure:
    DeepSeek-V3 with MTP over 64 stages of one entry was 4.3% high on some layouts)."""
    return bool(g.mtp_depths) or (g.decoder_layers > 0 and g.decoder_layers % stages != 0)


def _usable_fraction() -> float:
    from zrt_core.estimate.training.spec import USABLE_MEMORY_FRACTION

    return USABLE_MEMORY_FRACTION
