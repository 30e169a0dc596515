"""Parallel transforms: every node's true per-rank shapes, FLOPs and bytes under TP, SP, CP
and EP, the collectives those layouts need, pipeline stages and data-parallel replicas.

How sharding is found
    Seeds come from the weights. Tensor parallelism follows the model's tensor-parallel plan
    (transformers puts ``base_model_tp_plan`` on each config class: ``colwise`` /
    ``rowwise`` per module) and, for parameters the plan does not name, module-name rules
    (``q/k/v/gate/up`` column-parallel, ``o/down`` row-parallel, experts by their FFN
    dimension, embedding and LM head vocabulary-parallel). Expert weights are split over
    EP along the expert axis; the sequence over CP: integer inputs (token ids, labels)
    and what the model builds from nothing before its first layer (positions from
    ``arange``, OPT's all-ones mask) split along their sequence axis, however they reach
    the embedding or the rotary tables, as Megatron slices a CP rank's batch. From the seeds a single
    pass over the dataflow carries each sharded axis through views, reshapes, transposes,
    elementwise ops, matmuls, attention and the MoE dispatch/combine, so every tensor gets
    its per-rank shape (heads/tp, ffn/tp, seq/cp, experts/ep). FLOPs and bytes are then
    re-evaluated by each node's registered formula on the per-rank shapes.

What is inserted (collective nodes follow docs/architecture.md)
    * A matmul that contracts over a sharded axis (a row-parallel linear, the input
      gradient of a column-parallel one, a vocabulary-parallel embedding) leaves a partial
      sum; it is reduced where something other than a view, an add of partial sums or the
      MoE combine first reads it: ``all_reduce`` (``reduce_scatter`` along tokens with SP).
    * With SP, tokens stay split over the TP ranks between the row- and column-parallel
      regions (norms and residuals run on seq/tp); an ``all_gather`` brings them back
      before each matmul with sharded weights.
    * CP: ring attention gets one ``send_recv`` of the (cp-1) KV blocks the ring passes,
      overlappable with the attention (``overlap="consumer"``); Ulysses an ``all_to_all``
      before (q, k, v) and after (output) the attention.
    * EP: an ``all_to_all`` after the dispatch and before the combine (the ranks of the EP
      group hold different tokens), or, when they hold the same tokens (EP inside the TP
      group, vLLM's TP+EP), each rank runs the rows routed to its experts and the combine
      output is reduced over the group.
    * Serving phases all-gather vocabulary-parallel logits at the end of the graph.

A single pass handles every group, so one layout costs one walk over the graph. The
engine (:func:`propagate_shapes`) is shared with shape rescaling (batch, KV length) in
:mod:`zrt_core.estimate`.
"""

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core.transforms.parallel._ops.matrix_ops import (  # noqa: F401
    _matmul_operands,
    _rule_attention,
    _rule_conv_backward,
    _rule_gradients,
    _rule_leading,
    _rule_matmul,
    _rule_query_attention,
)
from zrt_core.transforms.parallel._ops.model_ops import (  # noqa: F401
    _rule_embedding,
    _rule_indexer,
    _rule_moe,
    _rule_ssm,
)
from zrt_core.transforms.parallel._ops.pointwise_ops import (  # noqa: F401
    _rule_broadcast,
    _rule_complex,
    _rule_fresh,
    _rule_same,
)
from zrt_core.transforms.parallel._ops.reduction_ops import (  # noqa: F401
    _rule_reduce,
)
from zrt_core.transforms.parallel._ops.registry import (  # noqa: F401
    LAYOUT_RULES,
    Rule,
    rule_for,
)
from zrt_core.transforms.parallel._ops.view_ops import (  # noqa: F401
    _rule_cat,
    _rule_index,
    _rule_permute,
    _rule_positional,
    _rule_select,
    _rule_squeeze,
    _rule_stack,
    _rule_unsqueeze,
    _rule_view,
    view_groups,
)
from zrt_core.transforms.parallel.cp import (  # noqa: F401
    ContextParallel,
)
from zrt_core.transforms.parallel.dp import (  # noqa: F401
    DataParallelReplicas,
)
from zrt_core.transforms.parallel.engine import (  # noqa: F401
    _CORE_REGISTRY,
    _NODE_FIELDS,
    Inserted,
    ShapePass,
    _derived_attrs,
    _flatten,
    _group_rows,
    _hashable,
    _retensor,
    _rewire,
    _set,
    _Slot,
    _updated_attrs,
    core_registry,
    propagate_shapes,
    replace_graph,
    replace_node,
    reprice,
    scaled_layout,
    with_shape,
)
from zrt_core.transforms.parallel.ep import (  # noqa: F401
    ExpertParallel,
)
from zrt_core.transforms.parallel.layout import (  # noqa: F401
    _TOKEN_GROUPS,
    PARALLEL_GROUPS,
    Factors,
    Layout,
    _layout,
    _merge_factors,
    _product,
    _scaled,
    _without,
)
from zrt_core.transforms.parallel.op_families import (  # noqa: F401
    _MATMUL,
    _PARTIAL_SAFE,
    _REDUCE,
    _SAME_SHAPE,
    _SHAPE_ONLY,
    _SOFTMAX,
    _VIEW_LIKE,
    op_base,
)
from zrt_core.transforms.parallel.pp import (  # noqa: F401
    PipelinePlan,
    PipelineStages,
    Stage,
    boundary_bytes,
    stage_graph,
)
from zrt_core.transforms.parallel.sharding import (  # noqa: F401
    _cache_inputs,
    _covered,
    _is_conv1d,
    _nbytes,
    _ParallelPass,
    _reduce_group,
    _ring_attention_costs,
    _token_axis,
    cache_inputs,
    collective,
    sequence_axis,
)
from zrt_core.transforms.parallel.sp import (  # noqa: F401
    SequenceParallel,
)
from zrt_core.transforms.parallel.tp import (  # noqa: F401
    TensorParallel,
)
from zrt_core.transforms.parallel.tp_plan import (  # noqa: F401
    _KV_PROJ,
    _NAME_RULES,
    _PLAN_CACHE,
    _ROUTER,
    COLWISE,
    REPLICATED,
    ROWWISE,
    VOCAB,
    TPPlan,
    _style,
)
from zrt_core.transforms.parallel.transform import (  # noqa: F401
    ExtraAttrs,
    ExtraSeeds,
    ParallelTransform,
    _with_layout_meta,
    apply_phases,
)
