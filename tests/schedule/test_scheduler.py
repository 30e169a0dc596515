"""The stream scheduler on hand-built graphs: each overlap rule, templates placed per
layer, carried communication across layers, and the accounting identity."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise

import pytest

from zrt_core.cost.backend import NodeCost
from zrt_core.errors import SpecError
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode, TensorMeta
from zrt_core.schedule.scheduler import (
    OverlapRules,
    is_weight_grad,
    schedule_phase,
    schedule_region,
    weight_grad_s,
)
from zrt_core.schedule.timeline import (
    ASYNC,
    DEFERRED,
    NEXT_STEP,
    PIPELINED,
    PREFETCH,
    PREFETCH_BEHIND,
    SYNC,
)


def node(i: int, op: str, category: str = "matmul", *, phase: str = "train_forward",
         layer: int | None = None, **attrs: object) -> OpNode:
    return OpNode(id=i, op=op, category=category, phase=phase, layer_index=layer, attrs=attrs)


def comm(i: int, group: str, kind: str, *, phase: str = "train_forward",
         layer: int | None = None, **attrs: object) -> OpNode:
    return node(i, f"comm.{kind}", "collective", phase=phase, layer=layer, group=group,
                collective=kind, bytes=1 << 20, **attrs)


def costs(times: Mapping[int, float]) -> dict[int, NodeCost]:
    return {i: NodeCost(time_s=t, backend="test", rule="fixed", source="roofline")
            for i, t in times.items()}


def chain(nodes: list[OpNode]) -> list[tuple[int, int]]:
    return [(a.id, b.id) for a, b in pairwise(nodes)]


def check_identity(tl) -> None:  # type: ignore[no-untyped-def]
    assert tl.makespan_s == pytest.approx(tl.compute_s + tl.exposed_comm_total_s + tl.idle_s)
    for group, busy in tl.stream_busy_s.items():
        if group.startswith("comm."):
            g = group[5:]
            assert tl.exposed_comm_s.get(g, 0) + tl.hidden_comm_s.get(g, 0) == \
                pytest.approx(busy)


# -- TP --------------------------------------------------------------------------------------


def tp_model(phase: str = "train_forward") -> OpGraph:
    # embedding 1 → [gemm 4 → tp all-reduce 2 → gemm 3] × 3 layers → head 5
    ns = [node(0, "embedding", "embedding", phase=phase),
          node(1, "mm", phase=phase, layer=0),
          comm(2, "tp", "all_reduce", phase=phase, layer=0),
          node(3, "mm", phase=phase, layer=0),
          node(4, "head", phase=phase)]
    return OpGraph(phase=phase, nodes=ns, edges=chain(ns),
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))])


TP_TIMES = costs({0: 1.0, 1: 4.0, 2: 2.0, 3: 3.0, 4: 5.0})


def test_tp_collective_blocks_compute_by_default() -> None:
    # 1 + 3 × (4 + 2 + 3) + 5 = 33; all 3 × 2 = 6 of TP time exposed.
    tl = schedule_phase(tp_model(), TP_TIMES)
    assert tl.makespan_s == 33.0
    assert tl.compute_s == 27.0
    assert dict(tl.exposed_comm_s) == {"tp": 6.0}
    assert tl.hidden_comm_s.get("tp", 0.0) == 0.0
    check_identity(tl)


def test_tp_comm_overlap_hides_a_fraction_under_the_producer_gemm() -> None:
    # Userbuffers overlap at 50%: each all-reduce starts 1 s before its GEMM ends,
    # 1 s hidden, 1 s exposed per layer: 33 - 3 = 30.
    tl = schedule_phase(tp_model(), TP_TIMES, OverlapRules(tp_comm_overlap=0.5))
    assert tl.makespan_s == 30.0
    assert dict(tl.exposed_comm_s) == {"tp": 3.0}
    assert dict(tl.hidden_comm_s) == {"tp": 3.0}
    ar = [e for e in tl.events if e.name == "comm.all_reduce"]
    assert [(e.start_s, e.end_s, e.layer_index, e.mode) for e in ar] == [
        (4.0, 6.0, 0, PIPELINED), (12.0, 14.0, 1, PIPELINED), (20.0, 22.0, 2, PIPELINED)]
    check_identity(tl)


def test_hidden_fraction_is_bounded_by_the_gemm() -> None:
    # A 1 s GEMM can hide at most 1 s of a 4 s all-reduce, even at tp_comm_overlap = 1.
    ns = [node(0, "mm"), comm(1, "tp", "reduce_scatter"), node(2, "mm")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=chain(ns))
    region = schedule_region(g, costs({0: 1.0, 1: 4.0, 2: 1.0}), OverlapRules(tp_comm_overlap=1.0))
    # all-reduce 0→4 alongside the GEMM 0→1; consumer 4→5.
    assert region.body_s == 5.0
    assert dict(region.exposed_comm_s) == {"tp": 3.0}


def test_all_gather_overlaps_its_consumer_gemm() -> None:
    # SP all-gather 2 s feeding a 3 s GEMM, overlap fraction 0.5: the GEMM may start 1 s
    # before the gather ends: norm 0→1, gather 1→3, GEMM 2→5.
    ns = [node(0, "norm", "norm"), comm(1, "tp", "all_gather"), node(2, "mm")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=chain(ns))
    region = schedule_region(g, costs({0: 1.0, 1: 2.0, 2: 3.0}),
                             OverlapRules(tp_comm_overlap=0.5))
    assert [(e.start_s, e.end_s) for e in region.body] == [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]
    assert dict(region.exposed_comm_s) == {"tp": 1.0}


def test_backward_tp_collective_runs_beside_the_weight_gradient() -> None:
    # dgrad 2 → all-reduce 3 → next layer's dgrad 2; wgrad 2 needs only the first input.
    # Megatron: the input-gradient all-reduce is asynchronous, wgrad runs under it:
    # dgrad 0→2, AR 2→5 (wgrad 2→4 hides 2 s of it), next dgrad 5→7.
    ns = [node(0, "dgrad", phase="train_backward"),
          comm(1, "tp", "all_reduce", phase="train_backward"),
          node(2, "wgrad", phase="train_backward"),
          node(3, "dgrad", phase="train_backward")]
    g = OpGraph(phase="train_backward", nodes=ns, edges=[(0, 1), (0, 2), (1, 3)])
    times = costs({0: 2.0, 1: 3.0, 2: 2.0, 3: 2.0})
    region = schedule_region(g, times)
    assert region.body_s == 7.0
    assert dict(region.exposed_comm_s) == {"tp": 1.0}
    assert dict(region.hidden_comm_s) == {"tp": 2.0}
    # Without the async rule it blocks: 2 + 3 + 2 + 2 = 9.
    blocking = schedule_region(g, times, OverlapRules(tp_backward_async=False))
    assert blocking.body_s == 9.0


# -- views between a collective and the GEMM it is chunked with ------------------------------


def view(i: int, *, phase: str = "train_forward") -> OpNode:
    return OpNode(id=i, op="aten.view", category="view", phase=phase, zero_cost=True)


def test_producer_gemm_is_found_behind_a_chain_of_views() -> None:
    # GEMM 4 → view → view → reduce-scatter 2 → GEMM 3, userbuffers at 50%: the
    # reduce-scatter is chunked with the GEMM behind the views and starts 1 s before it
    # ends: GEMM 0→4, RS 3→5, GEMM 5→8 — as without the views. (Taking the last view as
    # the producer, a 0 s "GEMM" hides nothing: RS 4→6, GEMM 6→9.)
    rules = OverlapRules(tp_comm_overlap=0.5)
    times = costs({0: 4.0, 3: 2.0, 4: 3.0})
    ns = [node(0, "mm"), view(1), view(2), comm(3, "tp", "reduce_scatter"), node(4, "mm")]
    region = schedule_region(OpGraph(phase="train_forward", nodes=ns, edges=chain(ns)), times,
                             rules)
    assert [(e.name, e.start_s, e.end_s) for e in region.body] == [
        ("mm", 0.0, 4.0), ("comm.reduce_scatter", 3.0, 5.0), ("mm", 5.0, 8.0)]
    plain = [ns[0], ns[3], ns[4]]
    assert schedule_region(OpGraph(phase="train_forward", nodes=plain, edges=chain(plain)),
                           times, rules).body_s == region.body_s == 8.0
    # an extra direct edge from the GEMM (listed before or after the views') changes nothing
    for extra in ([(0, 3), *chain(ns)], [*chain(ns), (0, 3)]):
        g = OpGraph(phase="train_forward", nodes=ns, edges=extra)
        assert schedule_region(g, times, rules).body_s == 8.0


def test_producer_gemm_is_the_latest_behind_a_view_of_two_inputs() -> None:
    # GEMMs 1 s and 4 s both feed a cat-like zero-cost node read by the reduce-scatter
    # (2 s, 50%): the later one (0→... 1→5) is the producer; RS starts 1 s before it ends.
    ns = [node(0, "mm"), node(1, "mm"), view(2), comm(3, "tp", "reduce_scatter")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=[(0, 2), (1, 2), (2, 3)])
    region = schedule_region(g, costs({0: 1.0, 1: 4.0, 3: 2.0}),
                             OverlapRules(tp_comm_overlap=0.5))
    assert [(e.name, e.start_s) for e in region.body] == [
        ("mm", 0.0), ("mm", 1.0), ("comm.reduce_scatter", 4.0)]


def test_consumer_gemm_overlaps_a_gather_read_through_a_view() -> None:
    # norm 1 → SP all-gather 2 → view → GEMM 3 at 50%: the GEMM starts 1 s before the
    # gather ends, view or not: norm 0→1, gather 1→3, GEMM 2→5.
    ns = [node(0, "norm", "norm"), comm(1, "tp", "all_gather"), view(2), node(3, "mm")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=chain(ns))
    region = schedule_region(g, costs({0: 1.0, 1: 2.0, 3: 3.0}),
                             OverlapRules(tp_comm_overlap=0.5))
    assert [(e.start_s, e.end_s) for e in region.body] == [(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]


def test_a_view_of_an_async_collective_holds_no_stream() -> None:
    # Backward: dgrad 2 → async all-reduce 3 → view → next dgrad 2; wgrad 2 reads dgrad's
    # input. The view is metadata: wgrad still runs under the all-reduce: dgrad 0→2,
    # AR 2→5, wgrad 2→4, dgrad 5→7 (if the view waited for the AR on the compute stream,
    # wgrad would run 5→7 and the layer take 9 s).
    ns = [node(0, "dgrad", phase="train_backward"),
          comm(1, "tp", "all_reduce", phase="train_backward"),
          view(2, phase="train_backward"),
          node(3, "wgrad", phase="train_backward"),
          node(4, "dgrad", phase="train_backward")]
    g = OpGraph(phase="train_backward", nodes=ns, edges=[(0, 1), (1, 2), (0, 3), (2, 4)])
    region = schedule_region(g, costs({0: 2.0, 1: 3.0, 3: 2.0, 4: 2.0}))
    assert sorted((e.start_s, e.name) for e in region.body) == [
        (0.0, "dgrad"), (2.0, "comm.all_reduce"), (2.0, "wgrad"), (5.0, "dgrad")]
    assert region.body_s == 7.0


# -- EP, CP ----------------------------------------------------------------------------------


def moe_layer() -> OpGraph:
    # router 1 → dispatch a2a 3 → experts 4 → combine a2a 3 → add 1; shared expert 2 from the
    # router output straight to the add.
    ns = [node(0, "router", "moe_router"), comm(1, "ep", "all_to_all"),
          node(2, "shared_expert"), node(3, "experts"), comm(4, "ep", "all_to_all"),
          node(5, "add", "elementwise")]
    edges = [(0, 1), (0, 2), (1, 3), (3, 4), (4, 5), (2, 5)]
    return OpGraph(phase="train_forward", nodes=ns, edges=edges)


MOE_TIMES = costs({0: 1.0, 1: 3.0, 2: 2.0, 3: 4.0, 4: 3.0, 5: 1.0})


def test_ep_all_to_all_blocks_by_default() -> None:
    # router 0→1, dispatch 1→4 (compute waits), shared 4→6, experts 6→10, combine 10→13,
    # add 13→14. Exposed EP: 6.
    region = schedule_region(moe_layer(), MOE_TIMES)
    assert region.body_s == 14.0
    assert dict(region.exposed_comm_s) == {"ep": 6.0}
    assert {e.mode for e in region.body if e.stream == "comm.ep"} == {SYNC}


def test_shared_expert_overlaps_the_dispatch_with_ep_async() -> None:
    # dispatch 1→4 on comm.ep while the shared expert runs 1→3: 1 s of dispatch exposed;
    # experts 4→8, combine 8→11 (all exposed), add 11→12. Compute 8 + exposed 4 = 12.
    region = schedule_region(moe_layer(), MOE_TIMES, OverlapRules(ep_async=True))
    assert region.body_s == 12.0
    assert dict(region.exposed_comm_s) == {"ep": 4.0}
    assert dict(region.hidden_comm_s) == {"ep": 2.0}
    assert {e.mode for e in region.body if e.stream == "comm.ep"} == {ASYNC}


def test_cp_ring_exchange_runs_under_attention() -> None:
    # qkv 1 → KV ring exchange 4 → attention 3: the attention blocks run as chunks arrive,
    # finishing with the exchange: qkv 0→1, exchange 1→5, attention 2→5. 1 s exposed.
    ns = [node(0, "qkv"), comm(1, "cp", "send_recv"), node(2, "attention", "attention")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=chain(ns))
    times = costs({0: 1.0, 1: 4.0, 2: 3.0})
    region = schedule_region(g, times)
    assert region.body_s == 5.0
    assert dict(region.exposed_comm_s) == {"cp": 1.0}
    # Ulysses' all-to-all cannot overlap the attention it feeds: 1 + 4 + 3.
    ns[1] = comm(1, "cp", "all_to_all")
    assert schedule_region(g.with_nodes(ns), times).body_s == 8.0


# -- DP: gradient reduction and parameter gathers carried across layers ----------------------


def backward_with_grad_reduce() -> OpGraph:
    # One backward layer template (3 layers): grad compute 2 → reduce-scatter 3 (no consumer).
    ns = [node(0, "grad", phase="train_backward", layer=0),
          comm(1, "dp", "reduce_scatter", phase="train_backward", layer=0)]
    return OpGraph(phase="train_backward", nodes=ns, edges=[(0, 1)],
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))])


def test_bucketed_grad_reduce_exposes_only_the_tail() -> None:
    # Layers run 2, 1, 0 (backward): bodies 0→2, 2→4, 4→6. Each reduce-scatter queues on
    # comm.dp: 2→5, 5→8, 8→11. Makespan 11; exposed = 11 - 6 = 5 (nothing else runs),
    # hidden 9 - 5 = 4.
    tl = schedule_phase(backward_with_grad_reduce(), costs({0: 2.0, 1: 3.0}))
    assert tl.makespan_s == 11.0
    assert dict(tl.exposed_comm_s) == {"dp": 5.0}
    assert dict(tl.hidden_comm_s) == {"dp": 4.0}
    rs = [(e.start_s, e.end_s, e.layer_index, e.mode) for e in tl.events
          if e.stream == "comm.dp"]
    assert rs == [(2.0, 5.0, 2, DEFERRED), (5.0, 8.0, 1, DEFERRED), (8.0, 11.0, 0, DEFERRED)]
    check_identity(tl)


def test_grad_reduce_without_overlap_is_serial() -> None:
    # 3 × (2 + 3) = 15, all 9 s of reduce-scatter exposed.
    tl = schedule_phase(backward_with_grad_reduce(), costs({0: 2.0, 1: 3.0}),
                        OverlapRules(overlap_grad_reduce=False))
    assert tl.makespan_s == 15.0
    assert dict(tl.exposed_comm_s) == {"dp": 9.0}


def forward_with_param_gather() -> OpGraph:
    # ZeRO-3 / FSDP: each layer's parameters are all-gathered, then the layer computes.
    ns = [comm(0, "dp", "all_gather", layer=0), node(1, "layer", layer=0)]
    return OpGraph(phase="train_forward", nodes=ns, edges=[(0, 1)],
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))])


@pytest.mark.parametrize(("gather", "makespan", "exposed"), [
    # gather 2 < compute 3: only the first layer's gather is exposed: 2 + 3 × 3 = 11.
    (2.0, 11.0, 2.0),
    # gather 4 > compute 3: a + (n - 1)·max(a, T) + T = 4 + 2 × 4 + 3 = 15; exposed 4 + 1 + 1.
    (4.0, 15.0, 6.0),
])
def test_param_gather_is_prefetched_one_layer_ahead(gather: float, makespan: float,
                                                    exposed: float) -> None:
    tl = schedule_phase(forward_with_param_gather(), costs({0: gather, 1: 3.0}))
    assert tl.makespan_s == makespan
    assert tl.exposed_comm_s["dp"] == pytest.approx(exposed)
    assert tl.compute_s == 9.0
    assert {e.mode for e in tl.events if e.stream == "comm.dp"} == {PREFETCH}
    check_identity(tl)


def test_param_gather_without_prefetch_is_serial() -> None:
    tl = schedule_phase(forward_with_param_gather(), costs({0: 2.0, 1: 3.0}),
                        OverlapRules(overlap_param_gather=False))
    assert tl.makespan_s == 15.0
    assert dict(tl.exposed_comm_s) == {"dp": 6.0}


def backward_with_gather_and_reduce() -> OpGraph:
    # FSDP backward: each layer's parameters gathered again (2), its backward (4), its
    # gradients reduce-scattered (3), the gather and the reduction on the same dp stream
    bwd = "train_backward"
    ns = [comm(0, "dp", "all_gather", phase=bwd, layer=0),
          node(1, "layer_bwd", phase=bwd, layer=0),
          comm(2, "dp", "reduce_scatter", phase=bwd, layer=0)]
    return OpGraph(phase="train_backward", nodes=ns, edges=[(0, 1), (1, 2)],
                   templates=[LayerTemplate("dense", 0, (0, 1, 2))])


@pytest.mark.parametrize(("behind", "mode", "makespan"), [
    # FSDP2 / Megatron-FSDP: layer k's gather, issued when layer k-1 starts, goes before
    # k-1's reduce-scatter: gathers 0-2, 2-4, 9-11; layers 2-6, 6-10, 11-15; reductions
    # 6-9, 11-14, 15-18 (tests/schedule/test_timeline.py works the same numbers).
    (False, PREFETCH, 18.0),
    # DeepSpeed's ZeRO-3 of 2021: each gather waits for the reduce-scatter before it:
    # layers 2-6, 11-15, 20-24; the last reduce-scatter 24-27.
    (True, PREFETCH_BEHIND, 27.0),
])
def test_backward_gather_and_reduce_share_the_dp_stream(behind: bool, mode: str,
                                                        makespan: float) -> None:
    tl = schedule_phase(backward_with_gather_and_reduce(), costs({0: 2.0, 1: 4.0, 2: 3.0}),
                        OverlapRules(gather_behind_reduce=behind))
    assert tl.makespan_s == makespan
    assert {e.mode for e in tl.events if e.name == "comm.all_gather"} == {mode}
    check_identity(tl)


def test_optimizer_param_gather_runs_under_the_next_step() -> None:
    # Distributed optimizer: step 2 then all-gather 3; with --overlap-param-gather the
    # gather runs under the next forward: the optimizer phase takes 2, the gather is hidden.
    ns = [node(0, "adam", "optimizer", phase="optimizer"),
          comm(1, "dp", "all_gather", phase="optimizer")]
    g = OpGraph(phase="optimizer", nodes=ns, edges=[(0, 1)])
    tl = schedule_phase(g, costs({0: 2.0, 1: 3.0}))
    assert tl.compute_s == 2.0
    assert tl.exposed_comm_s.get("dp", 0.0) == 0.0
    assert dict(tl.hidden_comm_s) == {"dp": 3.0}
    assert [e.mode for e in tl.events if e.stream == "comm.dp"] == [NEXT_STEP]


# -- serving ---------------------------------------------------------------------------------


def test_serving_phases_overlap_nothing() -> None:
    # Decode under serving rules: even the backward-style async hint blocks.
    ns = [node(0, "mm", phase="decode"), comm(1, "tp", "all_reduce", phase="decode",
                                              overlap="async"),
          node(2, "independent", phase="decode")]
    g = OpGraph(phase="decode", nodes=ns, edges=[(0, 1)])
    region = schedule_region(g, costs({0: 1.0, 1: 2.0, 2: 1.0}))
    assert region.body_s == 4.0
    assert dict(region.exposed_comm_s) == {"tp": 2.0}
    # The same graph under training rules runs the independent op beside the collective.
    train = schedule_region(g, costs({0: 1.0, 1: 2.0, 2: 1.0}), OverlapRules())
    assert train.body_s == 3.0


def test_overlap_hints_override_the_defaults() -> None:
    rules = OverlapRules()
    assert rules.plan(comm(0, "tp", "all_reduce", overlap="async")).mode == ASYNC
    assert rules.plan(comm(0, "ep", "all_to_all", overlap="microbatch")).mode == SYNC
    assert rules.plan(comm(0, "dp", "all_reduce", phase="optimizer",
                           overlap="backward")).mode == DEFERRED
    assert rules.plan(comm(0, "tp", "all_gather", overlap="consumer")).mode == SYNC  # 0 %
    plan = OverlapRules(tp_comm_overlap=0.25).plan(comm(0, "tp", "all_gather",
                                                        overlap="consumer"))
    assert (plan.mode, plan.fraction, plan.side) == (PIPELINED, 0.25, "consumer")
    with pytest.raises(SpecError, match="not a known hint"):
        rules.plan(comm(0, "tp", "all_reduce", overlap="sometimes"))


# -- templates, stages, graph checks ---------------------------------------------------------


def two_kind_model(phase: str = "train_forward") -> OpGraph:
    # embedding, dense template (layers 0, 1), MoE template (layers 2, 3, 4), head.
    ns = [node(0, "embedding", "embedding", phase=phase),
          node(1, "dense", phase=phase, layer=0),
          node(2, "moe", phase=phase, layer=2),
          node(3, "head", phase=phase)]
    if phase == "train_backward":
        ns = [ns[3], ns[2], ns[1], ns[0]]
    return OpGraph(phase=phase, nodes=ns, edges=chain(ns),
                   templates=[LayerTemplate("dense", 0, (0, 1)),
                              LayerTemplate("moe", 2, (2, 3, 4))])


KIND_TIMES = costs({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0})


def test_templates_are_placed_once_per_layer_in_order() -> None:
    tl = schedule_phase(two_kind_model(), KIND_TIMES)
    # 1 + 2 × 2 + 3 × 3 + 4 = 18
    assert tl.makespan_s == 18.0
    assert [(e.name, e.layer_index, e.start_s) for e in tl.events] == [
        ("embedding", None, 0.0), ("dense", 0, 1.0), ("dense", 1, 3.0), ("moe", 2, 5.0),
        ("moe", 3, 8.0), ("moe", 4, 11.0), ("head", None, 14.0)]
    # two layer regions scheduled, seven placements
    assert len({id(p.region) for p in tl.placements}) == 4
    assert len(tl.placements) == 7


def test_backward_runs_layers_in_reverse() -> None:
    tl = schedule_phase(two_kind_model("train_backward"), KIND_TIMES)
    assert [e.layer_index for e in tl.events] == [None, 4, 3, 2, 1, 0, None]
    assert tl.events[0].name == "head"


def test_pipeline_stage_takes_its_layers_and_its_side() -> None:
    # Stage 0 of 2: layers 0-2 with the embedding; stage 1: layers 3-4 with the head.
    first = schedule_phase(two_kind_model(), KIND_TIMES, layers=range(0, 3), head_side=False)
    last = schedule_phase(two_kind_model(), KIND_TIMES, layers=range(3, 5),
                          embedding_side=False)
    assert first.makespan_s == 1 + 2 + 2 + 3  # 8
    assert last.makespan_s == 3 + 3 + 4      # 10
    # In backward the head side comes first and the embedding side last.
    bwd_last = schedule_phase(two_kind_model("train_backward"), KIND_TIMES,
                              layers=range(3, 5), embedding_side=False)
    assert [e.name for e in bwd_last.events] == ["head", "moe", "moe"]
    with pytest.raises(SpecError, match="nothing to schedule"):
        schedule_phase(two_kind_model(), KIND_TIMES, layers=range(7, 9), embedding_side=False,
                       head_side=False)


def test_edges_out_of_listed_order_are_sorted_topologically() -> None:
    # Listed b, a but a feeds b: a runs first.
    ns = [node(1, "b"), node(0, "a")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=[(0, 1)])
    region = schedule_region(g, costs({0: 1.0, 1: 2.0}))
    assert [(e.name, e.start_s) for e in region.body] == [("a", 0.0), ("b", 1.0)]
    cyclic = OpGraph(phase="train_forward", nodes=ns, edges=[(0, 1), (1, 0)])
    with pytest.raises(SpecError, match="dependency cycle"):
        schedule_region(cyclic, costs({0: 1.0, 1: 2.0}))


def test_bad_inputs_are_named() -> None:
    g = OpGraph(phase="train_forward", nodes=[node(0, "mm")])
    with pytest.raises(SpecError, match=r"node 0 \(mm\) has no cost"):
        schedule_region(g, {})
    free = OpGraph(phase="train_forward",
                   nodes=[OpNode(id=0, op="view", category="view", phase="train_forward",
                                 zero_cost=True)])
    assert schedule_region(free, {}).body == ()
    nogroup = OpGraph(phase="train_forward",
                      nodes=[node(0, "comm.all_reduce", "collective", collective="all_reduce")])
    with pytest.raises(SpecError, match="has no attrs\\['group'\\]"):
        schedule_region(nogroup, costs({0: 1.0}))


def test_event_args_say_what_and_where_from() -> None:
    ns = [OpNode(id=0, op="aten.mm", category="matmul", phase="train_forward", flops=2000,
                 bytes_read=30, bytes_written=10, module_path="model.layers.0.mlp")]
    g = OpGraph(phase="train_forward", nodes=ns)
    cost = {0: NodeCost(time_s=1e-3, backend="roofline", rule="gemm", source="roofline")}
    (event,) = schedule_region(g, cost).body
    assert dict(event.args) == {"op": "aten.mm", "category": "matmul", "flops": 2000,
                                "bytes": 40, "module": "model.layers.0.mlp",
                                "rule": "roofline:gemm", "source": "roofline"}


def test_weight_gradient_nodes_and_their_time() -> None:
    weight = TensorMeta((4, 4), "bfloat16", param="model.layers.0.mlp.weight")
    ns = [OpNode(id=0, op="mm", category="matmul", phase="train_backward", layer_index=0,
                 attrs={"grad": "input"}),
          OpNode(id=1, op="mm", category="matmul", phase="train_backward", layer_index=0,
                 attrs={"grad": "weight"}),
          OpNode(id=2, op="mm", category="matmul", phase="train_backward", layer_index=0,
                 outputs=[weight]),
          OpNode(id=3, op="mm", category="matmul", phase="train_backward")]
    g = OpGraph(phase="train_backward", nodes=ns,
                templates=[LayerTemplate("dense", 0, (0, 1, 2, 3))])
    assert [is_weight_grad(n) for n in ns] == [False, True, True, False]
    # (0.5 + 0.25) per layer × 4 layers = 3; layers 0-1 only: 1.5.
    times = costs({0: 1.0, 1: 0.5, 2: 0.25, 3: 2.0})
    assert weight_grad_s(g, times) == 3.0
    assert weight_grad_s(g, times, layers=range(2)) == 1.5
