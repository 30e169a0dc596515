"""Collective formulas and tier placement on the toy network (conftest.py).

Tiers, innermost first: t0 = 4 devices, 100 GB/s x 0.5 = 5e10 B/s, alpha 1 us;
t1 = 16 devices, 40 x 0.5 = 2e10 B/s, 5 us; t2 = unbounded, 10 x 1.0 = 1e10 B/s, 10 us.
"""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cost.backend import PriceSource
from zrt_core.cost.collectives import collective_cost
from zrt_core.cost.errors import CostError


def test_group_inside_the_innermost_tier_rings_over_it(toy):
    cost = collective_cost("all_reduce", 1e8, 4, 4, toy)
    # ring: 2*(4-1)/4 * 1e8 / 5e10 = 3e-3 wire + 2*(4-1) steps * 1 us; tree would be
    # 2e8 / (0.9 * 5e10) = 4.44e-3 + 6 us, so ring
    assert (cost.rule, cost.detail["tier"], cost.bound) == ("ring_all_reduce", "t0", "network")
    assert cost.memory_s == pytest.approx(3e-3, rel=1e-12)
    assert cost.overhead_s == pytest.approx(6e-6, rel=1e-12)
    assert cost.time_s == pytest.approx(3.006e-3, rel=1e-12)
    assert cost.detail["candidates_s"]["tree"] == pytest.approx(2e8 / 4.5e10 + 6e-6, rel=1e-12)


def test_spanning_group_large_message_rings_at_the_bottleneck_bandwidth(toy):
    cost = collective_cost("all_reduce", 1e8, 64, 64, toy)
    # members per domain: t0 4, t1 16, t2 64. Ring bandwidth min(1*5e10, 4*2e10, 16*1e10)
    # = 5e10; steps per tier 64-16 = 48, 16-4 = 12, 4-1 = 3, doubled for all-reduce:
    # latency 2*(48*1 + 12*5 + 3*10) us = 276 us; wire 2*63/64 * 1e8 / 5e10 = 3.9375e-3
    assert cost.rule == "ring_all_reduce"
    assert cost.time_s == pytest.approx(3.9375e-3 + 276e-6, rel=1e-12)
    assert [t["members"] for t in cost.detail["tiers"]] == [4, 16, 64]
    # hierarchical: per tier 2*(3/4) * shard / B with shards 1e8, 2.5e7, 6.25e6 over
    # 5e10, 2e10, 1e10 = 3e-3 + 1.875e-3 + 9.375e-4; latency 2*3*(1 + 5 + 10) us = 96 us
    assert cost.detail["candidates_s"]["hierarchical"] == pytest.approx(5.8125e-3 + 96e-6,
                                                                        rel=1e-12)


def test_spanning_group_small_message_picks_the_tree(toy):
    cost = collective_cost("all_reduce", 1e4, 64, 64, toy)
    # tree: 2*1e4 / (0.9*5e10) + 2*((4-1)*1 + log2(4)*5 + log2(4)*10) us = 66 us + 0.44 us;
    # ring pays 276 us of latency
    assert cost.rule == "tree_all_reduce"
    assert cost.time_s == pytest.approx(2e4 / 4.5e10 + 66e-6, rel=1e-12)
    assert cost.bound == "latency"


def test_strided_group_skips_the_tiers_it_does_not_use(toy):
    # dp=4 with tp=4: members 4 ranks apart over 16 ranks -> one per t0 domain, all in t1
    cost = collective_cost("all_reduce", 1e8, 4, 16, toy)
    # ring over t1 only: 2*3/4 * 1e8 / (1 * 2e10) = 7.5e-3; steps 4-1 = 3 -> 2*3*5 us
    assert cost.detail["tier"] == "t1"
    assert [t["tier"] for t in cost.detail["tiers"]] == ["t1"]
    assert cost.time_s == pytest.approx(7.5e-3 + 30e-6, rel=1e-12)


def test_all_gather_ring_and_forced_hierarchical(toy):
    ring = collective_cost("all_gather", 1.6e8, 16, 16, toy)
    # ring bandwidth min(5e10, 4*2e10) = 5e10: 15/16 * 1.6e8 / 5e10 = 3e-3;
    # steps (16-4)*1 us + (4-1)*5 us = 27 us
    assert ring.rule == "ring_all_gather"
    assert ring.time_s == pytest.approx(3.027e-3, rel=1e-12)
    hier = collective_cost("all_gather", 1.6e8, 16, 16, toy, algorithm="hierarchical")
    # t0: 3/4 * 1.6e8 / 5e10 = 2.4e-3 + 3 us; t1: 3/4 * 4e7 / 2e10 = 1.5e-3 + 15 us
    assert hier.rule == "hierarchical_all_gather"
    assert hier.time_s == pytest.approx(3.918e-3, rel=1e-12)


