"""FLOP and byte formulas of the ``deepseek::`` kernels, as pure functions of shapes.

Registered through ``zrt_op_formulas``; importing this module imports no torch. The
conventions are the core's (:mod:`zrt_core.formulas.aten`): a multiply-add is 2 FLOPs,
attention counts its two matmuls over the query-key pairs a query actually sees, backward
is five matmuls (recompute ``QKᵀ``, ``dV``, ``dP``, ``dQ``, ``dK``).

Per-pair costs, for ``H`` query heads::

    mla_attention (absorbed MLA, FlashMLA)   2·H·(D_qk + D_v)   D_qk = kv_lora_rank + rope,
                                                                D_v = kv_lora_rank
    sparse_attention (DeepSeek-V4)           2·H·(D + D)        K = V: one 512-wide entry
    lightning_indexer                        2·H_idx·(D_idx + 1) q·k per index head, then the
                                                                head-weighted sum

Which pairs a query sees:

- ``mla_attention``: queries are the last ``S_q`` of ``S_kv`` keys (bottom-right causal);
  with top-k ``indices [B, S_q, K]`` a query sees ``min(visible, K)`` keys (DSA).
- ``lightning_indexer``: the query at absolute position ``p`` scores the keys
  ``j < (p + 1) // ratio`` (ratio 1: every earlier token and itself; ratio 4: the
  compressed entries whose window has closed, DeepSeek-V4 CSA).
- ``sparse_attention`` (V4): the window keys ``(p − W, p]`` among the window-source keys,
  plus compressed entries ``j < (p + 1) // ratio``, at most ``K`` of them when the
  indexer picked them (CSA) and all of them otherwise (HCA).
"""

from __future__ import annotations

from zrt_core.plugin import Category, OpCall, OpFormula, TensorMeta, attention_pairs

_INT_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8"})


# -- pair counts (closed forms; tests hold them to brute-force masks) --------------------


def _floor_prefix(n: int, m: int) -> int:
    """``Σ_{x=0}^{n} ⌊x / m⌋`` (0 for ``n < 0``)."""
    if n < 0:
        return 0
    q, r = divmod(n + 1, m)
    # values 0..q-1 appear m times each, value q appears r times
    return m * q * (q - 1) // 2 + q * r


def capped_floor_sum(lo: int, hi: int, m: int, cap: int) -> int:
    """``Σ_{x=lo}^{hi} min(cap, ⌊x / m⌋)`` for ``0 <= lo``.

    >>> capped_floor_sum(1, 8, 4, 10)   # 0,0,0,1,1,1,1,2
    6
    >>> capped_floor_sum(1, 8, 4, 1)    # 0,0,0,1,1,1,1,1
    5
    """
    if hi < lo or cap <= 0 or m <= 0:
        return 0
    split = cap * m - 1  # x up to here has ⌊x/m⌋ < cap
    total = 0
    if lo <= min(hi, split):
        total += _floor_prefix(min(hi, split), m) - _floor_prefix(lo - 1, m)
    flat_from = max(lo, split + 1)
    if flat_from <= hi:
        total += cap * (hi - flat_from + 1)
    return total


def indexer_pairs(q_len: int, keys: int, ratio: int, start_pos: int) -> int:
    """Query-key pairs the lightning indexer scores (one index head, one sequence).

    The query at position ``p = start_pos + i`` scores ``min(keys, (p + 1) // ratio)``
    keys.

    >>> indexer_pairs(4, 4, 1, 0)      # 1 + 2 + 3 + 4
    10
    >>> indexer_pairs(1, 9, 1, 8)      # decode: the new token scores all 9
    9
    >>> indexer_pairs(8, 2, 4, 0)      # compressed entries: 0,0,0,1,1,1,1,2
    6
    """
    if q_len <= 0 or keys <= 0:
        return 0
    return capped_floor_sum(start_pos + 1, start_pos + q_len, max(ratio, 1), keys)


def window_pairs(q_len: int, window_keys: int, window: int, start_pos: int) -> int:
    """Pairs of V4's sliding-window branch (one head, one sequence).

    The ``window_keys`` source keys hold positions ``start_pos + q_len − window_keys`` ..
    ``start_pos + q_len − 1``; the query at ``p`` sees those in ``(p − window, p]``.

    >>> window_pairs(4, 4, 2, 0)       # prefill: 1 + 2 + 2 + 2
    7
    >>> window_pairs(1, 8, 8, 20)      # decode: the last 8 keys, itself included
    8
    """
    if q_len <= 0 or window_keys <= 0:
        return 0
    lo = max(0, start_pos + q_len - window_keys)  # position of the first source key
    first, last = start_pos, start_pos + q_len - 1
    if window <= 0:  # no window: every source key up to the query
        window = last + 1
    total = 0
    rising_to = min(last, lo + window - 2)  # queries still seeing fewer than `window` keys
    a = max(first, lo)
    if a <= rising_to:  # count p − lo + 1
        n = rising_to - a + 1
        total += n * (a - lo + 1) + n * (n - 1) // 2
    flat_from = max(first, lo + window - 1)
    if flat_from <= last:
        total += window * (last - flat_from + 1)
    return total


