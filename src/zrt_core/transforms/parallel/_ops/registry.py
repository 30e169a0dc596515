"""The one registry of sharding rules: which rule a node follows (its formula's declared
``layout``, else the core's rule for its op family), and the named rules plugins may declare.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from zrt_core.ir.graph import (
    OpNode,
    TensorMeta,
)
from zrt_core.transforms.parallel._ops.matrix_ops import (
    _rule_attention,
    _rule_conv_backward,
    _rule_gradients,
    _rule_leading,
    _rule_matmul,
    _rule_query_attention,
)
from zrt_core.transforms.parallel._ops.model_ops import (
    _rule_delta,
    _rule_embedding,
    _rule_indexer,
    _rule_moe,
    _rule_ssm,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import (
    _rule_broadcast,
    _rule_complex,
    _rule_fresh,
    _rule_same,
)
from zrt_core.transforms.parallel._ops.reduction_ops import _rule_reduce
from zrt_core.transforms.parallel._ops.view_ops import (
    _rule_cat,
    _rule_index,
    _rule_permute,
    _rule_positional,
    _rule_select,
    _rule_squeeze,
    _rule_unsqueeze,
    _rule_view,
)
from zrt_core.transforms.parallel.layout import Layout
from zrt_core.transforms.parallel.op_families import (
    _MATMUL,
    _REDUCE,
    _SHAPE_ONLY,
    _VIEW_LIKE,
    op_base,
)

if TYPE_CHECKING:
    from zrt_core.formulas.registry import FormulaRegistry


# -- rules --------------------------------------------------------------------------------

Rule = Callable[[OpNode, list[TensorMeta], list[Layout]], list[Layout]]


def rule_for(node: OpNode, registry: FormulaRegistry | None = None) -> Rule:
    """The layout rule of a node: the one its formula declares (``OpFormula.layout``, for
    plugin kernels), else the core's rule for its op."""
    if registry is not None:
        formula = registry.lookup(node.op)
        if formula is not None and formula.layout is not None:
            return LAYOUT_RULES[formula.layout]
    base = op_base(node.op)
    if node.op.startswith("comm."):
        return _rule_same
    if base in _VIEW_LIKE:
        return _rule_view
    if base in ("t", "transpose", "permute", "swapaxes", "movedim"):
        return _rule_permute
    if base == "unsqueeze":
        return _rule_unsqueeze
    if base == "squeeze":
        return _rule_squeeze
    if base in ("split", "split_with_sizes", "chunk", "slice", "narrow", "unbind",
                "slice_backward", "constant_pad_nd", "repeat", "roll", "flip"):
        return _rule_positional
    if base in ("select", "select_backward"):
        return _rule_select
    if base in ("cat", "concat", "stack"):
        return _rule_cat
    if base in _MATMUL:
        return _rule_matmul
    if base in ("attention", "attention_backward", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_cudnn_attention",
                "_scaled_dot_product_flash_attention_for_cpu"):
        return _rule_attention
    if base == "embedding":
        return _rule_embedding
    if base in ("moe_dispatch", "moe_combine", "moe_dispatch_backward",
                "moe_combine_backward"):
        return _rule_moe
    if base == "index":
        return _rule_index
    if base in ("view_as_complex", "view_as_real"):
        return _rule_complex
    if base in ("ssd_chunk_scan", "ssm_state_update"):
        return _rule_ssm
    if base in ("gated_delta_chunk", "gated_delta_recurrent"):
        return _rule_delta
    if base == "gated_delta_chunk_backward":
        return _rule_gradients
    if base == "convolution_backward":
        return _rule_conv_backward
    if base == "ssd_chunk_scan_backward":
        return _rule_gradients
    if base in _REDUCE or base in ("topk", "sort", "cumsum", "nll_loss_forward"):
        return _rule_reduce
    if base in _SHAPE_ONLY:
        return _rule_fresh
    return _rule_broadcast


#: Layout rules a formula may name (``OpFormula.layout``) for ops the core has no rule for.
LAYOUT_RULES: Mapping[str, Rule] = {
    "attention": _rule_query_attention,
    "leading": _rule_leading,
    "gradients": _rule_gradients,
    "indexer": _rule_indexer,
}
