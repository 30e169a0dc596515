"""Expert biases and the clamped GLU as Megatron-Core's TEGroupedMLP runs them: fc1's bias in
the GEMM epilogue, fc2's in a per-expert Python loop, the clamps and cat as eager passes."""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cost.roofline import RooflineBackend
from zrt_core.estimate.host import launches
from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.training.experts import expert_gemm_loop

from .cost.builders import make_toy, op_node, tensor

# 4 local experts of 8 routed, 64 rows, hidden 8, expert FFN 8 (fc1 out 16), bf16
G, E, ROWS, H, F = 4, 8, 64, 8, 8
V = ROWS * H * 2  # 1024 B: [rows, hidden] bf16
U = ROWS * F * 2  # 1024 B: [rows, F] bf16


def _gemm(k: int, n: int, **kw: object):
    return op_node("aten._grouped_mm.default", "matmul",
                   [tensor(ROWS, k), tensor(G, k, n, param="experts.w")], [tensor(ROWS, n)],
                   flops=2 * ROWS * k * n, layer_index=1, **kw)


def _gather(width: int):
    return op_node("aten.index.Tensor", "copy", [tensor(E, width), tensor(ROWS, dtype="int64")],
                   [tensor(ROWS, width)], layer_index=1, phase="train_forward")


def _forward():
    fc1, fc2 = _gemm(H, 2 * F, phase="train_forward"), _gemm(F, H, phase="train_forward")
    b1, b2 = _gather(2 * F), _gather(H)
    clamp = op_node("aten.clamp.default", "elementwise", [tensor(ROWS, F)], [tensor(ROWS, F)])
    act = op_node("fused.pointwise", "elementwise", [tensor(ROWS, 2 * F), tensor(ROWS, 2 * F)],
                  [tensor(ROWS, F)], layer_index=1, phase="train_forward")
    act = evolve(act, fused_from=(clamp,))
    add = op_node("aten.add.Tensor", "elementwise", [tensor(ROWS, H), tensor(ROWS, H)],
                  [tensor(ROWS, H)], layer_index=1, phase="train_forward")
    edges = ((fc1.id, act.id), (b1.id, act.id), (act.id, fc2.id), (fc2.id, add.id),
             (b2.id, add.id))
    g = OpGraph(phase="train_forward", nodes=(fc1, b1, act, fc2, b2, add), edges=edges)
    return g, fc1, b1, act, fc2, b2, add


def test_forward_bias_and_clamp_as_megatron_runs_them():
    g, _fc1, b1, act, _fc2, b2, add = _forward()
    out = {n.id: n for n in expert_gemm_loop(g).nodes}
    # fc1's bias: in the GEMM epilogue -> the gather is free and the activation no longer
    # reads its [64, 16] bf16 rows (2048 B): read 4096 - 2048 = 2048, then + 4U for the
    # clamps and cat (read 2U for the clamps, 2U for cat) = 2048 + 4096 = 6144; written
    # 1024 + 4U (clamps U + U, cat 2U) = 5120
    assert out[b1.id].zero_cost and out[b2.id].zero_cost
    assert (out[act.id].bytes_read, out[act.id].bytes_written) == (2048 + 4 * U, U + 4 * U)
    # fc2's bias: 2 kernels per local expert, one stream; b·p writes V, t + b·p reads 2V
    # and writes V, cat reads V and writes V: read 3V, written 3V
    a = out[add.id]
    assert (a.attrs["expert_streams"], a.attrs["expert_groups"], a.attrs["expert_eager"]) \
        == (1, 2 * G, True)
    assert (a.bytes_read, a.bytes_written) == (3 * V, 3 * V)
    assert launches(a, RooflineBackend(make_toy()).price(a)) == 8
    cost = RooflineBackend(make_toy(expert_kernel_us=5.0)).price(a)
    # 6144 B at 2000 GB/s · 0.5 = 6.144e-9 s; 8 rounds · 2 µs launch + 8 kernels · 5 µs
    assert cost.rule == "expert_loop_memory_bound"
    assert cost.memory_s == pytest.approx(6.144e-9, rel=1e-12)
    assert cost.overhead_s == pytest.approx(56e-6, rel=1e-12)


def test_backward_bias_gradients():
    scatter = op_node("aten.index_put.default", "copy",
                      [tensor(E, H), tensor(ROWS, dtype="int64"), tensor(ROWS, H)],
                      [tensor(E, H)], layer_index=1, phase="train_backward", accumulate=True)
    d2, w2 = _gemm(H, F, phase="train_backward"), _gemm(H, F, phase="train_backward")
    scatter1 = op_node("aten.index_put.default", "copy",
                       [tensor(E, 2 * F), tensor(ROWS, dtype="int64"), tensor(ROWS, 2 * F)],
                       [tensor(E, 2 * F)], layer_index=1, phase="train_backward",
                       accumulate=True)
    g = OpGraph(phase="train_backward", nodes=(scatter, d2, w2, scatter1),
                edges=((scatter.id, d2.id),))
    out = {n.id: n for n in expert_gemm_loop(g, eager=False).nodes}
    s = out[scatter.id]
    # before the layer's first expert GEMM: fc2's; 4 kernels per expert, replayed from a
    # CUDA graph here; reads 4V (grad·p, its sum, grad·b, its sum), writes 2V
    assert (s.attrs["expert_groups"], s.attrs["expert_streams"], s.attrs["expert_eager"]) \
        == (4 * G, 1, False)
    assert (s.bytes_read, s.bytes_written) == (4 * V, 2 * V)
    # after the expert GEMMs: fc1's, from the weight-gradient GEMMs' epilogue
    assert out[scatter1.id].zero_cost


def test_graph_without_expert_bias_is_unchanged():
    fc1 = _gemm(H, 2 * F, phase="train_forward")
    act = op_node("aten.mul.Tensor", "elementwise", [tensor(ROWS, 2 * F)], [tensor(ROWS, F)],
                  layer_index=1, phase="train_forward")
    g = OpGraph(phase="train_forward", nodes=(fc1, act), edges=((fc1.id, act.id),))
    out = {n.id: n for n in expert_gemm_loop(g).nodes}
    assert out[act.id] == act
