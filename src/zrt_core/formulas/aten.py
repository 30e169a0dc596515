"""FLOP and byte formulas of the aten operators and of the harness's ``zrt::`` operators.

Pure functions of shapes (and schema arguments), in the manner of
``torch.utils.flop_counter``; importing this module imports no torch. Conventions:

- A multiply-add is 2 FLOPs. Matmul FLOPs exclude the bias add (as torch's flop counter).
- Pointwise ops: one FLOP per output element, transcendental functions included.
- Reductions: one FLOP per input element.
- Softmax: 5 per element forward (max, subtract, exp, sum, divide), 4 backward.
- Layer norm: 5 per element forward (mean, centre, variance, normalise, affine), 8
  backward; RMS norm 4 forward, 6 backward.
- Attention counts its two matmuls only (``QKᵀ`` and ``PV``), over the query-key pairs a
  query can actually see: a causal mask halves the square, a sliding window keeps its
  band, a chunk its block, a top-k index its k keys. Backward is five matmuls (recompute
  ``QKᵀ``, ``dV``, ``dP``, ``dQ``, ``dK``): ``2·(3·D + 2·Dv)`` per pair against
  ``2·(D + Dv)`` forward — 2.5x when ``D == Dv``.
- Bytes default to every input read once and every non-view output written once
  (:func:`zrt_core.formulas.registry.default_bytes`); gathers read only the rows they take,
  scatters and ``copy_`` write only what they write, grouped GEMMs read only the weights
  of groups that receive rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from zrt_core.formulas.registry import OpCall, OpFormula, default_bytes
from zrt_core.ir.graph import Category, TensorMeta

# -- helpers ----------------------------------------------------------------------------


def _prod(values: Iterable[int]) -> int:
    n = 1
    for v in values:
        n *= int(v)
    return n


def _out_numel(call: OpCall) -> int:
    return call.outputs[0].numel if call.outputs else 0


def _in_numel(call: OpCall) -> int:
    return call.inputs[0].numel if call.inputs else 0


def _per_output_element(factor: int) -> Callable[[OpCall], int]:
    def flops(call: OpCall) -> int:
        return factor * _out_numel(call)
    return flops


def _per_input_element(factor: int) -> Callable[[OpCall], int]:
    def flops(call: OpCall) -> int:
        return factor * _in_numel(call)
    return flops


def _zero_flops(_call: OpCall) -> int:
    return 0


def _write_only_bytes(call: OpCall) -> tuple[int, int]:
    """Creation and fill ops: nothing read, every output written."""
    return 0, sum(t.nbytes for t in call.outputs)


# -- matmul -----------------------------------------------------------------------------


def mm_flop(call: OpCall) -> int:
    """``[M, K] @ [K, N]``: ``2·M·K·N``."""
    a, b = call.inputs[0].shape, call.inputs[1].shape
    return 2 * a[0] * a[1] * b[1]


def addmm_flop(call: OpCall) -> int:
    """``bias + [M, K] @ [K, N]``: ``2·M·K·N`` (bias not counted)."""
    a, b = call.inputs[1].shape, call.inputs[2].shape
    return 2 * a[0] * a[1] * b[1]


def bmm_flop(call: OpCall) -> int:
    """``[B, M, K] @ [B, K, N]``: ``2·B·M·K·N``."""
    a, b = call.inputs[0].shape, call.inputs[1].shape
    return 2 * a[0] * a[1] * a[2] * b[2]


def baddbmm_flop(call: OpCall) -> int:
    a, b = call.inputs[1].shape, call.inputs[2].shape
    return 2 * a[0] * a[1] * a[2] * b[2]


def mv_flop(call: OpCall) -> int:
    return 2 * call.inputs[0].numel


def addmv_flop(call: OpCall) -> int:
    return 2 * call.inputs[1].numel


def dot_flop(call: OpCall) -> int:
    return 2 * call.inputs[0].numel


def grouped_mm_flop(call: OpCall) -> int:
    """``aten._grouped_mm(a, b, offs)``, which torch's flop counter does not count.

    - 2D x 3D (MoE forward, ``dX``): ``a [M_total, K]``, ``b [G, K, N]`` → ``2·M_total·K·N``;
    - 2D x 2D (``dW``, groups along K): ``a [M, K_total]``, ``b [K_total, N]`` →
      ``[G, M, N]``, ``2·M·K_total·N``;
    - 3D x 2D and 3D x 3D: ``2 · out.numel · K``.
    """
    a, b = call.inputs[0].shape, call.inputs[1].shape
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * a[1] * b[1]
    return 2 * _out_numel(call) * a[-1]


def grouped_mm_bytes(call: OpCall) -> tuple[int, int]:
    """Only groups that receive rows read their weights (and write their ``dW``).

    ``attrs["group_rows"]`` (rows per group, from the harness's routing assumption) says
    which groups are active; without it every group is assumed active.
    """
    read, written = default_bytes(call)
    rows = call.attrs.get("group_rows")
    if not rows:
        return read, written
    active = sum(1 for r in rows if r > 0) / len(rows)
    a, b = call.inputs[0], call.inputs[1]
    if len(a.shape) == 2 and len(b.shape) == 2:  # dW: [G, M, N] out, groups along K
        written = int(sum(t.nbytes for t in call.outputs) * active)
        return read, written
    grouped = b if len(b.shape) == 3 else a
    read -= grouped.nbytes - int(grouped.nbytes * active)
    return read, written


def scaled_mm_flop(call: OpCall) -> int:
    a, b = call.inputs[0].shape, call.inputs[1].shape
    return 2 * a[0] * a[1] * b[1]


def _conv_macs_per_output(w: Sequence[int]) -> int:
    """Multiply-adds per output element: ``C_in/groups · prod(kernel)`` = ``w.numel / w[0]``.

    The weight is ``[C_out, C_in/groups, *k]`` (``[C_in, C_out/groups, *k]`` transposed),
    so this holds for grouped and depthwise convolutions too.
    """
    return _prod(w[1:])


def convolution_flop(call: OpCall) -> int:
    """``2 · out.numel · C_in/groups · prod(k)`` (torch's count when groups == 1).

    A transposed convolution is the gradient of a convolution: it costs ``2 · in.numel ·
    C_out/groups · prod(k)``.
    """
    x, w = call.inputs[0].shape, call.inputs[1].shape
    if call.attrs.get("transposed", False):
        return 2 * _prod(x) * _conv_macs_per_output(w)
    return 2 * call.outputs[0].numel * _conv_macs_per_output(w)


def convolution_backward_flop(call: OpCall) -> int:
    """Input gradient and weight gradient (per ``output_mask``), each as costly as forward.

    ``grad_input`` is a transposed convolution of ``grad_out`` with the weight and
    ``grad_weight`` correlates input and ``grad_out``: both perform the forward's
    ``out.numel · C_in/groups · prod(k)`` multiply-adds. (torch's flop counter ignores
    ``groups`` in the weight gradient, over-counting depthwise convolutions C-fold.)
    """
    grad_out, x, w = (t.shape for t in call.inputs[:3])
    mask = call.attrs.get("output_mask", (True, True, True))
    transposed = bool(call.attrs.get("transposed", False))
    forward = 2 * _prod(x if transposed else grad_out) * _conv_macs_per_output(w)
    return forward * (int(bool(mask[0])) + int(bool(mask[1])))


# -- attention --------------------------------------------------------------------------


def _causal_sum(first: int, last: int, cap: int) -> int:
    """``Σ_{p=first}^{last} min(p + 1, cap)`` (``cap <= 0``: no cap), closed form."""
    if last < first:
        return 0
    if cap <= 0:
        return (last + 1) * (last + 2) // 2 - first * (first + 1) // 2
    split = min(last, cap - 1)  # positions whose count is still p + 1
    total = 0
    if first <= split:
        total += (split + 1) * (split + 2) // 2 - first * (first + 1) // 2
    flat_from = max(first, cap)
    if flat_from <= last:
        total += cap * (last - flat_from + 1)
    return total


def _chunk_prefix(n: int, chunk: int) -> int:
    """``Σ_{p=0}^{n-1} ((p mod chunk) + 1)``."""
    full, rest = divmod(n, chunk)
    return full * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2


def attention_pairs(q_len: int, kv_len: int, *, is_causal: bool = True, window: int = 0,
                    chunk: int = 0, topk: int = 0) -> int:
    """Query-key pairs one head computes; queries are the last ``q_len`` of ``kv_len`` keys.

    >>> attention_pairs(4, 4)            # causal: 1 + 2 + 3 + 4
    10
    >>> attention_pairs(1, 9)            # decode: one query sees all 9 keys
    9
    >>> attention_pairs(4, 4, window=2)  # 1 + 2 + 2 + 2
    7
    """
    if q_len <= 0 or kv_len <= 0:
        return 0
    if not is_causal:
        per_query = kv_len
        if window > 0:
            per_query = min(per_query, window)
        if topk > 0:
            per_query = min(per_query, topk)
        return q_len * per_query
    first, last = kv_len - q_len, kv_len - 1
    if first < 0:  # more queries than keys: the first ones see nothing new
        first = 0
    if chunk > 0:
        if window > 0 or topk > 0:
            cap = min(c for c in (window, topk) if c > 0)
            return sum(min((p % chunk) + 1, cap) for p in range(first, last + 1))
        return _chunk_prefix(last + 1, chunk) - _chunk_prefix(first, chunk)
    caps = [c for c in (window, topk) if c > 0]
    return _causal_sum(first, last, min(caps) if caps else 0)


def _attention_dims(q: TensorMeta, k: TensorMeta, v: TensorMeta) -> tuple[int, int, int, int,
                                                                          int, int]:
    b, h, sq, d = q.shape
    return b, h, sq, k.shape[-2], d, v.shape[-1]


_INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})


def _zrt_attention_pairs(call: OpCall, q: TensorMeta, k: TensorMeta, optional_from: int
                         ) -> int:
    """Visible pairs of a ``zrt.attention`` call.

    Optional tensors (``sinks [Hq]``, ``indices [B, Sq, topk]``) follow the fixed ones when
    they were passed; ``indices`` is the integer tensor of rank 3.
    """
    topk = 0
    for t in call.inputs[optional_from:]:
        if t.dtype in _INT_DTYPES and len(t.shape) == 3:
            topk = t.shape[-1]
    return attention_pairs(q.shape[2], k.shape[2], is_causal=bool(call.attrs.get("is_causal")),
                           window=int(call.attrs.get("window") or 0),
                           chunk=int(call.attrs.get("chunk") or 0), topk=topk)


def zrt_attention_flop(call: OpCall) -> int:
    """``2 · B · Hq · pairs · (D + Dv)``: ``QKᵀ`` and ``PV`` over the visible pairs."""
    q, k, v = call.inputs[:3]
    b, h, _sq, _skv, d, dv = _attention_dims(q, k, v)
    return 2 * b * h * _zrt_attention_pairs(call, q, k, 3) * (d + dv)


def zrt_attention_backward_flop(call: OpCall) -> int:
    """``2 · B · Hq · pairs · (3·D + 2·Dv)``: recompute QKᵀ, dV, dP, dQ, dK.

    Inputs: ``grad_out, q, k, v, out, lse`` then the optional tensors.
    """
    q, k, v = call.inputs[1:4]
    b, h, _sq, _skv, d, dv = _attention_dims(q, k, v)
    return 2 * b * h * _zrt_attention_pairs(call, q, k, 6) * (3 * d + 2 * dv)


def sdpa_flop(call: OpCall) -> int:
    """torch SDPA kernels (flash / efficient / cuDNN / CPU flash), honouring ``is_causal``."""
    q, k, v = call.inputs[:3]
    b, h, sq, skv, d, dv = _attention_dims(q, k, v)
    pairs = attention_pairs(sq, skv, is_causal=bool(call.attrs.get("is_causal", False)))
    return 2 * b * h * pairs * (d + dv)


def sdpa_backward_flop(call: OpCall) -> int:
    q, k, v = call.inputs[1:4]
    b, h, sq, skv, d, dv = _attention_dims(q, k, v)
    pairs = attention_pairs(sq, skv, is_causal=bool(call.attrs.get("is_causal", False)))
    return 2 * b * h * pairs * (3 * d + 2 * dv)


# -- MoE routing --------------------------------------------------------------------------


def moe_dispatch_bytes(call: OpCall) -> tuple[int, int]:
    """Reads the rows it copies (``T·k`` rows of H) and the routing index; writes them."""
    routed = call.outputs[0]
    index = call.inputs[1]
    written = sum(t.nbytes for t in call.outputs)
    return routed.nbytes + index.nbytes, written


def moe_combine_flop(call: OpCall) -> int:
    """Weight each of the ``T·k`` rows and sum the k rows of a token: ``2·T·k·H``."""
    return 2 * call.inputs[0].numel


def moe_dispatch_backward_flop(call: OpCall) -> int:
    """Sum the k gradient rows of each token: ``T·k·H`` adds."""
    return call.inputs[0].numel


def moe_combine_backward_flop(call: OpCall) -> int:
    """Row gradients ``T·k·H`` multiplies, weight gradients ``2·T·k·H`` (dot products)."""
    return 3 * call.inputs[1].numel


# -- memory-movement formulas -----------------------------------------------------------


def embedding_bytes(call: OpCall) -> tuple[int, int]:
    """A lookup reads the rows it returns and the indices, not the whole table."""
    out = call.outputs[0]
    return out.nbytes + call.inputs[1].nbytes, out.nbytes


def embedding_backward_flop(call: OpCall) -> int:
    """Scatter-add of the output gradient rows into the table gradient."""
    return call.inputs[0].numel


def gather_bytes(call: OpCall) -> tuple[int, int]:
    """index / index_select / gather: read the selected elements and the indices."""
    out_bytes = sum(t.nbytes for t in call.outputs)
    index_bytes = sum(t.nbytes for t in call.inputs[1:])
    return out_bytes + index_bytes, out_bytes


def scatter_bytes(call: OpCall) -> tuple[int, int]:
    """index_put / scatter / index_add / index_copy: read values and indices, write values."""
    rest = call.inputs[1:]
    values = max(rest, key=lambda t: t.numel) if rest else None
    read = sum(t.nbytes for t in rest)
    if values is None:
        return read, 0
    dest = call.inputs[0]
    return read, int(values.numel * (dest.nbytes / dest.numel if dest.numel else 0))


def copy_bytes(call: OpCall) -> tuple[int, int]:
    """``copy_(dest, src)``: read the source, write the destination."""
    dest, src = call.inputs[0], call.inputs[1]
    return src.nbytes, dest.nbytes


def scatter_add_flop(call: OpCall) -> int:
    rest = call.inputs[1:]
    return max((t.numel for t in rest), default=0)


def sort_flop(call: OpCall) -> int:
    """``n · ceil(log2 n)`` comparisons along the sorted dimension, for every row."""
    shape = call.inputs[0].shape
    if not shape:
        return 0
    dim = int(call.attrs.get("dim", -1))
    n = shape[dim]
    rows = call.inputs[0].numel // n if n else 0
    return rows * n * max(1, math.ceil(math.log2(n))) if n > 1 else 0


# -- the tables ---------------------------------------------------------------------------

POINTWISE_OPS = (
    # arithmetic and comparison
    "add", "sub", "rsub", "mul", "div", "neg", "reciprocal", "pow", "square", "abs", "sign",
    "sgn", "fmod", "remainder", "floor_divide", "lerp", "addcmul", "addcdiv", "clamp",
    "clamp_min", "clamp_max", "clip", "minimum", "maximum", "fmax", "fmin", "where",
    "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift", "floor", "ceil", "round", "trunc", "frac",
    "isnan", "isinf", "isfinite", "nan_to_num", "tril", "triu", "hypot", "atan2",
    "copysign", "heaviside", "xlogy", "polar", "complex",
    # transcendental and activations
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
    "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh",
    "sigmoid", "logit", "erf", "erfc", "erfinv", "silu", "gelu", "relu", "relu6", "leaky_relu",
    "elu", "selu", "celu", "mish", "softplus", "softshrink", "hardshrink", "hardtanh",
    "hardsigmoid", "hardswish", "threshold", "glu", "prelu", "_prelu_kernel",
    # backward of pointwise ops
    "silu_backward", "gelu_backward", "threshold_backward", "sigmoid_backward",
    "tanh_backward", "softplus_backward", "hardtanh_backward", "elu_backward",
    "leaky_relu_backward", "mish_backward", "hardsigmoid_backward", "hardswish_backward",
    "glu_backward", "logit_backward", "_prelu_kernel_backward",
    # dropout and random
    "native_dropout", "native_dropout_backward", "bernoulli", "_masked_scale",
)

REDUCTION_OPS = (
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "logsumexp",
    "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "any", "all",
    "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "aminmax", "count_nonzero",
    "topk", "kthvalue", "median", "mode", "histc", "bincount", "_log_softmax_backward",
)

COPY_OPS = (
    "clone", "_to_copy", "cat", "stack", "repeat", "repeat_interleave", "flip", "roll",
    "constant_pad_nd", "reflection_pad1d", "replication_pad1d", "slice_scatter",
    "select_scatter", "diagonal_scatter", "as_strided_scatter", "masked_scatter",
    "_unsafe_view_copy", "contiguous", "pixel_shuffle", "im2col", "col2im", "_pdist_forward",
    "alias_copy", "view_copy", "permute_copy", "transpose_copy", "expand_copy",
    "unsqueeze_copy", "squeeze_copy", "slice_copy", "select_copy", "t_copy", "detach_copy",
    "split_copy", "split_with_sizes_copy", "unbind_copy", "_reshape_copy",
    # backward of views: a zero tensor of the input's shape with the gradient copied in
    "slice_backward", "select_backward", "diagonal_backward", "unfold_backward",
    "as_strided_backward", "narrow_copy",
)

GATHER_OPS = ("index", "_unsafe_index", "index_select", "gather", "take", "masked_select",
              "take_along_dim")
SCATTER_OPS = ("index_put", "_index_put_impl", "_unsafe_index_put", "scatter",
               "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill",
               "index_reduce", "masked_scatter_backward", "_unsafe_masked_index_put_accumulate")

CREATION_OPS = (
    "zeros", "ones", "full", "arange", "linspace", "logspace", "eye", "zeros_like",
    "ones_like", "full_like", "new_zeros", "new_ones", "new_full", "fill", "zero",
    "scalar_tensor", "rand", "randn", "randint", "rand_like", "randn_like", "randint_like",
    "randperm", "uniform", "normal", "exponential", "random", "tril_indices",
    "triu_indices", "_efficientzerotensor", "tensor",
)


def _named(ops: Iterable[str], flops: Callable[[OpCall], int], category: str,
           bytes_fn: Callable[[OpCall], tuple[int, int]] | None = None,
           in_place: bool = True) -> list[OpFormula]:
    """One formula per ``aten.<name>`` and, where it exists, its in-place ``<name>_``."""
    out = []
    seen: set[str] = set()
    for name in ops:
        for n in ((name, f"{name}_") if in_place else (name,)):
            if n in seen:
                continue
            seen.add(n)
            out.append(OpFormula(op=f"aten.{n}", flops=flops, bytes=bytes_fn,
                                 category=category))
    return out


def aten_formulas() -> list[OpFormula]:
    """Every aten formula the core registers (through ``zrt_op_formulas``)."""
    formulas = [
        OpFormula("aten.mm", mm_flop, category=Category.MATMUL),
        OpFormula("aten.addmm", addmm_flop, category=Category.MATMUL),
        OpFormula("aten.bmm", bmm_flop, category=Category.MATMUL),
        OpFormula("aten.baddbmm", baddbmm_flop, category=Category.MATMUL),
        OpFormula("aten.mv", mv_flop, category=Category.MATMUL),
        OpFormula("aten.addmv", addmv_flop, category=Category.MATMUL),
        OpFormula("aten.dot", dot_flop, category=Category.MATMUL),
        OpFormula("aten.vdot", dot_flop, category=Category.MATMUL),
        OpFormula("aten._grouped_mm", grouped_mm_flop, grouped_mm_bytes, Category.MATMUL),
        OpFormula("aten._scaled_mm", scaled_mm_flop, category=Category.MATMUL),
        OpFormula("aten.convolution", convolution_flop, category=Category.MATMUL),
        OpFormula("aten._convolution", convolution_flop, category=Category.MATMUL),
        OpFormula("aten.convolution_backward", convolution_backward_flop,
                  category=Category.MATMUL),
        OpFormula("aten.embedding", _zero_flops, embedding_bytes, Category.EMBEDDING),
        OpFormula("aten.embedding_dense_backward", embedding_backward_flop,
                  category=Category.EMBEDDING),
        OpFormula("aten._softmax", _per_output_element(5), category=Category.SOFTMAX),
        OpFormula("aten._safe_softmax", _per_output_element(5), category=Category.SOFTMAX),
        OpFormula("aten._log_softmax", _per_output_element(5), category=Category.SOFTMAX),
        OpFormula("aten._softmax_backward_data", _per_output_element(4),
                  category=Category.SOFTMAX),
        OpFormula("aten._log_softmax_backward_data", _per_output_element(3),
                  category=Category.SOFTMAX),
        OpFormula("aten.native_layer_norm", _per_input_element(5), category=Category.NORM),
        OpFormula("aten.native_layer_norm_backward", _per_input_element(8),
                  category=Category.NORM),
        OpFormula("aten.native_group_norm", _per_input_element(5), category=Category.NORM),
        OpFormula("aten.native_group_norm_backward", _per_input_element(8),
                  category=Category.NORM),
        OpFormula("aten.native_batch_norm", _per_input_element(5), category=Category.NORM),
        OpFormula("aten._fused_rms_norm", _per_input_element(4), category=Category.NORM),
        OpFormula("aten._fused_rms_norm_backward", _per_input_element(6),
                  category=Category.NORM),
        OpFormula("aten.nll_loss_forward", _per_input_element(1), category=Category.LOSS),
        OpFormula("aten.nll_loss_backward", _per_output_element(1), category=Category.LOSS),
        OpFormula("aten.nll_loss2d_forward", _per_input_element(1), category=Category.LOSS),
        OpFormula("aten.nll_loss2d_backward", _per_output_element(1),
                  category=Category.LOSS),
        OpFormula("aten.sort", sort_flop, category=Category.REDUCTION),
        OpFormula("aten.argsort", sort_flop, category=Category.REDUCTION),
        OpFormula("aten.copy_", _zero_flops, copy_bytes, Category.COPY),
        OpFormula("aten.copy", _zero_flops, category=Category.COPY),
    ]
    for name in ("_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                 "_efficient_attention_forward"):
        formulas.append(OpFormula(f"aten.{name}", sdpa_flop, category=Category.ATTENTION))
        backward = name.replace("_forward", "") + "_backward"
        formulas.append(OpFormula(f"aten.{backward}", sdpa_backward_flop,
                                  category=Category.ATTENTION))
    formulas += _named(POINTWISE_OPS, _per_output_element(1), Category.ELEMENTWISE)
    formulas += _named(REDUCTION_OPS, _per_input_element(1), Category.REDUCTION,
                       in_place=False)
    formulas += _named(COPY_OPS, _zero_flops, Category.COPY, in_place=False)
    formulas += _named(GATHER_OPS, _zero_flops, Category.COPY, gather_bytes, in_place=False)
    formulas += _named(SCATTER_OPS, scatter_add_flop, Category.COPY, scatter_bytes)
    formulas += _named(CREATION_OPS, _zero_flops, Category.CREATION, _write_only_bytes)
    return formulas


def zrt_op_formulas() -> list[OpFormula]:
    """Formulas of the harness's own ``zrt::`` operators (:mod:`zrt_core.capture.ops`)."""
    return [
        OpFormula("zrt.attention", zrt_attention_flop, category=Category.ATTENTION),
        OpFormula("zrt.attention_backward", zrt_attention_backward_flop,
                  category=Category.ATTENTION),
        OpFormula("zrt.moe_dispatch", _zero_flops, moe_dispatch_bytes, Category.MOE_DISPATCH),
        OpFormula("zrt.moe_combine", moe_combine_flop, category=Category.MOE_COMBINE),
        # Backward runs the other way: the gradient of a dispatch is a combine and the
        # gradient of a combine is a dispatch (the all-to-all directions swap under EP).
        OpFormula("zrt.moe_dispatch_backward", moe_dispatch_backward_flop,
                  category=Category.MOE_COMBINE),
        OpFormula("zrt.moe_combine_backward", moe_combine_backward_flop,
                  category=Category.MOE_DISPATCH),
        OpFormula("zrt.ssd_chunk_scan", ssd_chunk_scan_flop, category=Category.SSM),
        OpFormula("zrt.ssd_chunk_scan_backward", ssd_chunk_scan_backward_flop,
                  category=Category.SSM),
        OpFormula("zrt.ssm_state_update", ssm_state_update_flop, ssm_state_update_bytes,
                  Category.SSM),
        OpFormula("zrt.gated_delta_chunk", gated_delta_chunk_flop, category=Category.SSM),
        OpFormula("zrt.gated_delta_chunk_backward", gated_delta_chunk_backward_flop,
                  category=Category.SSM),
        OpFormula("zrt.gated_delta_recurrent", gated_delta_recurrent_flop,
                  category=Category.SSM),
        # transformers' own grouped-GEMM fallback (non-bf16 experts).
        OpFormula("transformers.grouped_mm_fallback", grouped_mm_flop, grouped_mm_bytes,
                  Category.MATMUL),
        OpFormula("transformers.grouped_mm_fallback_backward", _grouped_fallback_bwd_flop,
                  category=Category.MATMUL),
    ]


# -- Mamba-2 ------------------------------------------------------------------------------


def ssd_chunk_scan_flop(call: OpCall) -> int:
    """Mamba-2's chunked SSD scan as ``mamba_chunk_scan_combined`` computes it.

    ``x [B,S,H,P]``, ``B``/``C`` ``[B,S,G,N]``, chunk ``Q``. Per head and token: the chunk
    states ``Bᵀ·x`` (2·N·P) and their read-out ``C·state`` (2·N·P), the intra-chunk
    ``(C·Bᵀ ∘ L)·x`` over the causal half of each Q×Q block ((Q+1)·P); per group and token
    the ``C·Bᵀ`` scores ((Q+1)·N); plus 3·P per head and token for discretisation and the
    ``D`` skip. The inter-chunk recurrence (N·P per chunk) is negligible.
    """
    x, _dt, _a, b = call.inputs[:4]
    batch, seq, heads, head_dim = x.shape
    groups, state = b.shape[2], b.shape[3]
    chunk = int(call.attrs.get("chunk_size") or seq)
    q1 = min(chunk, seq) + 1
    per_head = 4 * state * head_dim + q1 * head_dim + 3 * head_dim
    return batch * seq * (heads * per_head + groups * q1 * state)


def ssd_chunk_scan_backward_flop(call: OpCall) -> int:
    """Twice the forward scan (each product has an input and a weight-like gradient)."""
    forward = OpCall(op="zrt.ssd_chunk_scan", inputs=call.inputs[2:], outputs=(),
                     attrs=call.attrs)
    return 2 * ssd_chunk_scan_flop(forward)


def ssm_state_update_flop(call: OpCall) -> int:
    """One recurrent step: ``h ← exp(Δ·A)·h + Δ·B·x`` (3 per state element: decay,
    input, add — the exp counted once) and ``y = C·h`` (2 per element), per head."""
    state = call.inputs[0]
    return 5 * state.numel + 2 * call.inputs[1].numel


def ssm_state_update_bytes(call: OpCall) -> tuple[int, int]:
    """Reads its inputs (the state among them) and writes the output and the state."""
    read = sum(t.nbytes for t in call.inputs)
    return read, sum(t.nbytes for t in call.outputs) + call.inputs[0].nbytes


# -- Gated DeltaNet ----------------------------------------------------------------------


def gated_delta_chunk_flop(call: OpCall) -> int:
    """flash-linear-attention's chunked gated delta rule (zrt_core.modelmath.flops gives the
    derivation): ``q, k [B,S,Hk,Dk]``, ``v [B,S,Hv,Dv]``, chunk ``C``; per value head and
    token ``2·(2·C·Dk + C·Dv + 3·Dk·Dv)`` — the in-chunk ``k_β·Kᵀ`` and ``Q·Kᵀ``, the
    in-chunk output, and the state's two reads and its update."""
    q, _k, v = call.inputs[:3]
    batch, seq, _hk, dk = q.shape
    heads, dv = v.shape[2], v.shape[3]
    c = int(call.attrs.get("chunk_size") or 64)
    return batch * seq * heads * 2 * (2 * c * dk + c * dv + 3 * dk * dv)


def gated_delta_chunk_backward_flop(call: OpCall) -> int:
    """Twice the forward (each product has an input and a weight-like gradient)."""
    forward = OpCall(op="zrt.gated_delta_chunk", inputs=call.inputs[2:], outputs=(),
                     attrs=call.attrs)
    return 2 * gated_delta_chunk_flop(forward)


def gated_delta_recurrent_flop(call: OpCall) -> int:
    """One token per sequence: per value head ``7·Dk·Dv`` (decay the state, read it with
    the key, the rank-one write, read it with the query)."""
    q, _k, v = call.inputs[:3]
    return q.shape[0] * q.shape[1] * v.shape[2] * 7 * q.shape[3] * v.shape[3]


def _grouped_fallback_bwd_flop(call: OpCall) -> int:
    """``(input [M, K], weight [G, K, N], offs, grad [M, N])`` → dX and dW: ``4·M·K·N``."""
    x, _w, _offs, grad = call.inputs[:4]
    return 4 * x.shape[0] * x.shape[1] * grad.shape[1]


def core_formulas() -> list[OpFormula]:
    return aten_formulas() + zrt_op_formulas()
