"""The roofline's rules on hand-built nodes, on the toy device of conftest.py.

Toy: bf16 1e15 FLOP/s x matmul 0.8; fp8 2e15 x 0.5; attention 0.5 / 0.25 backward; HBM
2e12 B/s x 0.5 = 1e12 B/s; CUDA cores 50e12 x 0.5; launch 2 us (+1 us for GEMMs); 4 units.
"""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cost.backend import PriceSource
from zrt_core.cost.errors import CostError
from zrt_core.cost.roofline import RooflineBackend
from zrt_core.hardware import ComputeSpec

from .builders import make_toy, mm_node, op_node, tensor


@pytest.fixture
def roofline(toy):
    return RooflineBackend(toy)


def test_large_gemm_is_compute_bound_with_k_loop_loss(roofline):
    cost = roofline.price(mm_node(4096, 4096, 4096))
    # tiles 32*32 = 1024 over 4 units: 256 full waves; padding 1; k_loop 4096/(4096+128)
    # compute = 2*4096^3 / (1e15 * 0.8 * 4096/4224) = 1.37438953472e-4 * 1.25 * 1.03125
    assert cost.compute_s == pytest.approx(1.7716740096e-4, rel=1e-12)
    # bytes 3 * 4096^2 * 2 = 100663296 over 1e12 B/s
    assert cost.memory_s == pytest.approx(1.00663296e-4, rel=1e-12)
    assert cost.overhead_s == pytest.approx(3e-6)
    assert cost.time_s == pytest.approx(1.8016740096e-4, rel=1e-12)
    assert (cost.rule, cost.bound, cost.source, cost.backend) == (
        "gemm", "compute", PriceSource.ROOFLINE, "roofline")
    assert cost.detail["waves"] == 256
    assert cost.detail["k_loop_efficiency"] == pytest.approx(4096 / 4224)


def test_16bit_gemms_take_their_own_sustained_fraction_where_the_pack_sets_one():
    # the large GEMM above: 1.7716740096e-4 s of compute in isolation. Inside a workload
    # at matmul_sustained 0.8 it takes / 0.8; with a 16-bit fraction of 0.5 a bf16 GEMM
    # takes / 0.5 and an fp8 one keeps / 0.8
    iso = RooflineBackend(make_toy()).price(mm_node(4096, 4096, 4096)).compute_s
    iso8 = RooflineBackend(make_toy()).price(mm_node(4096, 4096, 4096,
                                                     dtype="float8_e4m3fn")).compute_s
    one = RooflineBackend(make_toy(matmul_sustained=0.8))
    split = RooflineBackend(make_toy(matmul_sustained=0.8, matmul_sustained_16bit=0.5))
    assert one.price(mm_node(4096, 4096, 4096)).compute_s == pytest.approx(iso / 0.8)
    bf16 = split.price(mm_node(4096, 4096, 4096))
    assert bf16.compute_s == pytest.approx(iso / 0.5) and bf16.detail["sustained"] == 0.5
    fp8 = split.price(mm_node(4096, 4096, 4096, dtype="float8_e4m3fn"))
    assert fp8.compute_s == pytest.approx(iso8 / 0.8) and fp8.detail["sustained"] == 0.8


def test_a_skinny_gemm_streams_its_operands_at_the_packs_gemm_rate():
    cost = RooflineBackend(make_toy(matmul_memory=0.25, matmul_row_overhead=12)).price(
        mm_node(4, 4096, 4096))
    # bytes (4·4096 + 4096² + 4·4096)·2 = 33619968 at 2000 GB/s · 0.25 (not memory's 0.5)
    assert cost.memory_s == pytest.approx(33619968 / 5e11, rel=1e-12)
    assert cost.bound == "memory"
    # 4 rows and 12 of overhead: the row efficiency 4/16, beside the 128-row tile's 4/128
    assert cost.detail["row_efficiency"] == pytest.approx(0.25, rel=1e-12)


