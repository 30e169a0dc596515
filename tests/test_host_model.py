"""The host-launch model of an eager training step (zrt_core.estimate.host)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from zrt_core.cost.backend import NodeCost
from zrt_core.estimate.host import (
    HostModel,
    exposed_host_s,
    issue_order_s,
    launches,
    layer_host,
    paired_host_s,
    phase_host,
)
from zrt_core.ir.graph import OpGraph, OpNode


def node(i: int, op: str, category: str = "elementwise", *, layer: int | None = 0,
         phase: str = "train_forward", **attrs: object) -> OpNode:
    return OpNode(id=i, op=op, category=category, phase=phase, layer_index=layer, attrs=attrs)


def costs(times: Mapping[int, float]) -> dict[int, NodeCost]:
    return {i: NodeCost(time_s=t, backend="test", rule="fixed", source="roofline")
            for i, t in times.items()}


def moe_layer() -> tuple[OpGraph, dict[int, NodeCost]]:
    # norm, router, [sync] dispatch, grouped GEMM over 4 local experts, combine, a view
    ns = [node(0, "aten.rms_norm", "norm"), node(1, "aten.topk", "moe_router"),
          node(2, "zrt.moe_dispatch", "moe_dispatch"),
          node(3, "aten._grouped_mm", "matmul", group_rows=(8, 8, 8, 8)),
          node(4, "zrt.moe_combine", "moe_combine"), node(5, "aten.view", "view")]
    return (OpGraph(phase="train_forward", nodes=ns),
            costs({0: 1e-5, 1: 1e-5, 2: 2e-5, 3: 4e-5, 4: 2e-5, 5: 0.0}))


def test_launches_per_node() -> None:
    g, c = moe_layer()
    # the grouped GEMM is one cuBLAS launch per local expert (TE's multi-stream loop);
    # a view (and anything free) launches nothing
    assert [launches(n, c[n.id]) for n in g.nodes] == [1, 1, 1, 4, 1, 0]
    assert launches(g.nodes[0], None) == 0


def test_layer_host_splits_at_the_dispatch_sync() -> None:
    g, c = moe_layer()
    lh = layer_host(g, c, moe_sync=True)[0]
    # before: norm + router (2 launches, 20 µs); after: dispatch, 4 GEMMs, combine (6, 80 µs)
    assert (lh.launches_before, lh.launches_after, lh.syncs) == (2, 6, True)
    assert lh.gpu_before_s == pytest.approx(2e-5)
    assert lh.gpu_after_s == pytest.approx(8e-5)
    drop = layer_host(g, c, moe_sync=False)[0]
    assert (drop.launches_before, drop.launches_after, drop.syncs) == (8, 0, False)


def test_exposed_host_with_syncs_is_per_segment() -> None:
    g, c = moe_layer()
    fwd = layer_host(g, c, moe_sync=True)
    bwd = phase_host(g, c)  # the same nodes stand in for a backward: 8 launches, 100 µs
    model = HostModel(launch_s=20e-6)
    # two layers of this kind, kernels in issue order (forward_s = the 200 µs node sum:
    # scale 1; issue_order_s): norm and router end at 30 and 50 µs (each waits for its
    # 20 µs launch), the sync drains them: both at 50; dispatch ends at 90, the 4 GEMM
    # kernels of 10 µs wait for their launches (the 4th issued at 70 + 80 = 150) → 160,
    # combine → 190; layer 1: 200, 220, sync, 260, 330, 360 → 360 − 200 = 160 µs exposed
    # (the totals' max(host, device) per segment gave 20 + 60 + 40 = 120); the backward
    # (no sync, in issue order from an empty queue): 30, 50, 80, 150, 180; 190, 210, 240,
    # 310, 340 → 140 µs (its totals: 320 − 200 = 120)
    f, b = exposed_host_s(model, [0, 0], fwd, bwd, forward_s=2e-4, backward_s=2e-4)
    assert f == pytest.approx(160e-6)
    assert b == pytest.approx(140e-6)


def test_issue_order_runs_the_device_behind_the_host() -> None:
    # 10 µs launches; two launch-heavy nodes (5 launches, 10 µs of kernels each) then one
    # long kernel (1 launch, 200 µs): totals 110 µs of host against 220 µs of device, so
    # max(host, device) says the host hides; in order the device waits for each small kernel
    # (done at 50 + 2 and 100 + 2 µs), then the long one starts at 110: 310 µs
    seq = ((5, 10e-6), (5, 10e-6), (1, 200e-6))
    host, dev = issue_order_s(seq, 10e-6, 1.0, 0.0, 0.0)
    assert host == pytest.approx(110e-6)
    assert dev == pytest.approx(310e-6)
    # the long kernel first: it covers the other launches: 10 + 200 + 10 + 10 = 230 µs
    host, dev = issue_order_s(seq[::-1], 10e-6, 1.0, 0.0, 0.0)
    assert dev == pytest.approx(230e-6)
    # a device already busy until 1 ms absorbs the launches: 1 ms + 220 µs
    assert issue_order_s(seq, 10e-6, 1.0, 0.0, 1e-3)[1] == pytest.approx(1.22e-3)


def test_exposed_host_without_syncs_runs_ahead_over_the_micro_batch() -> None:
    g, c = moe_layer()
    fwd = layer_host(g, c, moe_sync=False)
    bwd = phase_host(g, c)
    # 2 layers: forward 16 + backward 16 launches = 32 × 10 µs = 320 µs of host against
    # 200 + 200 µs of device: the host hides entirely
    assert exposed_host_s(HostModel(launch_s=10e-6), [0, 0], fwd, bwd, 2e-4, 2e-4) == (0.0, 0.0)
    # at 20 µs: 640 − 400 = 240 µs, all counted on the backward
    f, b = exposed_host_s(HostModel(launch_s=20e-6), [0, 0], fwd, bwd, 2e-4, 2e-4)
    assert (f, b) == (0.0, pytest.approx(240e-6))
    # off
    assert exposed_host_s(HostModel(), [0, 0], fwd, bwd, 2e-4, 2e-4) == (0.0, 0.0)


def test_batch_level_ep_overlap_interleaves_the_backward_launches_with_the_forward_syncs(
        ) -> None:
    # Megatron-Core's combined 1F1B issues forward layer k and the partner micro-batch's
    # backward layer L−1−k as one sequence; the forward's routing sync splits each pair into
    # [forward before the sync] and [forward after it + the backward layer]
    g, c = moe_layer()
    fwd = layer_host(g, c, moe_sync=True)  # before: 2 launches, 20 µs; after: 6, 80 µs
    bwd = phase_host(g, c)  # 8 launches, 100 µs per layer
    model = HostModel(launch_s=12e-6)
    # per pair: 2 × 12 = 24 µs of host against 20 → 4; (6 + 8) × 12 = 168 against 180 → 0;
    # two pairs: 8 µs, split as the launches are (16 forward, 16 backward): 4 and 4
    f, b = paired_host_s(model, [0, 0], fwd, bwd, forward_s=2e-4, backward_s=2e-4)
    assert (f, b) == (pytest.approx(4e-6), pytest.approx(4e-6))
    # unpaired, in issue order (12 µs launches): 22, 34, sync, 66, 106, 126; 136, 146, sync,
    # 178, 218, 238 → 238 − 200 = 38 µs (the totals' max per segment: 4); the backward in
    # issue order: 22, 34, 56, 96, 116; 126, 136, 156, 196, 216 → 16 µs (its totals, 192
    # µs of launches against 200: 0)
    assert exposed_host_s(model, [0, 0], fwd, bwd, 2e-4, 2e-4) == (pytest.approx(38e-6),
                                                                   pytest.approx(16e-6))
    # the embedding/head side (None) is a segment of its own, forward and backward
    # (forward: 8 launches, 100 µs, no sync; backward: 8 launches of free kernels)
    side = {**fwd, None: layer_host(g, c, moe_sync=False)[0]}
    f2, b2 = paired_host_s(model, [None, 0], side, {**bwd, None: (8, 0.0)}, 2e-4, 1e-4)
    # layer pair: 24 − 20 = 4 and 168 − 180 < 0; side: forward 8 × 12 = 96 − 100 < 0,
    # backward 96 − 0 = 96 → 100 µs, split 16 : 16 launches
    assert (f2, b2) == (pytest.approx(50e-6), pytest.approx(50e-6))
    assert paired_host_s(HostModel(), [0, 0], fwd, bwd, 2e-4, 2e-4) == (0.0, 0.0)


def test_the_cast_feeding_a_grouped_gemm_launches_per_expert() -> None:
    # TE's GroupedLinear casts each expert's split: a quantize feeding a 3-group GEMM is 3
    # launches, one feeding a plain GEMM is 1
    ns = [node(0, "precision.quantize"), node(1, "aten._grouped_mm", "matmul",
                                              group_rows=(4, 4, 4)),
          node(2, "precision.quantize"), node(3, "aten.mm", "matmul")]
    g = OpGraph(phase="train_forward", nodes=ns, edges=((0, 1), (2, 3)))
    c = costs({0: 1e-6, 1: 1e-6, 2: 1e-6, 3: 1e-6})
    assert layer_host(g, c, moe_sync=False)[0].launches_before == 3 + 3 + 1 + 1
    assert phase_host(g, c)[0][:2] == (8, pytest.approx(4e-6))


def _record(**changes: object) -> dict:
    record = {"id": "x", "workload": "train", "source": "NeMo 25.09 performance summary",
              "model": {"name": "Qwen3-30B-A3B", "hf_config": {"model_type": "gpt2"}},
              "hardware": "nvidia_b200", "num_gpus": 8, "seq_len": 64, "global_batch": 8,
              "parallel": {"tp": 1, "pp": 1, "dp": 8}, "notes": ""}
    record.update(changes)
    return record


def test_records_name_token_drop_and_whole_layer_cuda_graphs() -> None:
    from zrt_core.estimate.training import case_from_record

    plain = case_from_record(_record(hardware="nvidia_h100_sxm"))
    assert (plain.moe_token_drop, plain.cuda_graph) == (False, "none")
    drop = case_from_record(_record(notes="... Token-drop MoE run."))
    # Megatron-Bridge 25.09's Qwen3-30B B200 recipe: cuda_graphs: true (whole layers)
    assert (drop.moe_token_drop, drop.cuda_graph) == (True, "full")
    assert any("CUDA graphs" in a for a in drop.assumptions)
    other = case_from_record(_record(model={"name": "Qwen3-235B-A22B",
                                            "hf_config": {"model_type": "gpt2"}}))
    assert other.cuda_graph == "none"
