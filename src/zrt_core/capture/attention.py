"""Route every attention call of a transformers model to one ``zrt::attention`` node.

Registered in transformers' ``AttentionInterface`` under the name :data:`ATTN_NAME` only
while the patch's context is open. The name is not in the mask interface, so transformers
builds no mask tensors; the causal / sliding-window / chunked / sparse structure travels to
the operator as explicit arguments read from the layer (``is_causal``,
``sliding_window``, the config's ``layer_types``) and the call (``s_aux`` sinks, DeepSeek
V3.2 ``indices``). gpt_oss and deepseek_v4, which refuse SDPA, run through it as well.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from zrt_core.capture.compat import take_cache
from zrt_core.capture.ops import ensure_ops

ATTN_NAME = "zrt"


def _layer_type(module: Any) -> str | None:
    config = getattr(module, "config", None)
    idx = getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None) if config is not None else None
    if isinstance(types, list | tuple) and isinstance(idx, int) and 0 <= idx < len(types):
        return str(types[idx])
    value = getattr(module, "layer_type", None) or getattr(module, "attention_type", None)
    return value if isinstance(value, str) else None


def attention_structure(module: Any, sliding_window: Any) -> tuple[int, int]:
    """``(window, chunk)`` of one layer's attention (0 = none)."""
    config = getattr(module, "config", None)
    layer_type = _layer_type(module) or ""
    window = int(sliding_window) if isinstance(sliding_window, int) and sliding_window > 0 else 0
    if not window and "sliding" in layer_type:
        window = int(getattr(config, "sliding_window", 0) or 0)
    chunk = 0
    if "chunked" in layer_type:
        chunk = int(getattr(config, "attention_chunk_size", 0) or 0)
    return window, chunk


def zrt_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                          dropout: float = 0.0, scaling: float | None = None,
                          sliding_window: int | None = None, softcap: float | None = None,
                          s_aux: Any = None, indices: Any = None, is_causal: bool | None = None,
                          **_kwargs: Any) -> tuple[Any, None]:
    """An ``AttentionInterface`` function: ``(attn_output [B, Sq, H, Dv], None)``."""
    import torch

    causal = is_causal if is_causal is not None else bool(getattr(module, "is_causal", True))
    scale = float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5
    window, chunk = attention_structure(module, sliding_window)
    out, _lse = torch.ops.zrt.attention(query, key, value, s_aux, indices, causal, window,
                                        chunk, scale, float(softcap or 0.0))
    return out, None


@contextlib.contextmanager
def zrt_attention_context(config: Any, _options: Any) -> Iterator[None]:
    """Register :func:`zrt_attention_forward` and select it in ``config``; undo on exit."""
    from transformers.modeling_utils import AttentionInterface

    ensure_ops()
    mapping = AttentionInterface._global_mapping
    previous = mapping.get(ATTN_NAME)
    mapping[ATTN_NAME] = zrt_attention_forward
    configs = [config, *(c for c in _sub_configs(config))]
    before = [c._attn_implementation_internal for c in configs]
    try:
        for c in configs:
            c._attn_implementation = ATTN_NAME
        yield
    finally:
        for c, b in zip(configs, before, strict=True):
            c._attn_implementation_internal = b
        if previous is None:
            mapping.pop(ATTN_NAME, None)
        else:
            mapping[ATTN_NAME] = previous


def _sub_configs(config: Any) -> list[Any]:
    out = []
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation_internal"):
            out.append(sub)
    return out


# Families whose model code reads the attention mask itself (DeepSeek V3.2's lightning
# indexer masks its scores with it; MPT converts it to bool before its layers), so a mask
# must exist under the zrt implementation.
MASKED_TYPES = ("deepseek_v32", "glm_moe_dsa", "mpt")


def _materialised_mask(*args: Any, **kwargs: Any) -> Any:
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