def test_each_weight_row_streams_k0_more_elements():
    plain = RooflineBackend(make_toy(matmul_memory=0.25)).price(mm_node(4, 512, 4096))
    cost = RooflineBackend(make_toy(matmul_memory=0.25, matmul_memory_k_overhead=200)).price(
        mm_node(4, 512, 4096))
    # [4, 512] @ [512, 4096] in bf16: (4·512 + 512·4096 + 4·4096)·2 = 4231168 bytes; each of
    # the weight's 4096 rows of 512 streams as 512 + 200: 4096·200·2 = 1638400 bytes more,
    # both at 2000 GB/s · 0.25
    assert plain.memory_s == pytest.approx(4231168 / 5e11, rel=1e-12)
    assert cost.detail["weight_row_extra_bytes"] == 1638400
    assert cost.memory_s == pytest.approx((4231168 + 1638400) / 5e11, rel=1e-12)
    # a compute-bound GEMM pays the same bytes but its time is the compute's
    big = RooflineBackend(make_toy(matmul_memory_k_overhead=200)).price(
        mm_node(8192, 4096, 4096))
    assert big.bound == "compute"


def test_wave_quantisation_of_a_last_partial_wave(roofline):
    cost = roofline.price(mm_node(640, 4096, 128))
    # 5 tiles on 4 units: 2 waves, 5/8 busy; k_loop 4096/4224 = 32/33; shape 20/33
    assert cost.detail["wave_efficiency"] == 0.625
    assert cost.detail["shape_efficiency"] == pytest.approx(20 / 33)
    # 2*640*128*4096 = 671088640 FLOPs / (8e14 * 20/33)
    assert cost.compute_s == pytest.approx(671088640 * 33 / 1.6e16, rel=1e-12)
    # bytes 640*4096*2 + 4096*128*2 + 640*128*2 = 6455296: memory-bound
    assert cost.memory_s == pytest.approx(6.455296e-6, rel=1e-12)
    assert cost.bound == "memory"


def test_split_k_fills_idle_units_and_padding_counts_partial_tiles(roofline):
    cost = roofline.price(mm_node(100, 1024, 128))
    # one 128x128 tile < 4 units: split K min(4 // 1, 1024 // 128) = 4 ways -> one full wave;
    # k slice 256: k_loop 256/384 = 2/3; padding 100*128 / (128*128) = 0.78125
    assert (cost.detail["split_k"], cost.detail["waves"]) == (4, 1)
    assert cost.detail["padding_efficiency"] == 0.78125
    assert cost.detail["shape_efficiency"] == pytest.approx(0.78125 * 2 / 3)
    # 2*100*128*1024 = 26214400 FLOPs / (8e14 * 0.78125 * 2/3)
    assert cost.compute_s == pytest.approx(26214400 / (8e14 * 0.78125 * 2 / 3), rel=1e-12)


def test_no_wave_model_without_parallel_units():
    cost = RooflineBackend(make_toy(parallel_units=0)).price(mm_node(640, 4096, 128))
    # wave 1, padding 1, k_loop 32/33
    assert cost.detail["shape_efficiency"] == pytest.approx(32 / 33)


def test_fp8_gemm_runs_at_the_fp8_rate_and_efficiency(roofline):
    cost = roofline.price(mm_node(4096, 4096, 4096, dtype="float8_e4m3fn"))
    # at twice the bf16 rate a tile's fixed cost is worth 2 * 128 = 256 K elements:
    # 2*4096^3 / (2e15 * 0.5 * 4096/4352) = 1.37438953472e-4 * 1.0625
    assert cost.detail["k_overhead"] == 256
    assert cost.compute_s == pytest.approx(1.46028888064e-4, rel=1e-12)
    assert (cost.detail["compute"], cost.detail["efficiency"]) == ("fp8", 0.5)


