"""Inductor's fusion rules (capture/inductor.py) on small hand-built graphs, exact bytes."""

from __future__ import annotations

from zrt_core.capture.inductor import MAX_FUSION_SIZE, fuse_graph, fusion_summary
from zrt_core.ir.graph import Category, OpGraph, OpNode, TensorMeta


def _t(tid: int, shape=(4, 8), dtype="bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, is_view=False, tensor_id=tid, param=None)


def _node(i, op, cat, ins, outs, flops=0, layer=0) -> OpNode:
    read = sum(2 * t.shape[0] * t.shape[1] for t in ins)
    written = sum(2 * t.shape[0] * t.shape[1] for t in outs)
    return OpNode(id=i, op=op, category=cat, phase="prefill", inputs=ins, outputs=outs,
                  module_path="model.layers.0.mlp", module_class="MLP", layer_index=layer,
                  layer_kind=None, flops=flops, bytes_read=read, bytes_written=written,
                  formula=None, zero_cost=False, attrs={})


def _graph(nodes) -> OpGraph:
    return OpGraph(phase="prefill", nodes=nodes, edges=(), templates=(), meta={})


def test_pointwise_chain_after_a_gemm_is_one_kernel_reading_once():
    # mm (extern) -> add bias -> relu -> mul by a third input: the three pointwise ops are one
    # kernel reading mm's output, the bias and the multiplier once (3 × 4·8·2 = 192 bytes)
    # and writing the product (64 bytes); eager moves 3 × (2·64 + 64) = 576 bytes
    mm = _node(0, "aten.mm.default", Category.MATMUL, (_t(0), _t(1)), (_t(2),), flops=512)
    add = _node(1, "aten.add.Tensor", Category.ELEMENTWISE, (_t(2), _t(3)), (_t(4),), 32)
    relu = _node(2, "aten.relu.default", Category.ELEMENTWISE, (_t(4),), (_t(5),), 32)
    mul = _node(3, "aten.mul.Tensor", Category.ELEMENTWISE, (_t(5), _t(6)), (_t(7),), 32)
    fused = fuse_graph(_graph([mm, add, relu, mul]))
    assert [n.op for n in fused.nodes] == ["aten.mm.default", "inductor.fused"]
    kernel = fused.nodes[1]
    assert list(kernel.attrs["fused_ops"]) == ["aten.add.Tensor", "aten.relu.default",
                                               "aten.mul.Tensor"]
    assert (kernel.bytes_read, kernel.bytes_written, kernel.flops) == (192, 64, 96)
    summary = fusion_summary(_graph([mm, add, relu, mul]), fused)
    assert (summary["kernels_eager"], summary["kernels_inductor"]) == (4, 2)


def test_a_value_read_outside_the_kernel_is_written():
    # add -> relu, and a second consumer (an extern mm) reads add's output: the kernel must
    # store it (64 bytes) besides relu's output (64 bytes)
    add = _node(0, "aten.add.Tensor", Category.ELEMENTWISE, (_t(0), _t(1)), (_t(2),))
    relu = _node(1, "aten.relu.default", Category.ELEMENTWISE, (_t(2),), (_t(3),))
    mm = _node(2, "aten.mm.default", Category.MATMUL, (_t(2), _t(4)), (_t(5),))
    fused = fuse_graph(_graph([add, relu, mm]))
    assert fused.nodes[0].bytes_written == 128 and fused.nodes[0].bytes_read == 128


def test_no_fusion_across_layers_or_reductions_of_other_sizes():
    a = _node(0, "aten.add.Tensor", Category.ELEMENTWISE, (_t(0), _t(1)), (_t(2),), layer=0)
    b = _node(1, "aten.mul.Tensor", Category.ELEMENTWISE, (_t(2),), (_t(3),), layer=1)
    assert len(fuse_graph(_graph([a, b])).nodes) == 2
    s1 = _node(0, "aten.sum.dim_IntList", Category.REDUCTION, (_t(0),), (_t(1, (4, 1)),))
    s2 = _node(1, "aten.sum.dim_IntList", Category.REDUCTION, (_t(1, (4, 1)),),
               (_t(2, (1, 1)),))
    assert len(fuse_graph(_graph([s1, s2])).nodes) == 2


def test_kernel_size_is_capped():
    nodes = [_node(0, "aten.neg.default", Category.ELEMENTWISE, (_t(0),), (_t(1),))]
    for i in range(1, MAX_FUSION_SIZE + 1):
        nodes.append(_node(i, "aten.neg.default", Category.ELEMENTWISE, (_t(i),), (_t(i + 1),)))
    # 65 chained ops: one kernel of 64 and one of 1
    fused = fuse_graph(_graph(nodes))
    assert [len(n.attrs.get("fused_ops", [n.op])) for n in fused.nodes] == [64, 1]
