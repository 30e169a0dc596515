"""Training transforms: recompute, mixed precision, data-parallel gradient sync, ZeRO/FSDP
parameter gathers, the optimizer step graph and CPU offload of optimizer states.

They run on the ``train_forward`` / ``train_backward`` graphs of one capture (one micro-batch
on one device, after the parallel transforms have sharded shapes) and follow what
Megatron-LM / TransformerEngine / DeepSpeed / FSDP execute; ``docs/training-model.md``
gives each rule and its source. Every node a transform adds is an ordinary :class:`OpNode`
priced by the cost backends; collectives carry the attrs of ``docs/architecture.md``.

Order (what :mod:`zrt_core.estimate.training` runs): fusion → parallel → :class:`Precision`
→ :func:`mark_weight_grads` → :class:`Recompute` → :class:`ParamGather` /
:class:`GradientSync`; :func:`optimizer_graph` builds the ``optimizer`` phase.
"""

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core.errors import (  # noqa: F401  (the old module's imported names)
    SpecError,
)
from zrt_core.ir.graph import (  # noqa: F401  (the old module's imported names)
    Category,
    LayerTemplate,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
    dtype_bytes,
)
from zrt_core.transforms.training.attention import (  # noqa: F401
    CORE_ATTENTION_ATTR,
    UnfusedAttention,
    _bhsd,
    _rewired,
)
from zrt_core.transforms.training.common import (  # noqa: F401
    _EXPERT_PARAM,
    _FLOAT_DTYPES,
    INPUT_GRAD,
    QUANTIZE_ATTR,
    RECOMPUTE_ATTR,
    WEIGHT_GRAD,
    _next_id,
    _tensor_ids,
    collective_node,
    is_expert_param,
    mark_weight_grads,
)
from zrt_core.transforms.training.data_parallel import (  # noqa: F401
    GradientSync,
    ParamGather,
    dp_groups,
    grad_dtype,
)
from zrt_core.transforms.training.loss import (  # noqa: F401
    MEGATRON_CE_BACKWARD,
    MEGATRON_CE_FORWARD,
    inplace_cross_entropy,
    unfused_cross_entropy,
)
from zrt_core.transforms.training.optimizer import (  # noqa: F401
    ADAM_FLOPS_PER_ELEMENT,
    MUON_NS_STEPS,
    STATE_BYTES,
    optimizer_graph,
)
from zrt_core.transforms.training.overlap import (  # noqa: F401
    tp_overlap_hints,
)
from zrt_core.transforms.training.params import (  # noqa: F401
    ParamGroup,
    ParamInventory,
    _local_param,
    param_inventory,
)
from zrt_core.transforms.training.precision import (  # noqa: F401
    Precision,
    PrecisionPlan,
    _is_linear_gemm,
    _saved,
    precision_plan,
    rowwise_only,
)
from zrt_core.transforms.training.recompute import (  # noqa: F401
    Recompute,
    _copied_edges,
    _forward_hint,
    _rename_inputs,
    _renamed,
)
from zrt_core.transforms.training.recompute_modules import (  # noqa: F401
    RECOMPUTE_MODULES,
)
from zrt_core.transforms.training.recompute_modules import (  # noqa: F401
    attention_cores as _attention_cores,
)
from zrt_core.transforms.training.templates import (  # noqa: F401
    _SEQ_OFFSET,
    add_mtp_layers,
    split_layer_templates,
)