def test_fp8_without_fp8_units_falls_back_to_bf16_rate():
    toy = make_toy()
    no_fp8 = evolve(toy, compute=ComputeSpec(fp32_tflops=50, bf16_tflops=1000,
                                             fp16_tflops=1000))
    cost = RooflineBackend(no_fp8).price(mm_node(4096, 4096, 4096, dtype="float8_e4m3fn"))
    # bf16 rate and matmul efficiency: as the bf16 GEMM above
    assert cost.compute_s == pytest.approx(1.7716740096e-4, rel=1e-12)
    assert (cost.detail["compute"], cost.detail["efficiency"]) == ("bf16", 0.8)


def test_weight_only_int4_gemm_runs_at_activation_rate_but_reads_narrow_weights(roofline):
    cost = roofline.price(mm_node(16, 4096, 4096, weight_dtype="int4"))
    assert cost.detail["dtype"] == "bfloat16"
    # bytes: 16*4096*2 + 4096*4096*0.5 + 16*4096*2 = 131072 + 8388608 + 131072 = 8650752
    assert cost.memory_s == pytest.approx(8.650752e-6, rel=1e-12)
    assert cost.bound == "memory"
    assert cost.time_s == pytest.approx(8.650752e-6 + 3e-6, rel=1e-12)


def test_grouped_gemm_takes_groups_from_the_weight(roofline, node):
    grouped = node("aten._grouped_mm.default", "matmul",
                   [tensor(1024, 512), tensor(8, 512, 256, param="experts.w")],
                   [tensor(1024, 256)], flops=2 * 1024 * 512 * 256)
    cost = roofline.price(grouped)
    # 8 groups of 128 rows: tiles 8 * 1 * 2 = 16 -> 4 waves; k = 512
    assert cost.rule == "grouped_gemm"
    assert (cost.detail["batch"], cost.detail["m"], cost.detail["n"], cost.detail["k"]) == (
        8, 128, 256, 512)
    assert cost.detail["waves"] == 4


def test_flash_attention_forward(roofline, node):
    q = tensor(2, 8, 1024, 128)
    cost = roofline.price(node("aten._scaled_dot_product_flash_attention.default", "attention",
                               [q, q, q], [q], flops=4 * 2 * 8 * 1024 * 1024 * 128))
    # kv_loop 1024/(1024+128) = 8/9; tiles 2*8*8 = 128 -> 32 waves of 4
    # compute = 8589934592 / (1e15 * 0.5 * 8/9); bytes Q,K,V,O = 4 * 4194304
    assert cost.rule == "flash_attention_fwd"
    assert cost.compute_s == pytest.approx(1.9327352832e-5, rel=1e-12)
    assert cost.memory_s == pytest.approx(1.6777216e-5, rel=1e-12)
    assert cost.time_s == pytest.approx(1.9327352832e-5 + 2e-6, rel=1e-12)


