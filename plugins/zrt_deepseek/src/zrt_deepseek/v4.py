"""DeepSeek-V4 attention as its inference code runs it: one sparse kernel per layer.

Every V4 layer attends with shared-KV MQA (one 512-wide head that is both key and value,
64 or 128 query heads, a learned sink per head) to two sets of keys: the last
``sliding_window`` (128) tokens, and — in the compressed layers — entries that each
summarise ``m`` tokens:

- ``sliding_attention``: the window only;
- ``heavily_compressed_attention`` (HCA, ``m' = 128``): the window plus every compressed
  entry whose window has closed;
- ``compressed_sparse_attention`` (CSA, ``m = 4``, overlapping windows): the window plus the
  ``index_topk`` (512) entries a lightning indexer picks among the closed ones.

DeepSeek's inference code (``inference/model.py`` of the V4 release) builds the index list
of both branches and calls one ``sparse_attn(q, kv, attn_sink, topk_idxs, scale)`` kernel
(FlashMLA's sparse kernels in vLLM, with a 584-byte FP8 cache row per entry). transformers'
reference instead concatenates the window keys with *all* compressed entries and masks
them: eager computes scores for every query against every key, and through the capture
harness's ``zrt.attention`` the compressed keys are mistaken for the tail of a sliding
window (a query is charged for the last 128 keys of the concatenation), so neither counts
what the kernel does. Inside :func:`v4_context`:

- ``DeepseekV4Attention.forward`` calls one ``deepseek::sparse_attention`` node with the
  window/compression structure as arguments (its formula counts exactly the pairs the
  kernel visits: ``min(p + 1, 128)`` window keys plus ``⌊(p + 1)/m⌋`` entries, capped at
  ``index_topk`` for CSA);
- the compressors run transformers' own pooling but no longer build the ``[B, 1, S, C]``
  block masks (the kernel takes indices, not masks);
- the CSA indexer scores with one ``deepseek::lightning_indexer`` node (``ratio = m``:
  a query scores only the entries whose window has closed) instead of a full
  ``[B, S, H, C]`` score tensor, and runs without gradients (its top-k is not
  differentiable; transformers trains no indexer weight through it either).

Projections, norms, rotary embeddings and the grouped output projection stay
transformers' own operators.

Inside :func:`v4_hyper_connection_context`, each manifold-constrained hyper-connection
(``DeepseekV4HyperConnection``, two per layer) keeps transformers' stream norm, ``fn``
projection, but computes its ``pre``/``post``/``comb`` weights with one
``deepseek::hc_split_sinkhorn`` node — the kernel V4's inference code runs
(``hc_split_sinkhorn``) — instead of ~4·``hc_sinkhorn_iters`` elementwise ops (80 for
V4-Flash, three times as many in the backward). Its formula counts what those ops count.
The collapse of the streams (``deepseek::hc_aggregate``) and, in each decoder layer, the
expansion of a block's output with the residual mix (``deepseek::hc_post``) are one
memory-bound kernel each, as Megatron-Core's fused mHC runs them
(:mod:`zrt_deepseek.hc_mix`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from zrt_deepseek.ops import ensure_ops

V4_TYPES = ("deepseek_v4",)
_MODULE = "transformers.models.deepseek_v4.modeling_deepseek_v4"


def applies_to(config: Any) -> bool:
    return str(getattr(config, "model_type", "")) in V4_TYPES


def _compress(module: Any, hidden_states: Any, cache_layer: Any, name: str, head_dim: int,
              overlap: bool) -> Any:
    """Closed windows of ``m`` tokens pooled into entries: ``[B, C, head_dim]``.

    transformers' compressor arithmetic (softmax-gated pooling with a position bias, RMS
    norm, RoPE at the window's first position; CSA's two overlapping series), without the
    masks its compressors build for eager attention.
    """
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    batch = hidden_states.shape[0]
    ratio = module.compress_rate
    kv = module.kv_proj(hidden_states)
    gate = module.gate_proj(hidden_states)
    if cache_layer is None:
        usable = (kv.shape[1] // ratio) * ratio
        chunk_kv, chunk_gate, first_window_position = kv[:, :usable], gate[:, :usable], 0
    else:
        chunk_kv, chunk_gate, first_window_position = cache_layer.store_compression_weights(
            name, kv, gate)
    if chunk_kv.shape[1] > 0:
        n_windows = chunk_kv.shape[1] // ratio
        chunk_kv = chunk_kv.view(batch, n_windows, ratio, -1)
        chunk_gate = chunk_gate.view(batch, n_windows, ratio, -1) + module.position_bias
        if overlap:  # entry w pools window w-1's Ca series with window w's Cb series
            new_kv = chunk_kv.new_zeros((batch, n_windows, 2 * ratio, head_dim))
            new_gate = chunk_gate.new_full((batch, n_windows, 2 * ratio, head_dim),
                                           float("-inf"))
            new_kv[:, :, ratio:] = chunk_kv[..., head_dim:]
            new_gate[:, :, ratio:] = chunk_gate[..., head_dim:]
            if n_windows > 1:
                new_kv[:, 1:, :ratio] = chunk_kv[:, :-1, :, :head_dim]
                new_gate[:, 1:, :ratio] = chunk_gate[:, :-1, :, :head_dim]
            if cache_layer is not None:
                prior_kv, prior_gate = cache_layer.update_overlap_state(name, chunk_kv,
                                                                        chunk_gate, head_dim)
                if prior_kv is not None:
                    new_kv[:, 0, :ratio] = prior_kv.to(new_kv.dtype)
                    new_gate[:, 0, :ratio] = prior_gate.to(new_gate.dtype)
            chunk_kv, chunk_gate = new_kv, new_gate
        compressed = module.kv_norm(
            (chunk_kv * chunk_gate.softmax(dim=2, dtype=torch.float32).to(chunk_kv.dtype)
             ).sum(dim=2))
        # one row of positions for every sequence (as V4's inference code indexes its
        # frequency table): rotary tables at [1, n], not [batch, n] copies of them
        positions = torch.arange(n_windows, device=compressed.device)
        positions = (positions * ratio + first_window_position).unsqueeze(0)
        cos, sin = module.rotary_emb(compressed, position_ids=positions,
                                     layer_type=module.rope_layer_type)
        compressed = m.apply_rotary_pos_emb(compressed.unsqueeze(1), cos, sin).squeeze(1)
    else:
        compressed = chunk_kv.new_zeros((batch, 0, head_dim))
    if cache_layer is not None:
        compressed = cache_layer.update_compressor_states(name, compressed)
    return compressed


def _csa_indices(indexer: Any, hidden_states: Any, q_residual: Any, position_ids: Any,
                 cache_layer: Any, start_pos: int) -> Any:
    """The CSA lightning indexer: its own compressor, then one ``deepseek::lightning_indexer``."""
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    with torch.no_grad():
        keys = _compress(indexer, hidden_states, cache_layer, "indexer", indexer.head_dim,
                         overlap=True)
        batch, seq_len, _ = hidden_states.shape
        cos, sin = indexer.rotary_emb(hidden_states, position_ids=position_ids,
                                      layer_type=indexer.rope_layer_type)
        q = indexer.q_b_proj(q_residual).view(batch, seq_len, -1, indexer.head_dim)
        q = m.apply_rotary_pos_emb(q.transpose(1, 2), cos, sin).transpose(1, 2)
        scorer = indexer.scorer
        weights = scorer.weights_proj(hidden_states).float() * scorer.weights_scaling
        return torch.ops.deepseek.lightning_indexer(
            q, keys, weights, int(indexer.index_topk), int(indexer.compress_rate), start_pos,
            float(scorer.softmax_scale))


def v4_attention_forward(self: Any, hidden_states: Any, position_embeddings: Any,
                         position_ids: Any, attention_mask: Any = None,
                         past_key_values: Any = None, **_kwargs: Any) -> tuple[Any, None]:
    """``DeepseekV4Attention.forward`` with one ``deepseek::sparse_attention`` node."""
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    from zrt_core.plugin import take_cache

    # 5.24 passes the cache as ``cache=``, 5.23 and earlier as ``past_key_values=``
    past_key_values = take_cache(_kwargs, past_key_values)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    cos, sin = position_embeddings[self.rope_layer_type]

    q_residual = self.q_a_norm(self.q_a_proj(hidden_states))
    q = self.q_b_proj(q_residual).view(*hidden_shape).transpose(1, 2)
    q = m.apply_rotary_pos_emb(self.q_b_norm(q), cos, sin)
    kv = self.kv_norm(self.kv_proj(hidden_states)).view(*hidden_shape).transpose(1, 2)
    kv = m.apply_rotary_pos_emb(kv, cos, sin)

    cache_layer = None
    start_pos = 0
    if past_key_values is not None:
        cache_layer = past_key_values.layers[self.layer_idx]
        start_pos = int(past_key_values.get_seq_length(self.layer_idx))
        kv = past_key_values.update(kv, kv, self.layer_idx)[0]
    window_keys = kv.shape[2]

    ratio, indices = 0, None
    compressor = self.compressor
    if compressor is not None:
        overlap = hasattr(compressor, "indexer")
        entries = _compress(compressor, hidden_states, cache_layer, "compressor",
                            compressor.head_dim, overlap=overlap)
        if overlap:
            indices = _csa_indices(compressor.indexer, hidden_states, q_residual, position_ids,
                                   cache_layer, start_pos)
        kv = torch.cat([kv, entries.unsqueeze(1)], dim=2)
        ratio = int(compressor.compress_rate)

    out, _lse = torch.ops.deepseek.sparse_attention(
        q, kv, self.sinks, indices, window_keys, int(self.sliding_window), ratio, start_pos,
        float(self.scaling))
    # K = V carried RoPE on its rope channels; undo it at the query position (as the model).
    out = m.apply_rotary_pos_emb(out.transpose(1, 2), cos, -sin).transpose(1, 2)
    grouped = out.reshape(*input_shape, self.config.o_groups, -1)
    grouped = self.o_a_proj(grouped).flatten(2)
    return self.o_b_proj(grouped), None


@contextlib.contextmanager
def v4_context(_config: Any, _options: Any) -> Iterator[None]:
    """Swap ``DeepseekV4Attention.forward`` for :func:`v4_attention_forward` while open."""
    import importlib

    ensure_ops()
    cls = importlib.import_module(_MODULE).DeepseekV4Attention
    original = cls.__dict__["forward"]
    cls.forward = v4_attention_forward
    try:
        yield
    finally:
        cls.forward = original


def v4_hyper_connection_forward(self: Any, hidden_streams: Any) -> tuple[Any, Any, Any]:
    """``DeepseekV4HyperConnection.forward`` with one ``deepseek::hc_split_sinkhorn`` node."""
    import torch
    import torch.nn.functional as F

    batch_size, seq_len = hidden_streams.shape[:2]
    flattened = self.input_norm(hidden_streams.view(batch_size, seq_len, -1).float())
    mixes = F.linear(flattened, self.fn.float())
    pre, post, comb = torch.ops.deepseek.hc_split_sinkhorn(
        mixes, self.scale, self.base, int(self.hc_mult), int(self.hc_sinkhorn_iters),
        float(self.hc_eps))
    collapsed = torch.ops.deepseek.hc_aggregate(hidden_streams, pre)
    return post, comb, collapsed


def v4_decoder_layer_forward(self: Any, hidden_states: Any, input_ids: Any = None,
                             **kwargs: Any) -> Any:
    """``DeepseekV4DecoderLayer.forward`` with each block's expansion and residual mix as
    one ``deepseek::hc_post`` node."""
    import torch

    post, comb, collapsed = self.attn_hc(hidden_states)
    attn_output, _ = self.self_attn(self.input_layernorm(collapsed), **kwargs)
    hidden_states = torch.ops.deepseek.hc_post(hidden_states, attn_output, post, comb)
    post, comb, collapsed = self.ffn_hc(hidden_states)
    mlp_output = self.mlp(self.post_attention_layernorm(collapsed), input_ids=input_ids)
    return torch.ops.deepseek.hc_post(hidden_states, mlp_output, post, comb)


@contextlib.contextmanager
def v4_hyper_connection_context(_config: Any, _options: Any) -> Iterator[None]:
    """Swap ``DeepseekV4HyperConnection.forward`` for :func:`v4_hyper_connection_forward`
    and ``DeepseekV4DecoderLayer.forward`` for :func:`v4_decoder_layer_forward` while
    open."""
    import importlib

    ensure_ops()
    module = importlib.import_module(_MODULE)
    swaps = ((module.DeepseekV4HyperConnection, v4_hyper_connection_forward),
             (module.DeepseekV4DecoderLayer, v4_decoder_layer_forward))
    originals = [(cls, cls.__dict__["forward"]) for cls, _ in swaps]
    for cls, forward in swaps:
        cls.forward = forward
    try:
        yield
    finally:
        for cls, forward in originals:
            cls.forward = forward
