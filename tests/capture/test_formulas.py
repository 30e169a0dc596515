"""Formulas as pure functions of shapes: exact numbers, and agreement with torch's counter."""

from __future__ import annotations

import pytest

from zrt_core.formulas import aten as F
from zrt_core.formulas.registry import OpCall
from zrt_core.ir.graph import Category, TensorMeta


def t(*shape: int, dtype: str = "bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype)


def call(op: str, inputs, outputs, **attrs) -> OpCall:
    return OpCall(op=op, inputs=inputs, outputs=outputs, attrs=attrs)


@pytest.fixture(scope="module")
def registry(host):
    return host.formulas


def test_matmuls(registry):
    # 2 · 4 · 6 · 5 = 240
    assert registry.evaluate(call("aten.mm.default", [t(4, 6), t(6, 5)], [t(4, 5)]))[0] == 240
    # bias not counted: 2 · 4 · 6 · 5 = 240
    assert registry.evaluate(call("aten.addmm.default", [t(5), t(4, 6), t(6, 5)],
                                  [t(4, 5)]))[0] == 240
    # 2 · 3 · 4 · 6 · 5 = 720
    assert registry.evaluate(call("aten.bmm.default", [t(3, 4, 6), t(3, 6, 5)],
                                  [t(3, 4, 5)]))[0] == 720


def test_grouped_mm_all_layouts(registry):
    ev = registry.evaluate
    # forward / dX: [M_total=12, K=6] x [G=4, K=6, N=5]: 2 · 12 · 6 · 5 = 720
    assert ev(call("aten._grouped_mm.default", [t(12, 6), t(4, 6, 5), t(4, dtype="int32")],
                   [t(12, 5)]))[0] == 720
    # dW: [M=6, K_total=12] x [K_total=12, N=5] → [G=4, 6, 5]: 2 · 6 · 12 · 5 = 720
    assert ev(call("aten._grouped_mm.default", [t(6, 12), t(12, 5), t(4, dtype="int32")],
                   [t(4, 6, 5)]))[0] == 720
    # 3D x 3D: [4, 3, 6] x [4, 6, 5]: 2 · 4 · 3 · 5 · 6 = 720
    assert ev(call("aten._grouped_mm.default", [t(4, 3, 6), t(4, 6, 5)],
                   [t(4, 3, 5)]))[0] == 720


def test_grouped_mm_reads_only_active_expert_weights(registry):
    x, w, offs, out = t(2, 6), t(4, 6, 5), t(4, dtype="int32"), t(2, 5)
    all_active = registry.evaluate(call("aten._grouped_mm.default", [x, w, offs], [out]))
    one_active = registry.evaluate(call("aten._grouped_mm.default", [x, w, offs], [out],
                                        group_rows=[2, 0, 0, 0]))
    # weights: 4 · 6 · 5 · 2 B = 240 B; one of four groups active reads 60 of them
    assert all_active[1] - one_active[1] == 240 - 60
    assert all_active[0] == one_active[0] == 2 * 2 * 6 * 5


def test_convolution_is_groups_aware(registry):
    # depthwise conv1d: x [2, 8, 10], w [8, 1, 4], groups 8, out [2, 8, 7]
    x, w, out = t(2, 8, 10), t(8, 1, 4), t(2, 8, 7)
    fwd = registry.evaluate(call("aten.convolution.default", [x, w], [out], groups=8,
                                 transposed=False))[0]
    assert fwd == 2 * (2 * 8 * 7) * (1 * 4)  # 2 · out.numel · C_in/g · k = 896
    bwd = registry.evaluate(call("aten.convolution_backward.default", [out, x, w],
                                 [x, w], groups=8, transposed=False,
                                 output_mask=[True, True, False]))[0]
    assert bwd == 2 * fwd


def test_attention_pairs_closed_forms():
    assert F.attention_pairs(4, 4) == 10                     # 1 + 2 + 3 + 4
    assert F.attention_pairs(4, 4, is_causal=False) == 16
    assert F.attention_pairs(1, 9) == 9                      # decode sees every key
    assert F.attention_pairs(4, 4, window=2) == 7            # 1 + 2 + 2 + 2
    assert F.attention_pairs(6, 6, chunk=4) == 13            # 1+2+3+4 + 1+2
    assert F.attention_pairs(5, 5, topk=3) == 12             # 1 + 2 + 3 + 3 + 3
    assert F.attention_pairs(2, 6, window=3) == 6            # queries at 4, 5: 3 + 3
    # closed forms equal brute force over many shapes
    for q in range(1, 9):
        for kv in range(q, 12):
            for w in (0, 1, 3, 5):
                for c in (0, 2, 4):
                    brute = 0
                    for p in range(kv - q, kv):
                        keys = [k for k in range(kv) if k <= p and (not w or k > p - w)
                                and (not c or k // c == p // c)]
                        brute += len(keys)
                    assert F.attention_pairs(q, kv, window=w, chunk=c) == brute


def test_zrt_attention_flops(registry):
    q, k, v = t(2, 4, 8, 16), t(2, 2, 8, 16), t(2, 2, 8, 16)
    out, lse = t(2, 8, 4, 16), t(2, 4, 8, dtype="float32")
    fwd = registry.evaluate(call("zrt.attention.default", [q, k, v], [out, lse],
                                 is_causal=True, window=0, chunk=0))[0]
    # pairs 8·9/2 = 36; 2 · B 2 · H 4 · 36 · (16 + 16) = 18432
    assert fwd == 18432
    bwd = registry.evaluate(call("zrt.attention_backward.default",
                                 [out, q, k, v, out, lse], [q, k, v],
                                 is_causal=True, window=0, chunk=0))[0]
    assert bwd == 2 * 2 * 4 * 36 * (3 * 16 + 2 * 16)  # 2.5x forward = 46080
    # sparse indices [B, Sq, topk=3] after sinks [H]
    sparse = registry.evaluate(call("zrt.attention.default",
                                    [q, k, v, t(4), t(2, 8, 3, dtype="int32")], [out, lse],
                                    is_causal=True, window=0, chunk=0))[0]
    # pairs 1 + 2 + 3·6 = 21: 2 · 2 · 4 · 21 · 32 = 10752
    assert sparse == 10752


def test_pointwise_reduction_softmax_and_memory_formulas(registry):
    x = t(4, 8)
    assert registry.evaluate(call("aten.add.Tensor", [x, x], [x]))[:3] == (32, 128, 64)
    assert registry.evaluate(call("aten.mul_.Tensor", [x, x], [x]))[0] == 32
    assert registry.evaluate(call("aten.sum.dim_IntList", [x], [t(4)]))[0] == 32
    assert registry.evaluate(call("aten._softmax.default", [x], [x]))[0] == 5 * 32
    # an embedding lookup reads the rows it returns, not the table: 6 ids of int64
    table, ids, rows = t(1000, 8), t(2, 3, dtype="int64"), t(2, 3, 8)
    flops, read, written, _ = registry.evaluate(call("aten.embedding.default",
                                                     [table, ids], [rows]))
    assert (flops, read, written) == (0, 6 * 8 * 2 + 6 * 8, 6 * 8 * 2)
    # copy_ into a slice: reads the source, writes the destination
    assert registry.evaluate(call("aten.copy_.default", [t(2, 4), t(2, 4, dtype="float32")],
                                  [t(2, 4)]))[1:3] == (32, 16)


def test_categories(registry):
    assert registry.lookup("aten.mm.default").category == Category.MATMUL
    assert registry.lookup("aten._grouped_mm.default").category == Category.MATMUL
    assert registry.lookup("zrt.attention.default").category == Category.ATTENTION
    assert registry.lookup("zrt.moe_dispatch.default").category == Category.MOE_DISPATCH
    assert registry.lookup("zrt.moe_combine.default").category == Category.MOE_COMBINE
    # backward swaps directions
    assert registry.lookup("zrt.moe_dispatch_backward.default").category == \
        Category.MOE_COMBINE
    assert registry.lookup("aten.embedding.default").category == Category.EMBEDDING


def test_formulas_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys; import zrt_core.formulas.aten as a; a.core_formulas(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("op,shapes", [
    ("mm", [(4, 6), (6, 5)]),
    ("bmm", [(3, 4, 6), (3, 6, 5)]),
    ("addmm", [(5,), (4, 6), (6, 5)]),
    ("baddbmm", [(3, 4, 5), (3, 4, 6), (3, 6, 5)]),
])
def test_matmul_formulas_equal_torch_flop_counter(registry, op, shapes):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    tensors = [torch.randn(*s) for s in shapes]
    with FlopCounterMode(display=False) as counter:
        out = getattr(torch, op)(*tensors)
    ours = registry.evaluate(call(f"aten.{op}.default",
                                  [t(*s, dtype="float32") for s in shapes],
                                  [t(*out.shape, dtype="float32")]))[0]
    assert ours == counter.get_total_flops()


def test_convolution_equals_torch_flop_counter_when_ungrouped(registry):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    x, w = torch.randn(2, 3, 10), torch.randn(5, 3, 4)
    with FlopCounterMode(display=False) as counter:
        out = torch.nn.functional.conv1d(x, w)
    ours = registry.evaluate(call("aten.convolution.default",
                                  [t(2, 3, 10, dtype="float32"), t(5, 3, 4, dtype="float32")],
                                  [t(*out.shape, dtype="float32")], transposed=False,
                                  groups=1))[0]
    assert ours == counter.get_total_flops()
