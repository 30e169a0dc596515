"""Read the problem dimensions of a node from its tensor shapes: GEMM (b, m, n, k) and
attention (b, h, h_kv, s_q, s_kv, d, causal).

The roofline prices by these dimensions and the measured tables are keyed by them, so both
read a node the same way. Pure functions of the node; no torch.
"""

from __future__ import annotations

from attrs import frozen

from zrt_core.formulas.aten import attention_pairs
from zrt_core.ir.graph import DTYPE_BYTES, Category, OpNode

#: GEMM-like aten ops by base name (``aten.addmm.default`` → ``addmm``).
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "linear", "matmul",
                      "_scaled_mm", "_grouped_mm", "_scaled_grouped_mm"})
#: Ops whose first input is a bias/accumulator, not the left operand.
_ACCUMULATE_FIRST = frozenset({"addmm", "baddbmm", "addbmm"})
#: Ops whose batch dimension is a batch of independent matrices (not flattened into M).
_BATCHED = frozenset({"bmm", "baddbmm"})
#: Grouped GEMMs: the weight operand carries the group (expert) dimension.
GROUPED_GEMM_OPS = frozenset({"_grouped_mm", "_scaled_grouped_mm"})
#: Every op that multiplies rows split among groups by a per-group weight: the kernels, and
#: transformers' loop of one ``mm`` per group (its forward and its backward op, which zrt's
#: capture records for dtypes ``_grouped_mm`` lacks: :func:`zrt_core.capture.moe.
#: grouped_linear`)
_GROUPED = GROUPED_GEMM_OPS | {"grouped_mm_fallback", "grouped_mm_fallback_backward"}
#: Node attribute of a grouped GEMM run as one GEMM per group issued round-robin over this
#: many streams (TransformerEngine's ``GroupedLinear`` in training:
#: :mod:`zrt_core.transforms.training.experts`); absent: one grouped kernel.
EXPERT_STREAMS_ATTR = "expert_streams"
#: With :data:`EXPERT_STREAMS_ATTR`: the groups (local experts) of the loop.
EXPERT_GROUPS_ATTR = "expert_groups"
#: With :data:`EXPERT_STREAMS_ATTR`: False when the loop is replayed from a CUDA graph (no
#: per-kernel ``expert_kernel_us``).
EXPERT_EAGER_ATTR = "expert_eager"
#: An attention node's kernel generation when it is not the device's own (``flash2``,
#: ``flash1``: :data:`zrt_core.hardware.ATTENTION_GENERATIONS`); the roofline prices it at
#: that generation's published rate.
ATTENTION_KERNEL_ATTR = "attention_kernel"


def op_base(op: str) -> str:
    """The operator name without namespace and overload: ``aten.mm.default`` → ``mm``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@frozen
class GemmDims:
    """``batch`` independent (or grouped) ``m × k`` by ``k × n`` products.

    For a grouped GEMM ``batch`` is the number of groups and ``m`` the mean rows per group.
    """

    batch: int
    m: int
    n: int
    k: int
    grouped: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def gemm_dims(node: OpNode) -> GemmDims | None:
    """GEMM dimensions of a matmul-category node, or None when its shapes do not say.

    ``n`` is the output's last dimension; ``m`` is the rest of the output (or its second-last
    dimension for batched ops); ``k`` follows from the node's FLOPs (``2·b·m·n·k``) so a fused
    matmul (gate+up, QKV) is read consistently with its counted work, else from the left
    operand's last dimension.
    """
    if not node.outputs or not node.outputs[0].shape:
        return None
    out = node.outputs[0].shape
    base = op_base(node.op)
    n = out[-1]
    grouped = base in _GROUPED
    if grouped:
        weight = node.inputs[1] if len(node.inputs) > 1 else None
        groups = weight.shape[0] if weight is not None and len(weight.shape) == 3 else 1
        if len(out) == 3:  # [G, M, N] by [G, K, N]: a plain batch of groups
            batch, m = out[0], out[1]
        else:  # [total M, N]: rows split among the groups (mean rows per group)
            batch, m = groups, max(1, _prod(out[:-1]) // max(groups, 1))
    elif (base in _BATCHED or (base not in GEMM_OPS and not _has_param(node))) and len(out) >= 3:
        batch, m = _prod(out[:-2]), out[-2]
    else:
        batch, m = 1, _prod(out[:-1])
    if n <= 0 or m <= 0 or batch <= 0:
        return None
    if node.flops > 0:
        k = max(1, round(node.flops / (2 * batch * m * n)))
    else:
        left = _left_operand(node, base)
        if left is None or not left.shape:
            return None
        k = left.shape[-1]
    return GemmDims(batch=batch, m=m, n=n, k=k, grouped=grouped)


#: the row alignment (bytes) above which a GEMM's loads are as wide as they go: Hopper's
#: tensor-memory copies need 16-byte strides (docs/cost-model.md, "Row alignment")
FULL_ROW_ALIGNMENT = 16


def gemm_row_alignment(node: OpNode, dims: GemmDims) -> int:
    """The bytes every stored row of a GEMM's operands and output is aligned to, up to
    :data:`FULL_ROW_ALIGNMENT`: the largest power of two dividing each row's length (a
    leading dimension) times its element size.

    The rows are read from the tensors, not from ``dims`` (whose ``k`` a grouped GEMM's
    mean rows per group leave inexact): the output's last dimension; the left operand's
    (``k``: the activation of a forward or an input gradient); and ``m`` where no input is
    a parameter, as in a weight gradient ``dYᵀ X``, whose left operand is a transposed view
    of rows ``m`` long. The right operand's recorded last dimension is ``n`` whether it is
    a weight's transposed view or not, so the output stands for it. A grouped GEMM's ``m``
    is a row count, never a length. Only GEMM operators: a convolution in the ``matmul``
    category runs other kernels.
    """
    base = op_base(node.op)
    left = _left_operand(node, base)
    if (base not in GEMM_OPS or left is None or not node.outputs
            or not node.outputs[0].shape):
        return FULL_ROW_ALIGNMENT
    out = node.outputs[0]
    left_size = DTYPE_BYTES.get(left.dtype, 2)
    rows = [(out.shape[-1], DTYPE_BYTES.get(out.dtype, 2)), (left.shape[-1], left_size)]
    if not dims.grouped and not _has_param(node):
        rows.append((dims.m, left_size))
    align = FULL_ROW_ALIGNMENT
    for length, size in rows:
        row = int(length * size)
        if row > 0:
            align = min(align, row & -row)
    return align


def _has_param(node: OpNode) -> bool:
    return any(t.param is not None for t in node.inputs)


def _left_operand(node: OpNode, base: str):
    tensors = [t for t in node.inputs if t.shape]
    if base in _ACCUMULATE_FIRST and len(tensors) > 1:
        return tensors[1]
    return tensors[0] if tensors else None


def gemm_operand_dtypes(node: OpNode) -> tuple[str, ...]:
    """The dtypes of a GEMM's two operands (a bias or accumulator input skipped)."""
    operands = [t for t in node.inputs if t.shape and len(t.shape) >= 2]
    if op_base(node.op) in _ACCUMULATE_FIRST and len(operands) > 2:
        operands = operands[1:]
    return tuple(t.dtype for t in operands[:2])


