"""Pipeline schedules: the simulation held to the closed forms of the papers, to hand-derived
uneven and P2P cases, and to an independent fixed-point reference."""

from __future__ import annotations

import random

import pytest

from zrt_core.errors import LayoutError, UnknownNameError
from zrt_core.hardware import ComputeSpec, HardwareSpec, InterconnectTier, MemorySpec
from zrt_core.schedule.pipeline import (
    BW,
    FBW,
    SCHEDULES,
    B,
    F,
    StageTimes,
    W,
    boundary_tiers,
    p2p_times_s,
    schedule_orders,
    simulate,
    stage_rank,
    virtual_stages,
)
from zrt_core.strategy import Parallel

# -- closed forms with equal stages ------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_equal_stages(schedule: str) -> None:
    # p=4, m=8, f=1, b=2: total = (m + p - 1)(f + b) = 11 × 3 = 33;
    # every rank is busy m(f + b) = 24, so the bubble is (p - 1)(f + b) = 9 = 3/11 of it.
    r = simulate(schedule, StageTimes(1.0, 2.0), pp=4, microbatches=8)
    assert r.total_s == 33.0
    assert r.busy_s == 24.0
    assert r.bubble_s == 9.0
    assert r.bubble_fraction == pytest.approx(3 / 11)
    assert r.exposed_p2p_s == 0.0


def test_activation_in_flight_gpipe_holds_all_1f1b_holds_pp_minus_stage() -> None:
    gpipe = simulate("gpipe", StageTimes(1.0, 2.0), pp=4, microbatches=8)
    assert [s.peak_inflight for s in gpipe.ranks] == [8, 8, 8, 8]
    one_f_one_b = simulate("1f1b", StageTimes(1.0, 2.0), pp=4, microbatches=8)
    # rank s warms up with p - s - 1 forwards and holds one more in steady state: p - s.
    assert [s.peak_inflight for s in one_f_one_b.ranks] == [4, 3, 2, 1]
    assert [s.peak_activation_units for s in one_f_one_b.ranks] == [4.0, 3.0, 2.0, 1.0]


def test_1f1b_fewer_microbatches_than_stages() -> None:
    # m=2 < p=4: warm-up is capped at m, so rank s holds min(p - s, m); the step is still
    # (m + p - 1)(f + b) = 5 × 3 = 15.
    r = simulate("1f1b", StageTimes(1.0, 2.0), pp=4, microbatches=2)
    assert r.total_s == 15.0
    assert [s.peak_inflight for s in r.ranks] == [2, 2, 2, 1]


@pytest.mark.parametrize("vp", [2, 4])
def test_interleaved_bubble_shrinks_by_vp(vp: int) -> None:
    # A stage's forward takes f = 1 and backward b = 2, split into vp chunks of f/vp, b/vp.
    # Megatron: total = m(f + b) + (p - 1)(f + b)/vp  → vp=2: 24 + 4.5 = 28.5;
    # vp=4: 24 + 2.25 = 26.25.
    r = simulate("interleaved", StageTimes(1.0 / vp, 2.0 / vp), pp=4, vp=vp, microbatches=8)
    assert r.total_s == pytest.approx(24.0 + 9.0 / vp)
    assert r.bubble_s == pytest.approx(9.0 / vp)
    # First rank: 2(p - 1) + (vp - 1)p warm-up chunks + 1, each 1/vp of a stage:
    # (vp·p + p - 1)/vp = p + (p - 1)/vp  (4 + 1.5 = 5.5 for vp=2; 4.75 for vp=4).
    first = r.ranks[0]
    assert first.peak_inflight == 2 * 3 + (vp - 1) * 4 + 1
    assert first.peak_activation_units == pytest.approx(4 + 3 / vp)