def test_reduce_scatter_matches_all_gather(toy):
    rs = collective_cost("reduce_scatter", 1.6e8, 16, 16, toy)
    assert rs.time_s == pytest.approx(3.027e-3, rel=1e-12)


def test_all_to_all_splits_peer_traffic_by_tier(toy):
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, toy)
    # to the 3 peers in the t0 domain: 3/16 * 1.6e8 = 3e7 over 5e10 = 6e-4;
    # to the 12 beyond it: 12/16 * 1.6e8 = 1.2e8 over 2e10 = 6e-3 (both at once) + 5 us
    assert cost.rule == "pairwise_all_to_all"
    assert cost.time_s == pytest.approx(6.005e-3, rel=1e-12)


def test_send_recv_crosses_the_outermost_tier_of_its_group(toy):
    # pp=2 over 32 ranks: stages 16 apart, across t1 domains
    cost = collective_cost("send_recv", 1e7, 2, 32, toy)
    # 1e7 / 1e10 + 10 us
    assert (cost.rule, cost.detail["tier"]) == ("p2p_send_recv", "t2")
    assert cost.time_s == pytest.approx(1.01e-3, rel=1e-12)
    near = collective_cost("send_recv", 1e7, 2, 2, toy)
    # neighbours in one t0 domain: 1e7 / 5e10 + 1 us
    assert near.time_s == pytest.approx(2.01e-4, rel=1e-12)


def test_broadcast_is_a_pipelined_ring(toy):
    cost = collective_cost("broadcast", 1e8, 4, 4, toy)
    # 1e8 / 5e10 + 3 * 1 us
    assert cost.time_s == pytest.approx(2.003e-3, rel=1e-12)


def test_a_group_of_one_is_free(toy):
    cost = collective_cost("all_reduce", 1e8, 1, 1, toy)
    assert (cost.time_s, cost.source) == (0.0, PriceSource.FREE)


@pytest.mark.parametrize(("args", "message"), [
    (("all_sum", 1e6, 4, 4), "unknown collective 'all_sum'"),
    (("all_reduce", 1e6, 8, 4), "group of 8 cannot spread over 4 ranks"),
    (("all_reduce", -1.0, 4, 4), "negative message size"),
])
def test_bad_collectives_are_errors(toy, args, message):
    with pytest.raises(CostError, match=message):
        collective_cost(*args, toy)


def test_an_algorithm_the_collective_lacks_is_an_error(toy):
    with pytest.raises(CostError, match="all_gather has no 'tree' algorithm"):
        collective_cost("all_gather", 1e6, 4, 4, toy, algorithm="tree")


def test_dedup_all_to_all_sends_a_token_once_per_destination_gpu_and_node(toy):
    # 16 ranks over t0 (4 per domain) and t1; 16 experts, 2 per token; 1.6e8 B holds one
    # row per (token, expert): one copy of the tokens is 8e7 B.
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, toy, "dedup", routing=(16, 2))
    # t0: a GPU holds 1 expert; P(hit) = 1 - 15/16 * 14/15 = 0.125; copies over NVLink
    #     (16 - 16/4) * 0.125 = 1.5 -> 8e7 * 1.5 / 5e10 = 2.4e-3 s
    # t1: 4 domains of 4 experts; P(hit) = 1 - 12/16 * 11/15 = 0.45; other domains hit
    #     3 * 0.45 = 1.35 -> 8e7 * 1.35 / 2e10 = 5.4e-3 s; the slower tier bounds: 5.4e-3
    #     + alpha(t1) 5 us
    assert cost.rule == "dedup_all_to_all"
    assert cost.time_s == pytest.approx(5.4e-3 + 5e-6, rel=1e-12)
    # Megatron's alltoall dispatcher (pairwise): t1 carries 12/16 of 1.6e8 B over 2e10 B/s
    pairwise = collective_cost("all_to_all", 1.6e8, 16, 16, toy)
    assert pairwise.time_s == pytest.approx(6e-3 + 5e-6, rel=1e-12)


def test_dedup_all_to_all_with_one_expert_per_token_is_the_pairwise_one(toy):
    # top 1: nothing to deduplicate; t1 share 12/16 * 8e7 / 2e10 = 3e-3 either way
    dedup = collective_cost("all_to_all", 8e7, 16, 16, toy, "dedup", routing=(16, 1))
    pairwise = collective_cost("all_to_all", 8e7, 16, 16, toy)
    assert dedup.time_s == pytest.approx(pairwise.time_s, rel=1e-12)
    assert dedup.time_s == pytest.approx(3e-3 + 5e-6, rel=1e-12)


def test_dedup_all_to_all_needs_the_routing(toy):
    with pytest.raises(CostError, match="needs"):
        collective_cost("all_to_all", 1e6, 16, 16, toy, "dedup")
    with pytest.raises(CostError, match="no 'dedup'"):
        collective_cost("all_reduce", 1e6, 16, 16, toy, "dedup")