@contextlib.contextmanager
def zrt_mask_context(_config: Any, _options: Any) -> Iterator[None]:
    """Have transformers build boolean causal masks for :data:`ATTN_NAME` while open.

    ``zrt.attention`` does not read them (its structure is explicit); model code that
    does (the V3.2 indexer) gets the mask HF's SDPA path would build.
    """
    from transformers.masking_utils import AttentionMaskInterface

    mapping = AttentionMaskInterface._global_mapping
    previous = mapping.get(ATTN_NAME)
    mapping[ATTN_NAME] = _materialised_mask
    try:
        yield
    finally:
        if previous is None:
            mapping.pop(ATTN_NAME, None)
        else:
            mapping[ATTN_NAME] = previous


# -- ALiBi families ---------------------------------------------------------------------------
#
# BLOOM, MPT and Falcon (``alibi=True`` configs) predate transformers' attention interface:
# their attention modules spell out full-square scores (``baddbmm``/``matmul`` + softmax +
# ``bmm``) with the ALiBi bias added to them. Production runs them as one causal flash
# kernel with ``alibi_slopes`` (FlashAttention 2.4+; Megatron-DeepSpeed's BLOOM), which does
# half the work at long sequences. While the patch is open their attention modules call
# ``zrt.attention(..., alibi=True)`` instead; projections, caches and dropout stay HF's.
# Falcon's rotary configs take the same route without the flag (the module would otherwise
# fall back to its eager full-square path under the zrt implementation), and so does GPT-Neo,
# whose attention class is picked from a table keyed by implementation name (its local
# layers a 256-key sliding window, no 1/√d scaling: ``scale`` 1).

ALIBI_TYPES = ("bloom", "mpt", "falcon", "gpt_neo")


def uses_alibi_patch(config: Any) -> bool:
    """Whether :func:`alibi_attention_context` rewrites this model's attention."""
    return getattr(config, "model_type", "") in ALIBI_TYPES


def _bloom_attention_forward(self: Any, hidden_states: Any, residual: Any, alibi: Any,
                             attention_mask: Any, layer_past: Any = None,
                             use_cache: bool = False, output_attentions: bool = False,
                             **_kwargs: Any) -> tuple[Any, None]:
    import torch
    from transformers.models.bloom.modeling_bloom import dropout_add

    batch, q_len, _ = hidden_states.shape
    query, key, value = self._reshape(self.query_key_value(hidden_states))  # [B, H, S, D]
    cache = take_cache(_kwargs, layer_past)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx)
    out, _lse = torch.ops.zrt.attention(query, key, value, None, None, True, 0, 0,
                                        float(self.inv_norm_factor), 0.0, True)
    output = self.dense(out.reshape(batch, q_len, self.hidden_size))
    return dropout_add(output, residual, self.hidden_dropout, self.training), None


def _mpt_attention_forward(self: Any, hidden_states: Any, position_bias: Any,
                           past_key_values: Any = None, attention_mask: Any = None,
                           **_kwargs: Any) -> tuple[Any, None]:
    import torch

    batch, seq = hidden_states.shape[:2]
    mixed = self.Wqkv(hidden_states)
    if self.clip_qkv:
        mixed = mixed.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (t.reshape(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
                         for t in mixed.chunk(3, dim=2))
    cache = take_cache(_kwargs, past_key_values)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx)
    out, _lse = torch.ops.zrt.attention(query, key, value, None, None, True, 0, 0,
                                        float(self.softmax_scale), 0.0, True)
    return self.out_proj(out.reshape(batch, seq, -1)), None