def gemm_compute_dtype(node: OpNode) -> str:
    """The dtype whose tensor-core rate a GEMM runs at: the wider of its two operands.

    A weight-only quantised GEMM (bf16 activations × int4 weights) runs at the bf16 rate —
    the narrow weights are dequantised in registers — while fp8 × fp8 runs at the fp8 rate.
    """
    dtypes = gemm_operand_dtypes(node)
    if not dtypes:
        return node.outputs[0].dtype if node.outputs else "bfloat16"
    return max(dtypes, key=lambda d: DTYPE_BYTES.get(d, 2))


@frozen
class AttentionDims:
    """One attention call: ``b`` sequences, ``h`` query heads over ``h_kv`` KV heads.

    ``window``, ``chunk`` and ``topk`` (0 = none) restrict the keys a query sees, as the
    capture's ``zrt.attention`` op carries them; ``d_v`` is the value head dim.
    """

    b: int
    h: int
    h_kv: int
    s_q: int
    s_kv: int
    d: int
    causal: bool
    d_v: int = 0
    window: int = 0
    chunk: int = 0
    topk: int = 0

    @property
    def pairs(self) -> int:
        """(query, key) pairs one head computes (``formulas.aten.attention_pairs``)."""
        return attention_pairs(self.s_q, self.s_kv, is_causal=self.causal, window=self.window,
                               chunk=self.chunk, topk=self.topk)

    @property
    def visible_keys(self) -> float:
        """Mean keys one query sees: the length of a FlashAttention tile's KV loop."""
        return self.pairs / self.s_q

    @property
    def forward_flops(self) -> int:
        """QKᵀ and PV over the visible pairs: ``2·b·h·pairs·(d + d_v)``."""
        return 2 * self.b * self.h * self.pairs * (self.d + (self.d_v or self.d))

    @property
    def backward_flops(self) -> int:
        """Recomputed QKᵀ, dV, dP, dQ, dK: ``2·b·h·pairs·(3d + 2d_v)``."""
        return 2 * self.b * self.h * self.pairs * (3 * self.d + 2 * (self.d_v or self.d))


_INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})


def attention_dims(node: OpNode) -> AttentionDims | None:
    """Attention dimensions of a fused attention node.

    Query, key and value are the first three inputs of a forward op and inputs 1-3 of a
    backward op (after the output gradient), as in torch SDPA and the capture's
    ``zrt.attention``; layout ``[b, heads, seq, head_dim]`` unless ``attrs["layout"]`` is
    ``"bshd"``. ``is_causal``, ``window`` and ``chunk`` come from attrs; a rank-3 integer
    input is DeepSeek's top-k ``indices``.
    """
    first = 1 if is_backward(node) else 0
    qkv = node.inputs[first:first + 3]
    if len(qkv) < 2 or any(len(t.shape) != 4 for t in qkv):
        return None
    q, k = qkv[0], qkv[1]
    d_v = qkv[2].shape[-1] if len(qkv) == 3 else q.shape[-1]
    if node.attrs.get("layout") == "bshd":
        b, s_q, h, d = q.shape
        _, s_kv, h_kv, _ = k.shape
    else:
        b, h, s_q, d = q.shape
        _, h_kv, s_kv, _ = k.shape
    topk = 0
    for t in node.inputs[first + 3:]:
        if t.dtype in _INT_DTYPES and len(t.shape) == 3:
            topk = t.shape[-1]
    attrs = node.attrs
    causal = bool(attrs.get("is_causal", attrs.get("causal", False)))
    return AttentionDims(b=b, h=h, h_kv=h_kv, s_q=s_q, s_kv=s_kv, d=d, causal=causal, d_v=d_v,
                         window=int(attrs.get("window") or 0),
                         chunk=int(attrs.get("chunk") or 0), topk=topk)


def is_backward(node: OpNode) -> bool:
    """A backward kernel by its name (``..._backward``, ``..._bwd``) or ``attrs["backward"]``.

    Not by phase: recompute puts forward kernels into the backward graph.
    """
    op = node.op
    return "backward" in op or "bwd" in op or bool(node.attrs.get("backward", False))


def is_gemm(node: OpNode) -> bool:
    return node.category == Category.MATMUL or op_base(node.op) in GEMM_OPS
