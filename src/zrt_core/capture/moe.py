"""MoE experts on fake tensors: a routing assumption instead of data-dependent loops.

Which expert a token picks depends on data a fake tensor does not have. The graph therefore
represents an assumed routing: balanced by default (each expert receives
``tokens·top_k/num_experts`` rows), or with the busiest expert carrying ``moe_imbalance``
times the mean. The experts run as production MoE layers do — one dispatch (token
permutation), one grouped GEMM per projection at the true per-expert shapes (the rows per
expert travel with the node as ``attrs["group_rows"]``), one combine — with no per-expert
Python loop.

Two scoped patches use it, both contributed through ``zrt_model_patches``:

- ``zrt.balanced_experts``: registers :func:`balanced_experts_forward` in transformers'
  ``ExpertsInterface`` (every transformers-5 MoE family whose experts class is decorated
  with ``use_experts_implementation``) and selects it in the config.
- ``zrt.llama4_experts``: Llama 4's ``Llama4TextMoe`` runs every expert on every token
  in HF's reference code (``num_experts`` times the routed FLOPs); inside the context its
  forward routes through the same balanced path.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

from zrt_core.capture.ops import ensure_ops
from zrt_core.capture.recorder import annotate

EXPERTS_NAME = "zrt_balanced"

_IMBALANCE: contextvars.ContextVar[float] = contextvars.ContextVar("zrt_moe_imbalance",
                                                                   default=1.0)
# the same value for Dynamo (graph mode), which cannot trace ContextVar.get
_IMBALANCE_TRACED: list[float] = [1.0]


def _imbalance() -> float:
    import torch

    if torch.compiler.is_compiling():
        return _IMBALANCE_TRACED[0]
    return _IMBALANCE.get()


@contextlib.contextmanager
def _imbalance_set(value: float) -> Iterator[None]:
    token = _IMBALANCE.set(value)
    before = _IMBALANCE_TRACED[0]
    _IMBALANCE_TRACED[0] = value
    try:
        yield
    finally:
        _IMBALANCE_TRACED[0] = before
        _IMBALANCE.reset(token)


def routing_histogram(tokens: int, top_k: int, num_experts: int, imbalance: float = 1.0
                      ) -> tuple[int, ...]:
    """Rows each expert receives: ``tokens·top_k`` assignments over ``num_experts``.

    Balanced: as even as integers allow. With ``imbalance > 1`` expert 0 receives
    ``round(imbalance · mean)`` rows (at most ``tokens``: a token picks an expert once) and
    the others share the rest evenly.

    >>> routing_histogram(4, 2, 4)
    (2, 2, 2, 2)
    >>> routing_histogram(1, 2, 4)
    (1, 1, 0, 0)
    >>> routing_histogram(8, 2, 4, imbalance=2.0)
    (8, 3, 3, 2)
    """
    total = tokens * top_k
    if num_experts <= 0:
        return ()
    if imbalance <= 1.0 or num_experts == 1:
        base, extra = divmod(total, num_experts)
        return tuple(base + 1 if i < extra else base for i in range(num_experts))
    mean = total / num_experts
    hot = min(tokens, total, max(math.ceil(mean), round(imbalance * mean)))
    base, extra = divmod(total - hot, num_experts - 1)
    others = [base + 1 if i < extra else base for i in range(num_experts - 1)]
    return (hot, *others)


def cumulative_rows(rows: tuple[int, ...]) -> tuple[int, ...]:
    """The grouped GEMM's ``offs``: the end row of each group (pure Python, so graph mode
    can evaluate it once instead of tracing the loop, see capture.graphmode_lean)."""
    cumulative, acc = [], 0
    for r in rows:
        acc += r
        cumulative.append(acc)
    return tuple(cumulative)


def _offsets(rows: tuple[int, ...], device: Any) -> Any:
    import torch

    return torch.tensor(list(cumulative_rows(rows)), dtype=torch.int32, device=device)


def grouped_linear(x: Any, weight_kn: Any, offsets: Any, rows: tuple[int, ...]) -> Any:
    """``x [M, K]`` times the per-group ``weight_kn [G, K, N]``: one grouped GEMM node."""
    import torch

    with annotate(group_rows=list(rows)):
        if weight_kn.dtype == torch.bfloat16:
            return torch._grouped_mm(x.to(weight_kn.dtype), weight_kn, offs=offsets)
        import transformers.integrations.moe  # noqa: F401  (defines the fallback op)

        return torch.ops.transformers.grouped_mm_fallback(x.to(weight_kn.dtype), weight_kn,
                                                          offs=offsets)


def routed_experts(hidden: Any, top_k_index: Any, top_k_weights: Any, *, num_experts: int,
                   up_kn: Any, down_kn: Any, activate: Any, up_bias: Any = None,
                   down_bias: Any = None, post: Any = None) -> Any:
    """Dispatch → grouped up-projection → activation → grouped down-projection → combine.

    ``up_kn`` / ``down_kn`` are ``[E, K, N]`` views of the expert weights.
    """
    import torch

    ensure_ops()
    tokens, top_k = top_k_index.shape
    rows = routing_histogram(tokens, top_k, num_experts, _imbalance())
    routed, row_token, row_expert = torch.ops.zrt.moe_dispatch(hidden, top_k_index,
                                                               num_experts)
    offsets = _offsets(rows, hidden.device)
    proj = grouped_linear(routed, up_kn, offsets, rows)
    if up_bias is not None:
        proj = proj + up_bias[row_expert]
    proj = activate(proj)
    out = grouped_linear(proj, down_kn, offsets, rows)
    if down_bias is not None:
        out = out + down_bias[row_expert]
    if post is not None:
        out = post(out)
    return torch.ops.zrt.moe_combine(out, row_token, top_k_weights).to(hidden.dtype)


def balanced_experts_forward(self: Any, hidden_states: Any, top_k_index: Any,
                             top_k_weights: Any) -> Any:
    """An ``ExpertsInterface`` implementation (the signature of ``grouped_mm`` in
    transformers.integrations.moe), routing under the assumed histogram."""
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_kn = up if self.is_transposed else up.transpose(-2, -1)
    down_kn = self.down_proj if self.is_transposed else self.down_proj.transpose(-2, -1)
    if self.has_bias:
        up_bias = self.gate_up_proj_bias if self.has_gate else self.up_proj_bias
        down_bias = self.down_proj_bias
    else:
        up_bias = down_bias = None
    activate = self._apply_gate if self.has_gate else self.act_fn
    post = self.post_expert_norm if self.has_post_expert_norm else None
    return routed_experts(hidden_states, top_k_index, top_k_weights,
                          num_experts=self.num_experts, up_kn=up_kn, down_kn=down_kn,
                          activate=activate, up_bias=up_bias, down_bias=down_bias, post=post)


@contextlib.contextmanager
def balanced_experts_context(config: Any, options: Any) -> Iterator[None]:
    """Register and select :data:`EXPERTS_NAME` while open; set the imbalance."""
    from transformers.integrations.moe import ExpertsInterface

    ensure_ops()
    mapping = ExpertsInterface._global_mapping
    previous = mapping.get(EXPERTS_NAME)
    mapping[EXPERTS_NAME] = balanced_experts_forward
    before = getattr(config, "_experts_implementation_internal", None)
    try:
        with _imbalance_set(float(getattr(options, "moe_imbalance", 1.0))):
            config._experts_implementation = EXPERTS_NAME
            yield
    finally:
        config._experts_implementation_internal = before
        if previous is None:
            mapping.pop(EXPERTS_NAME, None)
        else:
            mapping[EXPERTS_NAME] = previous


def uses_experts_interface(config: Any) -> bool:
    """Whether the config's model has an experts class dispatched by ``ExpertsInterface``."""
    num = 0
    for key in ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            num = v
            break
    return num > 1 and getattr(config, "model_type", "") not in LLAMA4_TYPES