def compressed_pairs(q_len: int, entries: int, ratio: int, start_pos: int, cap: int) -> int:
    """Pairs of V4's compressed branch: ``min(cap, entries, (p + 1) // ratio)`` per query.

    >>> compressed_pairs(8, 2, 4, 0, 2)   # HCA-style: 0,0,0,1,1,1,1,2
    6
    """
    if q_len <= 0 or entries <= 0 or ratio <= 0:
        return 0
    return capped_floor_sum(start_pos + 1, start_pos + q_len, ratio,
                            min(entries, cap) if cap > 0 else entries)


# -- helpers -----------------------------------------------------------------------------


def _int_rank3(inputs: tuple[TensorMeta, ...]) -> TensorMeta | None:
    for t in inputs:
        if t.dtype in _INT_DTYPES and len(t.shape) == 3:
            return t
    return None


def _row_bytes(t: TensorMeta) -> int:
    """Bytes of one row (last dimension) of a tensor."""
    return t.nbytes // max(1, t.numel // t.shape[-1]) if t.numel else 0


def _written(call: OpCall) -> int:
    return sum(t.nbytes for t in call.outputs if not t.is_view)


# -- mla_attention ---------------------------------------------------------------------


def mla_pairs(call: OpCall, q: TensorMeta, kv: TensorMeta, optional_from: int) -> int:
    indices = _int_rank3(call.inputs[optional_from:])
    return attention_pairs(q.shape[2], kv.shape[2], is_causal=bool(call.attrs.get("is_causal")),
                           topk=indices.shape[-1] if indices is not None else 0)


def mla_attention_flop(call: OpCall) -> int:
    """``(q [B,H,Sq,Dqk], kv [B,1,Skv,Dqk], v [B,1,Skv,Dv], indices?)``:
    ``2·B·H·pairs·(Dqk + Dv)``."""
    q, kv, v = call.inputs[:3]
    b, h = q.shape[0], q.shape[1]
    return 2 * b * h * mla_pairs(call, q, kv, 3) * (q.shape[-1] + v.shape[-1])


def _mla_kv_read(q: TensorMeta, kv: TensorMeta, indices: TensorMeta | None) -> int:
    """Latent-cache bytes a FlashMLA kernel reads: every row once (dense), or the rows the
    top-k picks, never more than the cache (sparse)."""
    if indices is None:
        return kv.nbytes
    b, sq, k = indices.shape
    rows = b * min(kv.shape[2], sq * k)
    return rows * _row_bytes(kv)


def mla_attention_bytes(call: OpCall) -> tuple[int, int]:
    """Q, the latent cache rows once (V is the first ``Dv`` channels of the same rows, not
    read twice), indices; O and the log-sum-exp written."""
    q, kv = call.inputs[0], call.inputs[1]
    indices = _int_rank3(call.inputs[3:])
    read = q.nbytes + _mla_kv_read(q, kv, indices) + (indices.nbytes if indices else 0)
    return read, _written(call)


def mla_attention_backward_flop(call: OpCall) -> int:
    """``(grad_out, q, kv, v, out, lse, indices?)``: ``2·B·H·pairs·(3·Dqk + 2·Dv)``."""
    q, kv, v = call.inputs[1:4]
    b, h = q.shape[0], q.shape[1]
    return 2 * b * h * mla_pairs(call, q, kv, 6) * (3 * q.shape[-1] + 2 * v.shape[-1])


def mla_attention_backward_bytes(call: OpCall) -> tuple[int, int]:
    grad_out, q, kv, _v, out, lse = call.inputs[:6]
    indices = _int_rank3(call.inputs[6:])
    read = (grad_out.nbytes + q.nbytes + _mla_kv_read(q, kv, indices) + out.nbytes
            + lse.nbytes + (indices.nbytes if indices else 0))
    return read, _written(call)


# -- lightning indexer -------------------------------------------------------------------


def _indexer_pairs_of(call: OpCall) -> tuple[int, int]:
    """``(batch, pairs per sequence)`` of ``lightning_indexer(q [B,Sq,Hi,Di], k [B,T,Di],
    weights [B,Sq,Hi], ...)``."""
    q, k = call.inputs[0], call.inputs[1]
    pairs = indexer_pairs(q.shape[1], k.shape[1], int(call.attrs.get("ratio") or 1),
                          int(call.attrs.get("start_pos") or 0))
    return q.shape[0], pairs


