"""Scoped model patches: applied inside a context around build and capture, never globally."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from attrs import frozen


@frozen
class ModelPatch:
    """A patch a plugin contributes through ``zrt_model_patches``.

    :param applies_to: ``config -> bool``; the harness enters only patches that apply.
    :param context: ``(config, options) -> context manager`` entered before the model is
        built and exited after capture.
    """

    name: str
    applies_to: Callable[[Any], bool]
    context: Callable[[Any, Any], AbstractContextManager[Any]]
    description: str = ""


def _always(_config: Any) -> bool:
    return True


def _is_llama4(config: Any) -> bool:
    from zrt_core.capture.moe import LLAMA4_TYPES

    return getattr(config, "model_type", "") in LLAMA4_TYPES


def _has_alibi(config: Any) -> bool:
    from zrt_core.capture.attention import uses_alibi_patch

    return uses_alibi_patch(config)


def _alibi_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.attention import alibi_attention_context

    return alibi_attention_context(config, options)


def _has_experts(config: Any) -> bool:
    from zrt_core.capture.moe import uses_experts_interface

    return uses_experts_interface(config)


def _needs_mask(config: Any) -> bool:
    from zrt_core.capture.attention import MASKED_TYPES

    return getattr(config, "model_type", "") in MASKED_TYPES


def _mask_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.attention import zrt_mask_context

    return zrt_mask_context(config, options)


def _has_mamba(config: Any) -> bool:
    from zrt_core.capture.mamba import uses_mamba_kernels

    return uses_mamba_kernels(config)


def _mamba_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.mamba import mamba_kernels_context

    return mamba_kernels_context(config, options)


def _has_deltanet(config: Any) -> bool:
    from zrt_core.capture.deltanet import uses_deltanet_kernels

    return uses_deltanet_kernels(config)


def _deltanet_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.deltanet import deltanet_kernels_context

    return deltanet_kernels_context(config, options)


def _attention_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.attention import zrt_attention_context

    return zrt_attention_context(config, options)


def _experts_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.moe import balanced_experts_context

    return balanced_experts_context(config, options)


def _llama4_context(config: Any, options: Any) -> AbstractContextManager[Any]:
    from zrt_core.capture.moe import llama4_experts_context

    return llama4_experts_context(config, options)


def core_patches() -> list[ModelPatch]:
    """The patches the core contributes through ``zrt_model_patches``."""
    return [
        ModelPatch(
            name="zrt.attention", applies_to=_always, context=_attention_context,
            description="every attention call becomes one zrt.attention node (causal, "
                        "window, chunk, sinks, sparse indices as arguments; no mask tensors)"),
        ModelPatch(
            name="zrt.alibi_attention", applies_to=_has_alibi, context=_alibi_context,
            description="BLOOM, MPT, Falcon and GPT-Neo attention modules run one causal "
                        "zrt.attention node (alibi=True for ALiBi, as FlashAttention's "
                        "alibi_slopes; GPT-Neo's local window) instead of full-square "
                        "scores + softmax + bmm"),
        ModelPatch(
            name="zrt.attention_mask", applies_to=_needs_mask, context=_mask_context,
            description="materialise causal masks for model code that reads them (the "
                        "DeepSeek V3.2 indexer); zrt.attention itself ignores them"),
        ModelPatch(
            name="zrt.balanced_experts", applies_to=_has_experts, context=_experts_context,
            description="MoE experts through dispatch → grouped GEMMs → combine under "
                        "balanced routing (or the configured imbalance)"),
        ModelPatch(
            name="zrt.mamba_kernels", applies_to=_has_mamba, context=_mamba_context,
            description="Mamba-2 mixers run one SSD chunk-scan node (prefill, training) or "
                        "one state-update node (decode), as mamba_chunk_scan_combined and "
                        "selective_state_update do, instead of HF's einsum reference"),
        ModelPatch(
            name="zrt.deltanet_kernels", applies_to=_has_deltanet, context=_deltanet_context,
            description="Gated DeltaNet mixers (Qwen3-Next, Qwen3.5) run one chunked "
                        "gated-delta-rule node (prefill, training) or one recurrent node "
                        "(decode), as flash-linear-attention's kernels do, instead of HF's "
                        "per-chunk torch fallback"),
        ModelPatch(
            name="zrt.llama4_experts", applies_to=_is_llama4, context=_llama4_context,
            description="Llama 4 MoE routes top-k experts instead of computing all densely"),
    ]