def test_zb_h1_bubble_is_a_third_of_1f1b_at_1f1b_memory() -> None:
    # F = B = W = 1 (backward_s = B + W = 2, weight_s = W = 1), p=4, m=8.
    # ZB-H1 (Qi et al.): bubble (p - 1)(F + B - W) = 3 × 1 = 3, total m(F + B + W) + 3 = 27;
    # 1F1B on the same stages: bubble (p - 1)(F + B + W) = 9, three times as much.
    times = StageTimes(1.0, 2.0, weight_s=1.0)
    zb = simulate("zb-h1", times, pp=4, microbatches=8)
    assert zb.total_s == 27.0
    assert zb.bubble_s == 3.0
    assert simulate("1f1b", times, pp=4, microbatches=8).bubble_s == 9.0
    # Every rank holds p micro-batches (until their W): 1F1B's first-rank peak, never more.
    assert [s.peak_inflight for s in zb.ranks] == [4, 4, 4, 4]


def test_zb_v_fills_the_pipeline_except_the_first_forward_chain() -> None:
    # Two chunks per rank in a V; each chunk is half a stage: F = B = W = 0.5.
    # Every rank does 2m(F + B + W) = 16 × 1.5 = 24 of work; the only idle time is the
    # pipeline fill, rank p - 1 starting (p - 1)·F = 1.5 late: total 25.5.
    r = simulate("zb-v", StageTimes(0.5, 1.0, weight_s=0.5), pp=4, microbatches=8)
    assert r.total_s == 25.5
    assert all(s.busy_s == 24.0 for s in r.ranks)
    last = [op for op in r.iter_ops() if op.rank == 3]
    assert min(op.start_s for op in last) == 1.5
    # After its first operation each rank never idles: span = busy.
    for rank in range(4):
        ops = [op for op in r.iter_ops() if op.rank == rank]
        span = max(op.end_s for op in ops) - min(op.start_s for op in ops)
        assert span == 24.0
    # 2p chunks of half a stage in flight on every rank: p = 4 units, 1F1B's first rank.
    assert [s.peak_activation_units for s in r.ranks] == [4.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 16), (8, 16)])
def test_dualpipe_matches_deepseek_bubble(pp: int, m: int) -> None:
    # F = 1, B (whole backward) = 2, W = 1, and no communication to hide (F&B = F + B = 3).
    # DeepSeek-V3: bubble (pp/2 - 1)(F&B + B - 3W) = (pp/2 - 1)(3 + 2 - 3) = 2(pp/2 - 1);
    # work per rank m(F + B) → pp=4, m=8: 24 + 2 = 26.
    r = simulate("dualpipe", StageTimes(1.0, 2.0, weight_s=1.0), pp=pp, microbatches=m)
    bubble = (pp / 2 - 1) * (3 + 2 - 3)
    assert r.bubble_s == bubble
    assert r.total_s == m * 3 + bubble
    # Activation per device: pp + 1 stages' worth.
    assert max(s.peak_activation_units for s in r.ranks) == pp + 1


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (4, 16)])
def test_dualpipev_matches_deepseek_bubble(pp: int, m: int) -> None:
    # pp ranks run 2·pp stages; per stage (chunk) F = 0.5, B = 1, W = 0.5, F&B = F + B = 1.5.
    # DeepSeek: bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2·pp stages: 3 × (1.5 + 1 - 1.5) = 3;
    # work per rank 2m(F + B) = m × 3.
    r = simulate("dualpipev", StageTimes(0.5, 1.0, weight_s=0.5), pp=pp, microbatches=m)
    assert r.bubble_s == (pp - 1) * 1.0
    assert r.total_s == m * 3 + (pp - 1) * 1.0
    # PP + 1 = 9 chunk activations on the busiest rank: 4.5 units of a rank's layers.
    assert max(s.peak_inflight for s in r.ranks) == 2 * pp + 1