def _with_a2a(hw, **by_tier):
    """``hw`` with ``all_to_all_efficiency`` set on the named tiers."""
    from attrs import evolve

    return evolve(hw, interconnect=tuple(
        evolve(t, all_to_all_efficiency=by_tier.get(t.name)) for t in hw.interconnect))


def test_all_to_all_efficiency_prices_only_the_all_to_all(toy):
    # t1 all-to-all efficiency 0.25 (its ring efficiency is 0.5): 40 GB/s x 0.25 = 1e10 B/s
    hw = _with_a2a(toy, t1=0.25)
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, hw)
    # t0 (no field, its efficiency): 3/16 * 1.6e8 = 3e7 over 5e10 = 6e-4;
    # t1: 12/16 * 1.6e8 = 1.2e8 over 1e10 = 1.2e-2 (was 6e-3 at 0.5) + alpha(t1) 5 us
    assert cost.time_s == pytest.approx(1.2e-2 + 5e-6, rel=1e-12)
    # the ring collectives over the same tiers keep the tier's efficiency (3.027e-3 above)
    assert collective_cost("all_gather", 1.6e8, 16, 16, hw).time_s == pytest.approx(
        3.027e-3, rel=1e-12)
    assert collective_cost("all_reduce", 1e8, 64, 64, hw).time_s == pytest.approx(
        3.9375e-3 + 276e-6, rel=1e-12)
    # so does a flat (pairwise) all-gather: 12/16 * 1.6e8 / 2e10 = 6e-3 + 5 us
    flat = collective_cost("all_gather", 1.6e8, 16, 16, hw, algorithm="pairwise")
    assert flat.time_s == pytest.approx(6e-3 + 5e-6, rel=1e-12)


def test_all_to_all_efficiency_leaves_the_dedup_all_to_all_at_the_tier_rate(toy):
    # DeepEP / HybridEP keep the tier's efficiency: as test_dedup_all_to_all_..., 1.35
    # copies of 8e7 B cross t1 at 40 x 0.5 = 2e10 B/s: 5.4e-3 + alpha(t1) 5 us
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, _with_a2a(toy, t1=0.25), "dedup",
                           routing=(16, 2))
    assert cost.time_s == pytest.approx(5.4e-3 + 5e-6, rel=1e-12)


def test_all_to_all_efficiency_on_an_inner_tier_can_make_it_the_bottleneck(toy):
    # t0 at 0.05: 100 GB/s x 0.05 = 5e9 B/s carries 3e7 B in 6e-3 s; t1 (its efficiency,
    # 2e10) carries 1.2e8 B in 6e-3 s: a tie, 6e-3 + 5 us
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, _with_a2a(toy, t0=0.05))
    assert cost.time_s == pytest.approx(6e-3 + 5e-6, rel=1e-12)
    # at 0.03 (3e9 B/s) t0 bounds: 3e7 / 3e9 = 1e-2 + 5 us
    cost = collective_cost("all_to_all", 1.6e8, 16, 16, _with_a2a(toy, t0=0.03))
    assert cost.time_s == pytest.approx(1e-2 + 5e-6, rel=1e-12)


def test_all_to_all_efficiency_parses_from_a_pack_and_rejects_bad_values(toy_yaml):
    import yaml

    from zrt_core.errors import SpecError
    from zrt_core.hardware import HardwareSpec

    data = yaml.safe_load(toy_yaml)
    assert HardwareSpec.from_mapping(data).interconnect[1].all_to_all_efficiency is None
    data["interconnect"][1]["all_to_all_efficiency"] = 0.7
    assert HardwareSpec.from_mapping(data).interconnect[1].all_to_all_efficiency == 0.7
    data["interconnect"][1]["all_to_all_efficiency"] = 1.2
    with pytest.raises(SpecError, match=r"interconnect\[1\].all_to_all_efficiency must be "
                                        r"<= 1.0"):
        HardwareSpec.from_mapping(data)


def test_nccls_tuner_never_picks_the_hierarchical_algorithm(toy):
    # the same 16-rank all-gather on a pack whose collectives are NCCL's (vendor nvidia):
    # the candidates are NCCL's (ring, no NVLS tier here), hierarchical only when named
    nccl = evolve(toy, vendor="nvidia")
    cost = collective_cost("all_gather", 1.6e8, 16, 16, nccl)
    assert cost.detail["algorithm"] == "ring"
    assert set(cost.detail.get("candidates_s", {"ring": 0})) == {"ring"}
    assert "hierarchical" in collective_cost("all_gather", 1.6e8, 16, 16, toy
                                             ).detail["candidates_s"]
    forced = collective_cost("all_gather", 1.6e8, 16, 16, nccl, algorithm="hierarchical")
    assert forced.rule == "hierarchical_all_gather"
