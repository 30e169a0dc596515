"""One rank's graphs for ``zrt profile --tp/--cp/--ep``: the captured phases through the
parallel transforms (TP/SP, CP, EP: :func:`zrt_core.transforms.parallel.apply_phases`, the
layout Megatron-Core gives each module), so the kernels collected are one rank's shapes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def rank_graphs(captured: Any, phases: Sequence[str], hardware: Any, host: Any, *, tp: int,
                cp: int, ep: int, batch: int, seq_len: int, dtype: str) -> list[Any]:
    """The per-rank graphs of ``phases`` at ``tp`` × ``cp`` (× ``ep``, carved from a data
    parallel group as wide as ``ep``, Megatron-Core's expert folding).

    :raises LayoutError: a layout the model does not divide (heads, experts, sequence).
    """
    from zrt_core.strategy import InferSpec, Parallel, check_layout, train_spec_defaults
    from zrt_core.transforms.base import TransformContext
    from zrt_core.transforms.parallel import TPPlan, apply_phases

    training = any(p.startswith("train") for p in phases)
    parallel = Parallel(tp=tp, cp=cp, ep=ep, dp=ep)
    train = infer = None
    if training:
        train = train_spec_defaults(parallel, micro_batch=batch, global_batch=batch * ep,
                                    seq_len=seq_len)
    else:
        infer = InferSpec(input_len=seq_len, output_len=1, batch=batch, dtype=dtype)
    parallel = check_layout(parallel, captured.dims, train=train)
    ctx = TransformContext(dims=captured.dims, hardware=hardware, parallel=parallel,
                           host=host, train=train, infer=infer)
    out = apply_phases({p: captured.graph(p) for p in phases}, ctx, TPPlan())
    return [out[p] for p in phases]