def test_dualpipe_overlapped_pairs_hide_communication() -> None:
    # F = 1 of which 0.5 all-to-all, B = 2 of which 1 all-to-all: an overlapped F+BW pair
    # takes max(compute 0.5 + 1, comm 0.5 + 1) = 1.5 instead of 3.
    times = StageTimes(1.0, 2.0, weight_s=1.0, forward_comm_s=0.5, backward_comm_s=1.0)
    serial = simulate("dualpipe", times, pp=4, microbatches=8, overlap_efficiency=0.0)
    overlapped = simulate("dualpipe", times, pp=4, microbatches=8)
    pairs = [op for op in overlapped.iter_ops() if op.kind == "F+BW"]
    assert pairs and all(op.duration_s == 1.5 for op in pairs)
    assert serial.total_s == 26.0
    # Rank 0 runs 3 pairs (4.5), 4 F (4), F+B+W (3), 2 whole B (4), 2 B + 2 W (4): 19.5 busy,
    # and waits 1.0 for a gradient that a pair delivers only at its end, 0.5 before its
    # last backward: 21.
    assert overlapped.ranks[0].busy_s == 19.5
    assert overlapped.total_s == 21.0
    half = simulate("dualpipe", times, pp=4, microbatches=8, overlap_efficiency=0.5)
    assert all(op.duration_s == 2.25 for op in half.iter_ops() if op.kind == "F+BW")


# -- uneven stages and P2P ----------------------------------------------------------------------


def test_uneven_last_stage_bottleneck() -> None:
    # Last stage carries the head: f = 2, b = 4 there, f = 1, b = 2 elsewhere. With the
    # bottleneck last, total = Σ(f + b) + (m - 1)·(f + b)_last = 15 + 7 × 6 = 57.
    for schedule in ("1f1b", "gpipe"):
        r = simulate(schedule, StageTimes([1, 1, 1, 2], [2, 2, 2, 4]), pp=4, microbatches=8)
        assert r.total_s == 57.0
        assert r.critical_rank == 3
        assert r.busy_s == 48.0 and r.bubble_s == 9.0


def test_uneven_first_stage_waits_once_for_its_first_gradient() -> None:
    # First stage carries the embedding: f = 2, b = 4; others f = 1, b = 2; p=4, m=8.
    # Rank 0's 4 forwards end at 8. Micro-batch 0 reaches rank 3 at 2 + 1 + 1 = 4, its
    # backward runs 5→7 on rank 3, 7→9 on rank 2, 9→11 on rank 1: rank 0 idles 8→11, then
    # never again. Total = busy 8 × 6 + 3 = 51.
    r = simulate("1f1b", StageTimes([2, 1, 1, 1], [4, 2, 2, 2]), pp=4, microbatches=8)
    assert r.total_s == 51.0
    assert r.critical_rank == 0
    assert r.bubble_s == 3.0
    assert r.ranks[0].warmup_s == 11.0


def test_gpipe_p2p_is_exposed_once_each_way() -> None:
    # GPipe: the first forward crosses 3 boundaries, the last backward 3: 33 + 6 × 0.1.
    r = simulate("gpipe", StageTimes(1.0, 2.0), pp=4, microbatches=8, p2p_s=0.1)
    assert r.total_s == pytest.approx(33.6)
    assert r.busy_s + r.exposed_p2p_s + r.bubble_s == pytest.approx(r.total_s)


def test_p2p_per_boundary_and_wrap() -> None:
    # Interleaved with a slow wrap-around (rank 3 → rank 0): only the chunk wrap pays it.
    fast = simulate("interleaved", StageTimes(0.5, 1.0), pp=4, vp=2, microbatches=8,
                    p2p_s=[0.0, 0.0, 0.0], p2p_wrap_s=0.0)
    slow = simulate("interleaved", StageTimes(0.5, 1.0), pp=4, vp=2, microbatches=8,
                    p2p_s=[0.0, 0.0, 0.0], p2p_wrap_s=1.0)
    assert fast.total_s == 28.5
    assert slow.total_s > fast.total_s
    assert sum(s.exposed_p2p_s for s in slow.ranks) > 0