def _falcon_attention_forward(self: Any, hidden_states: Any, alibi: Any, attention_mask: Any,
                              position_ids: Any = None, layer_past: Any = None,
                              use_cache: bool = False, output_attentions: bool = False,
                              position_embeddings: Any = None, **_kwargs: Any
                              ) -> tuple[Any, None]:
    import torch
    from transformers.models.falcon.modeling_falcon import apply_rotary_pos_emb

    kv_heads = self.num_heads if self.new_decoder_architecture else self.num_kv_heads
    query, key, value = self._split_heads(self.query_key_value(hidden_states))
    batch, q_len = query.shape[:2]
    query = query.transpose(1, 2).reshape(batch, self.num_heads, q_len, self.head_dim)
    key = key.transpose(1, 2).reshape(batch, kv_heads, q_len, self.head_dim)
    value = value.transpose(1, 2).reshape(batch, kv_heads, q_len, self.head_dim)
    if alibi is None:
        cos, sin = position_embeddings
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
    cache = take_cache(_kwargs, layer_past)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_idx)
    flags = (True,) if alibi is not None else ()
    out, _lse = torch.ops.zrt.attention(query, key, value, None, None, True, 0, 0,
                                        float(self.inv_norm_factor), 0.0, *flags)
    return self.dense(out.reshape(batch, q_len, self.num_heads * self.head_dim)), None


def _gpt_neo_attention_forward(self: Any, hidden_states: Any, attention_mask: Any = None,
                               layer_past: Any = None, use_cache: bool = False,
                               output_attentions: bool = False, **_kwargs: Any
                               ) -> tuple[Any, None]:
    import torch

    batch, q_len = hidden_states.shape[:2]
    query, key, value = (self._split_heads(proj(hidden_states), self.num_heads, self.head_dim)
                         for proj in (self.q_proj, self.k_proj, self.v_proj))  # [B, H, S, D]
    cache = take_cache(_kwargs, layer_past)
    if cache is not None:
        key, value = cache.update(key, value, self.layer_id)
    window = int(self.config.window_size) if self.attention_type == "local" else 0
    out, _lse = torch.ops.zrt.attention(query, key, value, None, None, True, window, 0, 1.0,
                                        0.0)
    output = self.out_proj(out.reshape(batch, q_len, self.num_heads * self.head_dim))
    return self.resid_dropout(output), None


def _alibi_targets(model_type: str) -> list[tuple[Any, Any]]:
    if model_type == "bloom":
        from transformers.models.bloom import modeling_bloom

        return [(modeling_bloom.BloomAttention, _bloom_attention_forward)]
    if model_type == "mpt":
        from transformers.models.mpt import modeling_mpt

        return [(modeling_mpt.MptAttention, _mpt_attention_forward)]
    if model_type == "gpt_neo":
        from transformers.models.gpt_neo import modeling_gpt_neo

        return [(modeling_gpt_neo.GPTNeoSelfAttention, _gpt_neo_attention_forward)]
    from transformers.models.falcon import modeling_falcon

    return [(modeling_falcon.FalconAttention, _falcon_attention_forward)]


@contextlib.contextmanager
def alibi_attention_context(config: Any, _options: Any) -> Iterator[None]:
    """Route BLOOM/MPT/Falcon attention modules to ``zrt.attention`` while open."""
    ensure_ops()
    model_type = getattr(config, "model_type", "")
    targets = _alibi_targets(model_type)
    saved = [(cls, cls.__dict__["forward"]) for cls, _ in targets]
    classes: dict[str, Any] = {}
    if model_type == "falcon":  # Falcon picks its attention class by implementation name
        from transformers.models.falcon import modeling_falcon

        classes = modeling_falcon.FALCON_ATTENTION_CLASSES
    elif model_type == "gpt_neo":  # so does GPT-Neo
        from transformers.models.gpt_neo import modeling_gpt_neo

        classes = modeling_gpt_neo.GPT_NEO_ATTENTION_CLASSES
    had = ATTN_NAME in classes
    previous = classes.get(ATTN_NAME)
    try:
        for cls, forward in targets:
            cls.forward = forward
        if model_type in ("falcon", "gpt_neo"):
            classes[ATTN_NAME] = targets[0][0]
        yield
    finally:
        for cls, forward in saved:
            cls.forward = forward
        if had:
            classes[ATTN_NAME] = previous
        else:
            classes.pop(ATTN_NAME, None)
