"""Layout rules an op formula declares (``OpFormula.layout``) for a plugin's kernels: the
shape engine carries a batch rescale and a head split through them by the rule, where
matching axis sizes is misled by the size-1 axes of a batch-1 decode capture.

The toy kernel is an attention over a latent cache with top-k indices, captured at batch 1
with one decode token: ``q [1, 4, 1, 8]``, ``kv [1, 1, 5, 8]``, ``idx [1, 1, 5]`` →
``out [1, 1, 4, 8]``, ``lse [1, 4, 1]``.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from zrt_core.errors import SpecError
from zrt_core.formulas.registry import FORMULA_LAYOUTS, FormulaRegistry, OpFormula
from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta
from zrt_core.transforms.parallel import LAYOUT_RULES, propagate_shapes, scaled_layout


def _t(tid: int, *shape: int, dtype: str = "bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, tensor_id=tid)


Q, KV, IDX = _t(1, 1, 4, 1, 8), _t(2, 1, 1, 5, 8), _t(3, 1, 1, 5, dtype="int32")
OUT, LSE = _t(4, 1, 1, 4, 8), _t(5, 1, 4, 1, dtype="float32")
GRAPH = OpGraph(phase="decode", nodes=[OpNode(
    id=0, op="toy.latent_attention.default", category="attention", phase="decode",
    inputs=(Q, KV, IDX), outputs=(OUT, LSE))])
# batch 1 -> 3 on every input; the 4 query heads split over tp = 2
SEEDS = {1: scaled_layout(Q, {0: ("batch", Fraction(3)), 1: ("tp", Fraction(1, 2))}),
         2: scaled_layout(KV, {0: ("batch", Fraction(3))}),
         3: scaled_layout(IDX, {0: ("batch", Fraction(3))})}


def _registry(layout: str | None) -> FormulaRegistry:
    registry = FormulaRegistry()
    registry.register(OpFormula("toy.latent_attention", lambda call: 0, layout=layout))
    return registry


def test_the_attention_rule_follows_the_query() -> None:
    out = propagate_shapes(GRAPH, SEEDS, _registry("attention"))
    assert [t.shape for t in out.nodes[0].outputs] == [(3, 1, 2, 8), (3, 2, 1)]


def test_matching_sizes_alone_misreads_the_size_1_axes() -> None:
    out = propagate_shapes(GRAPH, SEEDS, _registry(None))
    # the indices' batch axis lines up with the output's token axis, and no input has an
    # axis of 4 where the output's heads are: batch twice, heads whole
    assert out.nodes[0].outputs[0].shape == (3, 3, 4, 8)


def test_leading_and_gradient_rules() -> None:
    mixes, pre, comb = _t(1, 1, 1, 24), _t(2, 1, 1, 4), _t(3, 1, 1, 4, 4)
    node = OpNode(id=0, op="toy.rows.default", category="elementwise", phase="decode",
                  inputs=(mixes,), outputs=(pre, comb))
    grad = OpNode(id=1, op="toy.rows_backward.default", category="elementwise",
                  phase="decode", inputs=(pre, comb, mixes), outputs=(_t(4, 1, 1, 24),))
    registry = FormulaRegistry()
    registry.register(OpFormula("toy.rows", lambda call: 0, layout="leading"))
    registry.register(OpFormula("toy.rows_backward", lambda call: 0, layout="gradients"))
    seeds = {1: scaled_layout(mixes, {0: ("batch", Fraction(5))})}
    out = propagate_shapes(OpGraph(phase="decode", nodes=[node, grad]), seeds, registry)
    # rows (batch 5, one token) lead every output; comb's own 4 x 4 stays whole
    assert [t.shape for t in out.nodes[0].outputs] == [(5, 1, 4), (5, 1, 4, 4)]
    # the gradient of mixes takes mixes' layout
    assert out.nodes[1].outputs[0].shape == (5, 1, 24)


def test_a_formula_names_a_known_layout() -> None:
    assert set(LAYOUT_RULES) == set(FORMULA_LAYOUTS)
    with pytest.raises(SpecError, match="unknown layout 'diagonal'"):
        OpFormula("toy.op", lambda call: 0, layout="diagonal")