def test_warmup_and_cooldown_of_1f1b() -> None:
    # p=4, m=8, f=1, b=2. Rank 3 (last) starts its first backward as soon as micro-batch 0
    # has crossed the three stages before it and its own forward: 3 × 1 + 1 = 4.
    r = simulate("1f1b", StageTimes(1.0, 2.0), pp=4, microbatches=8)
    assert r.ranks[3].warmup_s == 4.0
    # Rank 0: F0..F3 end at 4, B0 comes back at 4 + 3 × 2 = 10 (warm-up 10); then B(k)
    # arrives every 3 s: F7 ends at 22 after B3 (19-21), B4..B7 end at 24, 27, 30, 33.
    # Cool-down 33 - 22 = 11; idle 6 in warm-up plus 3 in cool-down = (p - 1)(f + b).
    assert r.ranks[0].warmup_s == 10.0
    assert r.ranks[0].cooldown_s == 11.0
    assert r.ranks[0].bubble_s == 9.0


# -- independent reference ---------------------------------------------------------------------


def _reference(schedule: str, times: StageTimes, pp: int, m: int, vp: int, p2p: float
               ) -> dict[tuple[int, int, int, int], float]:
    """Start of every (rank, row) by fixed-point relaxation over the same orders, with the
    dependencies derived here from what each pass needs (no code shared with the engine).
    Covers the single-pipeline schedules; stage times are per virtual stage."""
    orders = schedule_orders(schedule, pp, m, vp)
    nv = virtual_stages(schedule, pp, vp)
    t = times.expanded(nv)
    w = t.weight_s or (0.0,) * nv

    def dur(kind: int, v: int, v2: int) -> float:
        return {F: t.forward_s[v], B: t.backward_s[v] - w[v], W: w[v],
                BW: t.backward_s[v]}[kind] if kind != FBW else t.forward_s[v] + t.backward_s[v2]

    def lag(a: int, b: int) -> float:
        return 0.0 if stage_rank(schedule, pp, vp, a) == stage_rank(schedule, pp, vp, b) \
            else p2p

    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[int, int, int, int], float] = {}
    changed = True
    while changed:
        changed = False
        for rank, rows in enumerate(orders):
            free = 0.0
            for i, (kind, v, mb, v2, mb2) in enumerate(rows.tolist()):
                need = [free]
                halves = [(F if kind == FBW else kind, v, mb)]
                if kind == FBW:
                    halves.append((BW, v2, mb2))
                for k, s, b in halves:
                    if k == F and s > 0:
                        need.append(end.get(("F", s - 1, b), float("inf")) + lag(s - 1, s))
                    if k in (B, BW):
                        if s < nv - 1:
                            need.append(end.get(("B", s + 1, b), float("inf")) + lag(s + 1, s))
                        need.append(end.get(("F", s, b), float("inf")))
                    if k == W:
                        need.append(end.get(("B", s, b), float("inf")))
                begin = max(need)
                if begin == float("inf"):
                    changed = True
                    break
                key = (rank, i, kind, v)
                if start.get(key) != begin:
                    start[key] = begin
                    changed = True
                free = begin + dur(kind, v, v2)
                for k, s, b in halves:
                    end[({F: "F", W: "W"}.get(k, "B"), s, b)] = free
    return start


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v",
                                      "dualpipev"])
def test_engine_agrees_with_fixed_point_reference(schedule: str) -> None:
    rng = random.Random(7)
    pp, m, vp = 4, 8, (2 if schedule == "interleaved" else 1)
    nv = virtual_stages(schedule, pp, vp)
    fwd = [rng.uniform(0.5, 2.0) for _ in range(nv)]
    bwd = [f * rng.uniform(1.5, 2.5) for f in fwd]
    wgt = [b * rng.uniform(0.3, 0.5) for b in bwd]
    times = StageTimes(fwd, bwd, weight_s=wgt)
    r = simulate(schedule, times, pp=pp, microbatches=m, vp=vp, p2p_s=0.05,
                 overlap_efficiency=0.0)
    ref = _reference(schedule, times, pp, m, vp, 0.05)
    ops = list(r.iter_ops())
    assert len(ops) == len(ref)
    per_rank: dict[int, int] = {}
    for op in ops:
        i = per_rank.get(op.rank, 0)
        per_rank[op.rank] = i + 1
        key = next(k for k in ref if k[0] == op.rank and k[1] == i)
        assert op.start_s == pytest.approx(ref[key], abs=1e-9)
    assert r.total_s == pytest.approx(max(op.end_s for op in ops))