def lightning_indexer_flop(call: OpCall) -> int:
    """``2·B·Hi·pairs·(Di + 1)``: ``q·k`` per index head, then the head-weighted sum (the
    ReLU and the top-k comparisons are not multiply-adds)."""
    q = call.inputs[0]
    b, pairs = _indexer_pairs_of(call)
    return 2 * b * q.shape[2] * pairs * (q.shape[3] + 1)


def lightning_indexer_bytes(call: OpCall) -> tuple[int, int]:
    """DeepGEMM's ``fp8_mqa_logits`` then a top-k kernel (CUDA): q, the index-key cache and
    the head weights read, the ``[B, Sq, T]`` float32 logits written and read back by the
    top-k, the indices written."""
    q, k, w = call.inputs[:3]
    logits = q.shape[0] * q.shape[1] * k.shape[1] * 4
    return q.nbytes + k.nbytes + w.nbytes + logits, _written(call) + logits


def npu_lightning_indexer_bytes(call: OpCall) -> tuple[int, int]:
    """``npu_lightning_indexer`` (Ascend) scores and selects in one kernel: the logits stay
    on chip; q, keys and weights read once, indices written."""
    q, k, w = call.inputs[:3]
    return q.nbytes + k.nbytes + w.nbytes, _written(call)


# -- DeepSeek-V4 sparse attention ------------------------------------------------------


def v4_pairs(call: OpCall, q: TensorMeta, kv: TensorMeta, optional_from: int) -> int:
    """Window plus compressed pairs of one head of one sequence (module docstring)."""
    attrs = call.attrs
    q_len = q.shape[2]
    window_keys = int(attrs.get("window_keys") or 0)
    start = int(attrs.get("start_pos") or 0)
    pairs = window_pairs(q_len, window_keys, int(attrs.get("window") or 0), start)
    ratio = int(attrs.get("ratio") or 0)
    entries = kv.shape[2] - window_keys
    if ratio > 0 and entries > 0:
        indices = _int_rank3(call.inputs[optional_from:])
        cap = indices.shape[-1] if indices is not None else entries
        pairs += compressed_pairs(q_len, entries, ratio, start, cap)
    return pairs


def sparse_attention_flop(call: OpCall) -> int:
    """``(q [B,H,Sq,D], kv [B,1,N,D], sinks [H], indices?)``: ``2·B·H·pairs·(D + D)``."""
    q, kv = call.inputs[0], call.inputs[1]
    return 2 * q.shape[0] * q.shape[1] * v4_pairs(call, q, kv, 3) * 2 * q.shape[-1]


def sparse_attention_window_keys(call: OpCall) -> dict[str, int]:
    """``window_keys`` after a transform changed the cache: the keys the window cache holds
    besides the step's queries — ``min(start_pos, window − 1)`` (transformers' sliding
    cache keeps ``window − 1`` tokens) — plus the ``S_q`` new ones; all earlier tokens
    without a window. The rest of ``kv`` are the compressed entries."""
    a = call.attrs
    first = 1 if call.op.startswith("deepseek.sparse_attention_backward") else 0
    q, kv = call.inputs[first], call.inputs[first + 1]
    start, window = int(a.get("start_pos") or 0), int(a.get("window") or 0)
    cached = min(start, window - 1) if window > 0 else start
    return {"window_keys": min(cached + q.shape[2], kv.shape[2])}


def sparse_attention_backward_flop(call: OpCall) -> int:
    """``(grad_out, q, kv, sinks, out, lse, indices?)``: ``2·B·H·pairs·(3·D + 2·D)``."""
    q, kv = call.inputs[1], call.inputs[2]
    return 2 * q.shape[0] * q.shape[1] * v4_pairs(call, q, kv, 6) * 5 * q.shape[-1]


def hc_split_sinkhorn_row_flops(hc_mult: int, iters: int) -> int:
    """FLOPs of one row (token) of :func:`hc_split_sinkhorn`, counted as the core counts the
    elementwise reference it replaces (1 per pointwise output, 1 per reduced input, 5 per
    softmax output)::

        pre   σ(m·s + b) + eps          4n   (mul, add, sigmoid, add)
        post  2σ(m·s + b)               4n
        comb  softmax(m·s + b) + eps    8n²  (mul, add, softmax 5, add)
        2·iters − 1 normalisations      (2n² + n) each: sum n², + eps n, divide n²
    """
    n = hc_mult
    return 8 * n + 8 * n * n + (2 * iters - 1) * (2 * n * n + n)


def _hc_rows(mixes: TensorMeta) -> int:
    return mixes.numel // mixes.shape[-1] if mixes.shape and mixes.shape[-1] else 0


def hc_split_sinkhorn_flop(call: OpCall) -> int:
    a = call.attrs
    return _hc_rows(call.inputs[0]) * hc_split_sinkhorn_row_flops(
        int(a.get("hc_mult") or 0), int(a.get("iters") or 0))