def test_causal_attention_loop_sees_half_the_keys(roofline, node):
    q = tensor(2, 8, 1024, 128)
    flops = 4 * 2 * 8 * (1024 * 1025 // 2) * 128  # 4299161600: the kept triangle
    cost = roofline.price(node("aten._scaled_dot_product_flash_attention.default", "attention",
                               [q, q, q], [q], flops=flops, is_causal=True))
    # visible keys per query 524800 / 1024 = 512.5; kv_loop 512.5 / 640.5
    assert cost.detail["visible_keys"] == 512.5
    assert cost.compute_s == pytest.approx(flops * 640.5 / (0.5e15 * 512.5), rel=1e-12)


def test_flash_attention_backward_uses_backward_efficiency(roofline, node):
    q = tensor(2, 8, 1024, 128)
    cost = roofline.price(node(
        "aten._scaled_dot_product_flash_attention_backward.default", "attention",
        [q, q, q, q, q], [q, q, q], flops=int(2.5 * 8589934592), phase="train_backward"))
    # 21474836480 / (1e15 * 0.25 * 8/9); bytes dO,Q,K,V,O,dQ,dK,dV = 8 * 4194304
    assert cost.rule == "flash_attention_bwd"
    assert cost.compute_s == pytest.approx(9.663676416e-5, rel=1e-12)
    assert cost.memory_s == pytest.approx(3.3554432e-5, rel=1e-12)


def test_decode_attention_is_memory_bound_on_the_kv_cache(roofline, node):
    q, kv = tensor(4, 8, 1, 128), tensor(4, 8, 4096, 128)
    cost = roofline.price(node("aten._scaled_dot_product_efficient_attention.default",
                               "attention", [q, kv, kv], [q], flops=4 * 4 * 8 * 4096 * 128))
    # bytes 8192 + 2 * 33554432 + 8192 = 67125248 over 1e12 B/s
    assert (cost.rule, cost.bound) == ("decode_attention", "memory")
    assert cost.memory_s == pytest.approx(6.7125248e-5, rel=1e-12)
    assert cost.compute_s == pytest.approx(67108864 / 0.5e15, rel=1e-12)
    assert cost.time_s == pytest.approx(6.9125248e-5, rel=1e-12)


def test_memory_bound_op_at_achievable_hbm(roofline, node):
    x = tensor(4096, 4096)
    cost = roofline.price(node("aten.rms_norm.default", "norm", [x], [x], flops=4 * 4096 * 4096))
    # bytes 2 * 33554432 over 1e12; FLOPs 67108864 over 50e12 * 0.5
    assert (cost.rule, cost.bound) == ("memory_bound", "memory")
    assert cost.memory_s == pytest.approx(6.7108864e-5, rel=1e-12)
    assert cost.compute_s == pytest.approx(2.68435456e-6, rel=1e-12)
    assert cost.time_s == pytest.approx(6.9108864e-5, rel=1e-12)


def test_a_node_without_formula_is_priced_from_its_tensors(roofline, node):
    x = tensor(1024, 1024)
    cost = roofline.price(node("aten.foo.default", "elementwise", [x], [x], formula=None,
                               bytes_read=0, bytes_written=0))
    # 2 * 2097152 bytes over 1e12 B/s
    assert cost.memory_s == pytest.approx(4.194304e-6, rel=1e-12)
    assert cost.detail["bytes_from"] == "tensors"


def test_zero_cost_and_view_nodes_are_free(roofline, node):
    x = tensor(8, 8)
    flagged = roofline.price(node("aten.t.default", "elementwise", [x], [x], zero_cost=True))
    view = roofline.price(node("aten.view.default", "view", [x], [x]))
    for cost in (flagged, view):
        assert (cost.time_s, cost.source, cost.rule) == (0.0, PriceSource.FREE, "zero_cost")


def test_collective_nodes_go_to_the_collective_model(roofline, node):
    x = tensor(1024, 1024)
    cost = roofline.price(node("comm.all_reduce", "collective", [x], [x], collective="all_reduce",
                               group="tp", group_size=4, span=4, bytes=100_000_000))
    # ring on t0: 2*3/4 * 1e8 / 5e10 + 2*3 * 1 us
    assert cost.rule == "ring_all_reduce"
    assert cost.time_s == pytest.approx(3.006e-3, rel=1e-12)


def test_a_collective_without_its_attrs_is_an_error(roofline, node):
    x = tensor(4, 4)
    with pytest.raises(CostError, match="lacks attrs group_size, span"):
        roofline.price(node("comm.all_reduce", "collective", [x], [x], bytes=32))


def test_capture_attention_backward_reads_the_query_after_the_output_gradient(roofline, node):
    q, o = tensor(2, 8, 1024, 128), tensor(2, 1024, 8, 128)  # output is [B, S, H, D]
    lse = tensor(2, 8, 1024, dtype="float32")
    cost = roofline.price(node("zrt.attention_backward", "attention", [o, q, q, q, o, lse],
                               [q, q, q], flops=2 * 2 * 8 * 1024 * 1024 * 5 * 128,
                               phase="train_backward", is_causal=False))
    assert cost.rule == "flash_attention_bwd"
    assert (cost.detail["b"], cost.detail["h"], cost.detail["s_q"], cost.detail["d"]) == (
        2, 8, 1024, 128)


def test_sliding_window_shortens_the_kv_loop(roofline, node):
    q = tensor(1, 8, 1024, 128)
    cost = roofline.price(node("zrt.attention", "attention", [q, q, q], [q], flops=1,
                               is_causal=True, window=256))
    # keys per query min(p + 1, 256) for p < 1024: (256*257/2 + 256*768) / 1024 = 224.125
    assert cost.detail["visible_keys"] == 224.125
    assert cost.detail["kv_loop_efficiency"] == pytest.approx(224.125 / 352.125)


def test_head_dim_factor_is_relative_to_head_dim_128(node):
    roofline = RooflineBackend(make_toy(attention_d_overhead=40))
    q64, q128 = tensor(2, 8, 1024, 64), tensor(2, 8, 1024, 128)
    small = roofline.price(node("zrt.attention", "attention", [q64] * 3, [q64], flops=1))
    base = roofline.price(node("zrt.attention", "attention", [q128] * 3, [q128], flops=1))
    # (64/104) / (128/168) = 0.8076923...; head dim 128 is the reference: 1
    assert small.detail["head_dim_factor"] == pytest.approx((64 / 104) / (128 / 168))
    assert base.detail["head_dim_factor"] == 1.0


def test_row_alignment_reads_the_leading_dimensions():
    from zrt_core.cost.opdims import gemm_dims, gemm_row_alignment

    def align(node):
        return gemm_row_alignment(node, gemm_dims(node))

    # forward x[T, H] @ Wᵀ: n = 50,257 output rows of 2 bytes -> a 100,514-byte row: 2
    assert align(mm_node(8192, 768, 50257)) == 2
    assert align(mm_node(8192, 768, 50258)) == 4   # 100,516 bytes
    assert align(mm_node(8192, 768, 50260)) == 8   # 100,520
    assert align(mm_node(8192, 768, 50264)) == 16  # 100,528 = 16 x 6,283
    # input gradient dY[T, V] @ W[V, H]: k = 50,257
    assert align(mm_node(8192, 50257, 768)) == 2
    # a decode step's 5 rows are a row count (the weight is a parameter): aligned
    assert align(mm_node(5, 4096, 4096)) == 16
    # the weight gradient dYᵀ X has no parameter input: m = 50,257 is a transposed row
    dw = op_node("aten.mm.default", "matmul", [tensor(50257, 8192), tensor(8192, 768)],
                 [tensor(50257, 768)], flops=2 * 50257 * 768 * 8192)
    assert align(dw) == 2
    # fp8 (1 byte) in, bf16 out: an fp8 input gradient's rows of 50,264 bytes = 8 x 6,283
    # -> 8; the forward's rows are its bf16 output's, 100,528 bytes -> 16
    assert align(mm_node(8192, 50264, 768, dtype="float8_e4m3fn")) == 8
    assert align(mm_node(8192, 768, 50264, dtype="float8_e4m3fn")) == 16
    # a convolution in the matmul category is not a GEMM: no rule
    conv = op_node("aten.convolution.default", "matmul", [tensor(2, 8195, 64),
                   tensor(8195, 1, 4, param="conv.weight")], [tensor(2, 8195, 64)],
                   flops=2 * 2 * 8195 * 64 * 4)
    assert align(conv) == 16


def test_unaligned_rows_run_at_the_packs_fractions():
    toy = make_toy(matmul_unaligned_8b=0.5, matmul_unaligned_2b=0.25)
    roofline = RooflineBackend(toy)
    aligned = roofline.price(mm_node(4096, 4096, 4096))
    # n 4,097 (8,194-byte rows: 2) and 4,098 (8,196: 4): the compute time of the same
    # shape factor over 0.25 and 0.5; the shape factor itself moves with n, so the
    # comparison is against the pack without the fractions
    plain = RooflineBackend(make_toy())
    for n, fraction in ((4097, 0.25), (4098, 0.5)):
        cost = roofline.price(mm_node(4096, 4096, n))
        base = plain.price(mm_node(4096, 4096, n))
        assert cost.compute_s == pytest.approx(base.compute_s / fraction, rel=1e-12)
        assert cost.detail["row_alignment_efficiency"] == fraction
    assert "row_alignment_efficiency" not in aligned.detail
    # without the fractions (every pack but the Hopper ones) nothing changes
    assert "row_alignment_efficiency" not in plain.price(mm_node(4096, 4096, 4097)).detail


def test_decode_attention_streams_its_cache_at_the_packs_decode_rate(node):
    q, kv = tensor(4, 8, 1, 128), tensor(4, 8, 4096, 128)
    decode = node("aten._scaled_dot_product_efficient_attention.default", "attention",
                  [q, kv, kv], [q], flops=4 * 4 * 8 * 4096 * 128)
    cost = RooflineBackend(make_toy(attention_decode_memory=0.25)).price(decode)
    # the same 67125248 bytes at 2000 GB/s · 0.25 (not memory's 0.5): 1.34250496e-4 s
    assert cost.memory_s == pytest.approx(1.34250496e-4, rel=1e-12)
    assert cost.detail["hbm_efficiency"] == 0.25
    # a prefill's attention keeps the FlashAttention rule and its bytes at memory's rate
    s = tensor(4, 8, 1024, 128)
    prefill = RooflineBackend(make_toy(attention_decode_memory=0.25)).price(
        node("aten._scaled_dot_product_efficient_attention.default", "attention", [s, s, s],
             [s], flops=4 * 4 * 8 * 1024 * 1024 * 128))
    assert prefill.memory_s == pytest.approx(4 * 8388608 / 1e12, rel=1e-12)


def test_an_older_attention_kernel_runs_at_its_published_rate(node):
    # the forward above (1.9327352832e-5 s at attention 0.5) marked as a FlashAttention 1.x
    # kernel on a pack rating it at 0.125 forward / 0.1 backward: 8589934592 / (1e15 ·
    # 0.125 · 8/9) = 7.7309411328e-5 s, four times the device's own kernel
    hw = make_toy(attention_fa1=0.125, attention_fa1_backward=0.1)
    q = tensor(2, 8, 1024, 128)
    cost = RooflineBackend(hw).price(node(
        "aten._scaled_dot_product_flash_attention.default", "attention", [q, q, q], [q],
        flops=4 * 2 * 8 * 1024 * 1024 * 128, attention_kernel="flash1"))
    assert cost.compute_s == pytest.approx(7.7309411328e-5, rel=1e-12)
    assert (cost.detail["kernel"], cost.detail["efficiency"]) == ("flash1", 0.125)
    back = RooflineBackend(hw).price(node(
        "aten._scaled_dot_product_flash_attention_backward.default", "attention",
        [q, q, q, q, q], [q, q, q], flops=int(2.5 * 8589934592), phase="train_backward",
        attention_kernel="flash1"))
    # 21474836480 / (1e15 · 0.1 · 8/9) = 2.415919104e-4 s
    assert back.compute_s == pytest.approx(2.415919104e-4, rel=1e-12)


def test_an_attention_kernel_the_pack_does_not_rate_is_refused(roofline, node):
    q = tensor(2, 8, 1024, 128)
    with pytest.raises(CostError, match="no published rate for attention kernel flash2"):
        roofline.price(node("aten._scaled_dot_product_flash_attention.default", "attention",
                            [q, q, q], [q], flops=1, attention_kernel="flash2"))