# -- orders ------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 12), (8, 16)])
def test_orders_are_complete_and_respect_pass_order(schedule: str, pp: int, m: int) -> None:
    vp = 2 if schedule == "interleaved" else 1
    orders = schedule_orders(schedule, pp, m, vp)
    split = schedule in ("zb-h1", "zb-v", "dualpipe", "dualpipev")
    seen: dict[tuple[str, int, int], int] = {}
    chains = 2 if schedule == "dualpipe" else 1
    for rank, rows in enumerate(orders):
        for kind, v, mb, v2, mb2 in rows.tolist():
            halves = [(kind if kind != FBW else F, v, mb)]
            if kind == FBW:
                halves.append((BW, v2, mb2))
            for k, s, b in halves:
                if schedule != "dualpipe":
                    assert stage_rank(schedule, pp, vp, s) == rank
                name = {F: "F", B: "B", BW: "B", W: "W"}[k]
                assert (name, s, b) not in seen
                if name == "B":
                    assert ("F", s, b) in seen
                if name == "W":
                    assert ("B", s, b) in seen
                seen[(name, s, b)] = rank
    stages = virtual_stages(schedule, pp, vp) * (1 if schedule != "dualpipe" else 2)
    per_chain = m // chains
    assert sum(1 for k in seen if k[0] == "F") == stages * per_chain
    assert sum(1 for k in seen if k[0] == "B") == stages * per_chain
    if not split:
        assert not any(k[0] == "W" for k in seen)


# -- the rules a layout must meet --------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "kwargs", "words"), [
    ("interleaved", {"pp": 4, "vp": 2, "microbatches": 6}, "multiple of pp=4"),
    ("interleaved", {"pp": 4, "vp": 1, "microbatches": 8}, "vp ≥ 2"),
    ("1f1b", {"pp": 4, "vp": 2, "microbatches": 8}, "does not interleave"),
    ("zb-h1", {"pp": 4, "microbatches": 3}, "at least pp=4"),
    ("dualpipe", {"pp": 3, "microbatches": 12}, "even pp"),
    ("dualpipe", {"pp": 4, "microbatches": 6}, "at least 2 × pp = 8"),
    ("dualpipev", {"pp": 4, "microbatches": 7}, "at least 2 × pp = 8"),
    ("zb-v", {"pp": 4, "vp": 3, "microbatches": 8}, "two chunks per rank"),
    ("1f1b", {"pp": 4, "microbatches": 0}, "must all be ≥ 1"),
])
def test_bad_layouts_name_the_rule(schedule: str, kwargs: dict, words: str) -> None:
    with pytest.raises(LayoutError, match=words):
        simulate(schedule, StageTimes(1.0, 2.0, weight_s=1.0), **kwargs)


def test_split_schedules_need_the_weight_part() -> None:
    with pytest.raises(LayoutError, match="no weight_s"):
        simulate("zb-h1", StageTimes(1.0, 2.0), pp=4, microbatches=8)


def test_stage_times_must_match_the_virtual_stages() -> None:
    with pytest.raises(LayoutError, match="3 entries but the schedule has 8 virtual stages"):
        simulate("interleaved", StageTimes([1, 1, 1], 2.0), pp=4, vp=2, microbatches=8)
    with pytest.raises(LayoutError, match="exceeds backward_s"):
        simulate("zb-h1", StageTimes(1.0, 1.0, weight_s=2.0), pp=2, microbatches=2)


def test_unknown_schedule() -> None:
    with pytest.raises(UnknownNameError, match="unknown pipeline schedule 'pipedream'"):
        simulate("pipedream", StageTimes(1.0, 2.0), pp=2, microbatches=2)


# -- P2P on the right tier ---------------------------------------------------------------------