LLAMA4_TYPES = ("llama4", "llama4_text")


def _llama4_moe_forward(self: Any, hidden_states: Any) -> tuple[Any, Any]:
    """Llama 4's MoE block through the routed path (HF's reference runs all experts).

    The router's sigmoid scores weight the expert outputs at combine; Llama 4 applies
    them to the expert inputs, which costs the same.
    """
    import torch
    import torch.nn.functional as F

    hidden = hidden_states.reshape(-1, self.hidden_dim)
    with annotate(moe_router=True):  # the router's work, recorded outside its module
        router_logits = F.linear(hidden, self.router.weight, self.router.bias)
        top_value, top_index = torch.topk(router_logits, self.top_k, dim=1)
        scores = torch.sigmoid(top_value.float()).to(hidden.dtype)
    experts = self.experts

    def activate(gate_up: Any) -> Any:
        gate, up = gate_up.chunk(2, dim=-1)
        return up * experts.act_fn(gate)

    routed = routed_experts(hidden, top_index, scores, num_experts=self.num_experts,
                            up_kn=experts.gate_up_proj, down_kn=experts.down_proj,
                            activate=activate)
    out = self.shared_expert(hidden)
    out.add_(routed)
    return out, router_logits


@contextlib.contextmanager
def llama4_experts_context(config: Any, options: Any) -> Iterator[None]:
    """Swap ``Llama4TextMoe.forward`` for the routed path while open."""
    from transformers.models.llama4 import modeling_llama4

    ensure_ops()
    cls = modeling_llama4.Llama4TextMoe
    original = cls.forward
    cls.forward = _llama4_moe_forward
    try:
        with _imbalance_set(float(getattr(options, "moe_imbalance", 1.0))):
            yield
    finally:
        cls.forward = original
