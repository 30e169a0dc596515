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
# indexer masks its scores with it), so a mask must exist under the zrt implementation.
MASKED_TYPES = ("deepseek_v32", "glm_moe_dsa")


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