def _two_tier_gpu() -> HardwareSpec:
    return HardwareSpec(
        id="toy_gpu", name="toy", vendor="toy",
        compute=ComputeSpec(fp32_tflops=10, bf16_tflops=80, fp16_tflops=80),
        memory=MemorySpec(capacity_gb=16, bandwidth_gb_per_s=1000),
        interconnect=(InterconnectTier("link", 100, 2, 8, efficiency=0.5),
                      InterconnectTier("net", 25, 5, None, efficiency=0.8)))


def test_boundaries_cross_the_tier_their_ranks_need() -> None:
    # tp=4, pp=4: stages hold global ranks 0-3, 4-7, 8-11, 12-15; nodes of 8 devices.
    # 0→1 stays in node 0, 1→2 crosses nodes, 2→3 stays in node 1, the wrap 3→0 crosses.
    tiers = boundary_tiers(_two_tier_gpu(), Parallel(tp=4, pp=4))
    assert [t.name for t in tiers] == ["link", "net", "link", "net"]
    times, wrap = p2p_times_s(_two_tier_gpu(), Parallel(tp=4, pp=4), 1e6)
    # link: 2 µs + 1e6 B / (100e9 × 0.5) = 2e-6 + 2e-5; net: 5e-6 + 1e6 / (25e9 × 0.8) = 5.5e-5
    assert times == pytest.approx((2.2e-5, 5.5e-5, 2.2e-5))
    assert wrap == pytest.approx(5.5e-5)


def test_boundary_tier_with_stages_straddling_domains() -> None:
    # tp=3, pp=4: stage 1 holds ranks 3-5 and stage 2 ranks 6-8; the pair (5, 8) crosses
    # the 8-device node even though (3, 6) and (4, 7) do not.
    tiers = boundary_tiers(_two_tier_gpu(), Parallel(tp=3, pp=4))
    assert [t.name for t in tiers] == ["link", "net", "net", "net"]


# -- the periodic steady state -----------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "pp", "vp", "m"), [
    ("gpipe", 4, 1, 64), ("1f1b", 8, 1, 96), ("interleaved", 4, 2, 96), ("zb-h1", 6, 1, 80),
    ("zb-v", 4, 1, 64), ("dualpipe", 4, 1, 96), ("dualpipev", 6, 1, 80),
    # deeper pipelines: rank r of ZB-H1 holds W passes back r blocks (an input on its own
    # rank, which never binds), interleaved blocks of 2·pp·vp rows
    ("zb-h1", 16, 1, 400), ("zb-v", 8, 1, 160), ("interleaved", 8, 2, 512)])
