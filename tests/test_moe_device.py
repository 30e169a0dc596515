"""MoE layers on the device in training: TE GroupedLinear's per-expert loop (GEMMs and casts
over 4 streams) and the SMs the EP dispatch kernels hold under batch-level overlap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zrt_core.cost.roofline import RooflineBackend
from zrt_core.estimate.training.stages import _ep_batch_overlap, ep_comm_sm_share
from zrt_core.ir.graph import OpGraph
from zrt_core.schedule.scheduler import OverlapRules
from zrt_core.transforms.training.experts import expert_gemm_loop

from .cost.builders import make_toy, op_node, tensor

PER_GEMM_FLOPS = 2 * 128 * 128 * 512  # 16777216: one expert, 128 rows, N 128, K 512


def _grouped(groups: int = 6, **attrs: object):
    # [groups·128, 512] @ [groups, 512, 128]: 128 rows per expert; bytes 0 so the compute
    # side shows (the toy's 1 TB/s would make these small GEMMs memory-bound)
    return op_node("aten._grouped_mm.default", "matmul",
                   [tensor(groups * 128, 512), tensor(groups, 512, 128, param="experts.w")],
                   [tensor(groups * 128, 128)], flops=groups * PER_GEMM_FLOPS,
                   bytes_read=0, bytes_written=0, phase="train_forward", **attrs)


def test_one_grouped_kernel_without_the_mark():
    cost = RooflineBackend(make_toy(expert_kernel_us=5.0)).price(_grouped())
    # 6 tiles on 4 units: 2 waves, 6/8 full; K loop 512/(512+128) = 0.8 -> shape 0.6
    # 6 · 16777216 / (1e15 · 0.8 · 0.6) = 2.097152e-7 s; fixed: launch 2 + GEMM 1 µs
    assert cost.rule == "grouped_gemm"
    assert cost.compute_s == pytest.approx(2.097152e-7, rel=1e-12)
    assert cost.overhead_s == pytest.approx(3e-6, rel=1e-12)


def test_a_grouped_gemm_pays_each_groups_row_overhead():
    cost = RooflineBackend(make_toy(matmul_group_rows_overhead=32)).price(_grouped())
    # as above, shape 0.6, and 128 rows per group over 128 + 32: 0.8 of the dense rate
    # 6 · 16777216 / (1e15 · 0.8 · 0.6 · 0.8) = 2.62144e-7 s
    assert cost.detail["row_efficiency"] == pytest.approx(0.8, rel=1e-12)
    assert cost.compute_s == pytest.approx(2.62144e-7, rel=1e-12)
    # transformers' loop of one mm per group (zrt's capture for dtypes _grouped_mm lacks)
    # is a grouped GEMM too: the same rows per group, the same price
    loop = op_node("transformers.grouped_mm_fallback.default", "matmul",
                   [tensor(6 * 128, 512), tensor(6, 512, 128, param="experts.w")],
                   [tensor(6 * 128, 128)], flops=6 * PER_GEMM_FLOPS, bytes_read=0,
                   bytes_written=0, phase="train_forward")
    fallback = RooflineBackend(make_toy(matmul_group_rows_overhead=32)).price(loop)
    assert fallback.rule == "grouped_gemm"
    assert fallback.compute_s == pytest.approx(2.62144e-7, rel=1e-12)


def test_te_loop_prices_rounds_of_four_gemms_each_with_its_own_waves():
    cost = RooflineBackend(make_toy(expert_kernel_us=5.0)).price(
        _grouped(expert_streams=4, expert_groups=6, expert_eager=True))
    # round 1: 4 GEMMs, 4 tiles on 4 units: 1 full wave, K loop 0.8 -> shape 0.8
    #   4 · 16777216 / (1e15 · 0.8 · 0.8) = 1.048576e-7 s
    # round 2: 2 GEMMs, 2 tiles < 4 units: split K min(4 // 2, 512 // 128) = 2, slices of
    #   256: K loop 256/384 = 2/3, 1 full wave -> 2 · 16777216 / (1e15 · 0.8 · 2/3)
    #   = 6.291456e-8 s
    # fixed: 2 rounds · (2 + 1) µs + 6 kernels · 5 µs = 36 µs
    assert cost.rule == "expert_gemm_loop"
    assert cost.compute_s == pytest.approx(1.048576e-7 + 6.291456e-8, rel=1e-12)
    assert cost.overhead_s == pytest.approx(36e-6, rel=1e-12)
    assert (cost.detail["rounds"], cost.detail["streams"], cost.detail["expert_gemms"]) == (
        2, 4, 6)


def test_te_loop_replayed_from_a_cuda_graph_pays_no_per_kernel_time():
    cost = RooflineBackend(make_toy(expert_kernel_us=5.0)).price(
        _grouped(expert_streams=4, expert_groups=6, expert_eager=False))
    # 2 rounds · 3 µs; the compute as eager
    assert cost.overhead_s == pytest.approx(6e-6, rel=1e-12)
    assert cost.compute_s == pytest.approx(1.048576e-7 + 6.291456e-8, rel=1e-12)


def test_per_expert_cast_is_one_kernel_per_expert_over_four_streams():
    x = tensor(768, 512)
    cast = op_node("precision.quantize", "elementwise", [x], [tensor(768, 512, dtype=
                   "float8_e4m3fn")], bytes_read=10**6, bytes_written=0,
                   phase="train_forward", expert_streams=4, expert_groups=6,
                   expert_eager=True)
    cost = RooflineBackend(make_toy(expert_kernel_us=5.0)).price(cast)
    # 1e6 B at 2000 GB/s · 0.5 = 1e-6 s; 2 rounds · 2 µs launch + 6 · 5 µs = 34 µs
    assert cost.rule == "expert_loop_memory_bound"
    assert cost.memory_s == pytest.approx(1e-6, rel=1e-12)
    assert cost.overhead_s == pytest.approx(34e-6, rel=1e-12)


def test_transform_marks_grouped_gemms_and_the_casts_feeding_them():
    gemm = _grouped()
    cast = op_node("precision.quantize", "elementwise", [tensor(768, 512)],
                   [tensor(768, 512, dtype="float8_e4m3fn")], phase="train_forward")
    other = op_node("precision.quantize", "elementwise", [tensor(8, 8)],
                    [tensor(8, 8, dtype="float8_e4m3fn")], phase="train_forward")
    g = OpGraph(phase="train_forward", nodes=(cast, other, gemm), edges=((cast.id, gemm.id),))
    out = {n.id: n for n in expert_gemm_loop(g, eager=False).nodes}
    want = {"expert_streams": 4, "expert_groups": 6, "expert_eager": False}
    for n in (out[gemm.id], out[cast.id]):
        assert {k: n.attrs[k] for k in want} == want
    assert "expert_streams" not in out[other.id].attrs
    plain = OpGraph(phase="train_forward", nodes=(other,))
    assert expert_gemm_loop(plain) is plain


def test_dispatch_kernels_hold_sms_under_batch_level_overlap():
    # Megatron-Core's defaults: DeepEP 20 SMs, HybridEP 16; NCCL's all-to-all unknown (0)
    assert ep_comm_sm_share("deepep", 132) == pytest.approx(20 / 132, rel=1e-12)
    assert ep_comm_sm_share("hybridep", 148) == pytest.approx(16 / 148, rel=1e-12)
    assert ep_comm_sm_share("alltoall", 132) == 0.0
    assert ep_comm_sm_share("deepep", 0) == 0.0
    on = OverlapRules(ep_batch_overlap=True)
    ft = SimpleNamespace(exposed_comm_s={"ep": 3.0}, compute_s=4.0)
    bt = SimpleNamespace(exposed_comm_s={"ep": 1.0}, compute_s=8.0)
    # A = 4 s, C = 12 s, share 0.25: the pair lasts C + A·0.25 = 13 s, hiding A·0.75 = 3 s;
    # paired (10 − 2)/10 = 0.8 -> 2.4 s, split 3:1 -> (1.8, 0.6)
    assert _ep_batch_overlap(on, ft, bt, 2, 10, 0.25) == pytest.approx((1.8, 0.6), rel=1e-12)


def test_ep_batch_overlap_pairs_layers_slot_by_slot():
    """Megatron-Core's combined 1F1B runs forward layer i with backward layer i in three
    slots (combine_bwd | attention fwd, dispatch_fwd → dispatch_bwd | experts bwd → fwd,
    combine_fwd | attention bwd): an all-to-all longer than the compute of its own slot
    stays exposed though another slot has compute to spare."""
    def ev(stream, s):
        return SimpleNamespace(stream=stream, duration_s=s)

    def tl(events, ep):
        return SimpleNamespace(exposed_comm_s={"ep": ep}, compute_s=0.0, placements=[
            SimpleNamespace(region=SimpleNamespace(body=events))])

    # forward: attention 1, dispatch 2, experts 3, combine 1
    ft = tl([ev("compute", 1.0), ev("comm.ep", 2.0), ev("compute", 3.0), ev("comm.ep", 1.0)],
            3.0)
    # backward: combine's backward 2, experts 4, dispatch's backward 1, attention 2
    bt = tl([ev("comm.ep", 2.0), ev("compute", 4.0), ev("comm.ep", 1.0), ev("compute", 2.0)],
            3.0)
    on = OverlapRules(ep_batch_overlap=True)
    # slots hide min(c, a): (attn fwd 1, combine bwd 2) 1 + (experts bwd 4, dispatch 2) 2
    # + (experts fwd 3, dispatch bwd 1) 1 + (attn bwd 2, combine 1) 1 = 5 of A = 6 (the
    # stage-wide max(C, A) would hide all 6); paired (10 − 2)/10 = 0.8 → 4.0, split 3:3
    assert _ep_batch_overlap(on, ft, bt, 2, 10) == pytest.approx((2.0, 2.0), rel=1e-12)
    # share 0.25: each slot lasts max(c + a/4, a): hides 1 + 1.5 + 0.75 + 0.75 = 4.0
    # → 0.8 · 4.0 = 3.2, split 3:3
    assert _ep_batch_overlap(on, ft, bt, 2, 10, 0.25) == pytest.approx((1.6, 1.6), rel=1e-12)