def hc_split_sinkhorn_backward_flop(call: OpCall) -> int:
    """The kernel recomputes the forward from its inputs, then runs the chain rule back
    through every step at about twice each step's forward: 3 × the forward."""
    a = call.attrs
    return 3 * _hc_rows(call.inputs[3]) * hc_split_sinkhorn_row_flops(
        int(a.get("hc_mult") or 0), int(a.get("iters") or 0))


def _streams(meta: TensorMeta) -> tuple[int, int, int]:
    """``(rows, n, D)`` of a ``[..., n, D]`` stream tensor."""
    n, d = meta.shape[-2], meta.shape[-1]
    return (meta.numel // (n * d) if n and d else 0), n, d


def hc_aggregate_flop(call: OpCall) -> int:
    """``(streams [.., n, D], pre)``: a multiply and an add per stream element, ``2·n·D``
    per row."""
    rows, n, d = _streams(call.inputs[0])
    return rows * 2 * n * d


def hc_aggregate_backward_flop(call: OpCall) -> int:
    """``(grad_out, streams, pre)``: ``d_streams = pre ⊗ g`` (``n·D``) and ``d_pre = Σ_d g ·
    streams`` (``2·n·D``): ``3·n·D`` per row."""
    rows, n, d = _streams(call.inputs[1])
    return rows * 3 * n * d


def hc_post_flop(call: OpCall) -> int:
    """``(streams, x, post, comb)``: ``post ⊗ x`` (``n·D``), ``combᵀ @ streams``
    (``2·n²·D``), their sum (``n·D``): ``(2n + 2)·n·D`` per row."""
    rows, n, d = _streams(call.inputs[0])
    return rows * (2 * n + 2) * n * d


def hc_post_backward_flop(call: OpCall) -> int:
    """``(grad_out, streams, x, post, comb)``: ``d_x = postᵀ g`` (``2·n·D``), ``d_streams =
    comb g`` (``2·n²·D``), ``d_post = g x`` (``2·n·D``), ``d_comb = streams gᵀ``
    (``2·n²·D``): ``(4n + 4)·n·D`` per row."""
    rows, n, d = _streams(call.inputs[1])
    return rows * (4 * n + 4) * n * d


# -- registration ------------------------------------------------------------------------


def deepseek_formulas() -> list[OpFormula]:
    """Every ``deepseek::`` kernel, CUDA and Ascend names alike. Layouts (how TP and
    rescaling carry splits through the kernel): the attention kernels' outputs follow their
    query, backward outputs the inputs they are gradients of, the hyper-connection
    weights their rows; the indexers' top-k indices their queries and, up to ``topk``, their
    keys. V4's window keys follow a rescaled cache (``derived_attrs``)."""
    out = []
    for prefix in ("", "npu_"):
        mla = "npu_sparse_flash_attention" if prefix else "mla_attention"
        out += [
            OpFormula(f"deepseek.{mla}", mla_attention_flop, mla_attention_bytes,
                      Category.ATTENTION, layout="attention"),
            OpFormula(f"deepseek.{mla}_backward", mla_attention_backward_flop,
                      mla_attention_backward_bytes, Category.ATTENTION, layout="gradients"),
            OpFormula(f"deepseek.{prefix}lightning_indexer", lightning_indexer_flop,
                      npu_lightning_indexer_bytes if prefix else lightning_indexer_bytes,
                      Category.ATTENTION, layout="indexer"),
        ]
    out += [
        OpFormula("deepseek.sparse_attention", sparse_attention_flop, category=Category.ATTENTION,
                  layout="attention", derived_attrs=sparse_attention_window_keys),
        OpFormula("deepseek.sparse_attention_backward", sparse_attention_backward_flop,
                  category=Category.ATTENTION, layout="gradients",
                  derived_attrs=sparse_attention_window_keys),
        OpFormula("deepseek.hc_split_sinkhorn", hc_split_sinkhorn_flop,
                  category=Category.ELEMENTWISE, layout="leading"),
        OpFormula("deepseek.hc_split_sinkhorn_backward", hc_split_sinkhorn_backward_flop,
                  category=Category.ELEMENTWISE, layout="gradients"),
        OpFormula("deepseek.hc_aggregate", hc_aggregate_flop, category=Category.ELEMENTWISE,
                  layout="leading"),
        OpFormula("deepseek.hc_aggregate_backward", hc_aggregate_backward_flop,
                  category=Category.ELEMENTWISE, layout="gradients"),
        OpFormula("deepseek.hc_post", hc_post_flop, category=Category.ELEMENTWISE,
                  layout="leading"),
        OpFormula("deepseek.hc_post_backward", hc_post_backward_flop,
                  category=Category.ELEMENTWISE, layout="gradients"),
    ]
    return out