def test_skipping_the_periodic_steady_state_is_exact(schedule: str, pp: int, vp: int, m: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Uneven stages, F/B/W ratios and P2P that make the steady state periodic with a cycle
    # of several blocks; the skipped blocks must land exactly where the event loop puts them.
    from collections import OrderedDict

    import zrt_core.schedule.pipeline.plan as plans  # where a plan reads _STEADY

    rng = random.Random(11)
    nv = virtual_stages(schedule, pp, vp)
    fwd = [rng.uniform(0.5, 2.0) for _ in range(nv)]
    bwd = [f * rng.uniform(1.5, 2.5) for f in fwd]
    times = StageTimes(fwd, bwd, weight_s=[b * 0.4 for b in bwd],
                       forward_comm_s=[f * 0.3 for f in fwd],
                       backward_comm_s=[b * 0.2 for b in bwd])
    kwargs = {"pp": pp, "vp": vp, "microbatches": m, "p2p_s": 0.07}
    fast = simulate(schedule, times, **kwargs)
    monkeypatch.setattr(plans, "_STEADY", {})
    monkeypatch.setattr(plans, "_PLANS", OrderedDict())  # plans without steady phases
    full = simulate(schedule, times, **kwargs)
    assert fast.simulated_ops < fast.num_ops // 2
    assert full.simulated_ops == full.num_ops
    assert fast.total_s == pytest.approx(full.total_s, rel=1e-12)
    for a, b in zip(fast.iter_ops(), full.iter_ops(), strict=True):
        assert (a.rank, a.kind, a.stage, a.microbatch) == (b.rank, b.kind, b.stage, b.microbatch)
        assert a.start_s == pytest.approx(b.start_s, rel=1e-12, abs=1e-12)
    for a, b in zip(fast.ranks, full.ranks, strict=True):
        assert a.exposed_p2p_s == pytest.approx(b.exposed_p2p_s, abs=1e-9)
        assert a.peak_inflight == b.peak_inflight


# -- one plan per schedule shape ---------------------------------------------------------------


@pytest.mark.parametrize(("schedule", "pp", "vp", "m"), [
    ("1f1b", 4, 1, 8), ("interleaved", 4, 2, 96), ("zb-v", 4, 1, 64), ("dualpipe", 4, 1, 12)])
def test_a_plan_serves_every_simulation_of_its_shape(schedule: str, pp: int, vp: int, m: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The order's arrays are built once per (schedule, pp, vp, m) and shared: a second
    # simulation with other stage times reads the cached plan and must give exactly what a
    # simulation from a fresh plan gives; the last-end and last-backward figures are those
    # of the operations themselves.
    from collections import OrderedDict

    import zrt_core.schedule.pipeline.plan as plans

    monkeypatch.setattr(plans, "_PLANS", OrderedDict())
    nv = virtual_stages(schedule, pp, vp)
    rng = random.Random(5)

    def times() -> StageTimes:
        fwd = [rng.uniform(0.5, 2.0) for _ in range(nv)]
        bwd = [f * rng.uniform(1.5, 2.5) for f in fwd]
        return StageTimes(fwd, bwd, weight_s=[b * 0.4 for b in bwd],
                          activation_bytes=[rng.uniform(1.0, 3.0) for _ in range(nv)])

    kwargs = {"pp": pp, "vp": vp, "microbatches": m, "p2p_s": 0.07}
    simulate(schedule, times(), **kwargs)
    plan = plans.plan_of(schedule, pp, vp, m)
    second_times = times()
    shared = simulate(schedule, second_times, **kwargs)
    assert plans.plan_of(schedule, pp, vp, m) is plan  # the same plan, not rebuilt
    monkeypatch.setattr(plans, "_PLANS", OrderedDict())
    fresh = simulate(schedule, second_times, **kwargs)
    assert plans.plan_of(schedule, pp, vp, m) is not plan
    assert shared.total_s == fresh.total_s
    assert shared.ranks == fresh.ranks
    assert [o.start_s for o in shared.iter_ops()] == [o.start_s for o in fresh.iter_ops()]
    ops = list(shared.iter_ops())
    assert shared.rank_end_s == tuple(max(o.end_s for o in ops if o.rank == r)
                                      for r in range(pp))
    last: dict[int, float] = {}
    for o in ops:
        stage = o.other_stage if o.kind == "F+BW" else o.stage if o.kind in ("B", "BW") else None
        if stage is not None:
            last[stage] = max(last.get(stage, 0.0), o.start_s)
    assert shared.last_backward_start_s == last
    with pytest.raises(ValueError, match="read-only"):
        plan.kind[0] = 0  # shared between simulations: nobody may change it


def test_the_plan_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1F1B with pp 2 and m micro-batches has 2 ranks × 2m rows = 4m rows; a budget of 120
    # rows keeps m = 8 (32) and m = 16 (64), then m = 12 (48) pushes the oldest out (32 + 64
    # + 48 = 144 > 120, 64 + 48 = 112 ≤ 120); a plan over the budget (m = 32: 128 rows) is
    # not kept.
    from collections import OrderedDict

    import zrt_core.schedule.pipeline.plan as plans

    monkeypatch.setattr(plans, "_PLANS", OrderedDict())
    monkeypatch.setattr(plans, "PLAN_ROWS_KEPT", 120)
    for m in (8, 16, 12, 32):
        plans.plan_of("1f1b", 2, 1, m)
    assert list(plans._PLANS) == [("1f1b", 2, 1, 16), ("1f1b", 2, 1, 12)]
