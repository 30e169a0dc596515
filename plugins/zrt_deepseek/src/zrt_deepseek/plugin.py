"""The ``zrt_deepseek`` plugin module, loaded through the ``zrt`` entry point.

Contributes DeepSeek's production attention to capture: model patches
(``zrt_model_patches``) that rewrite transformers' reference attention into the kernels
engines run, Kimi K2's ``model_type`` built as DeepSeek-V3 (``zrt_model_types``), the
FLOP/byte formulas of those kernels (``zrt_op_formulas``) and DeepSeek
configs the core does not bundle (``zrt_model_configs``). Kernel selection per platform
(CUDA names at capture, the Ascend DSA kernels for Ascend hardware) is the transform
:class:`zrt_deepseek.kernels.PlatformKernels`, which both estimators run on Ascend
hardware (``zrt_graph_transforms``). DeepSeek-V4's analytic FLOPs, which the core does not
describe, answer ``zrt_reference_flops``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zrt_core.plugin import hookimpl


def _mla_context(config: Any, options: Any) -> Any:
    from zrt_deepseek.mla import mla_context

    return mla_context(config, options)


def _mla_applies(config: Any) -> bool:
    from zrt_deepseek.mla import applies_to

    return applies_to(config)


def _v4_context(config: Any, options: Any) -> Any:
    from zrt_deepseek.v4 import v4_context

    return v4_context(config, options)


def _v4_hc_context(config: Any, options: Any) -> Any:
    from zrt_deepseek.v4 import v4_hyper_connection_context

    return v4_hyper_connection_context(config, options)


def _v4_applies(config: Any) -> bool:
    from zrt_deepseek.v4 import applies_to

    return applies_to(config)


@hookimpl
def zrt_model_patches() -> list[Any]:
    from zrt_core.plugin import ModelPatch

    return [
        ModelPatch(
            name="deepseek.mla", applies_to=_mla_applies, context=_mla_context,
            description="MLA as FlashMLA runs it: decode absorbs W_UK/W_UV and attends over "
                        "the 576-wide latent cache (deepseek.mla_attention); prefill and "
                        "training expand K/V; V3.2 adds deepseek.lightning_indexer and "
                        "top-k sparse attention"),
        ModelPatch(
            name="deepseek.v4_attention", applies_to=_v4_applies, context=_v4_context,
            description="DeepSeek-V4 sliding/CSA/HCA attention as one sparse kernel "
                        "(deepseek.sparse_attention over window + compressed entries; the "
                        "CSA indexer as deepseek.lightning_indexer); no block masks"),
        ModelPatch(
            name="deepseek.v4_hyper_connections", applies_to=_v4_applies,
            context=_v4_hc_context,
            description="DeepSeek-V4's hyper-connection weights (sigmoid pre/post, "
                        "Sinkhorn-normalised comb) as one deepseek.hc_split_sinkhorn kernel, "
                        "as V4's inference code runs them, instead of ~4 x hc_sinkhorn_iters "
                        "elementwise ops"),
    ]


@hookimpl
def zrt_op_formulas() -> list[Any]:
    from zrt_deepseek.formulas import deepseek_formulas

    return deepseek_formulas()


def _kimi_k2_config_class() -> Any:
    from zrt_deepseek.kimi import kimi_k2_config_class

    return kimi_k2_config_class()


def _kimi_k2_model_class() -> Any:
    from transformers import DeepseekV3ForCausalLM

    return DeepseekV3ForCausalLM


@hookimpl
def zrt_model_types() -> list[Any]:
    """Kimi K2's ``model_type`` (``kimi_k2``), which transformers does not register: its
    checkpoints ship DeepSeek-V3's modelling code (``auto_map`` →
    ``modeling_deepseek.DeepseekV3ForCausalLM``), so it is built as transformers'
    DeepSeek-V3 with the config's own dimensions."""
    from zrt_core.plugin import ModelType

    return [ModelType(
        name="kimi_k2", config_class=_kimi_k2_config_class, model_class=_kimi_k2_model_class,
        description="Moonshot Kimi K2 (DeepseekV3ForCausalLM): MLA, 384 routed experts "
                    "top-8 and one shared, one dense layer")]


@hookimpl
def zrt_model_configs() -> list[Any]:
    """DeepSeek checkpoints with V3's architecture that the core does not bundle."""
    from pathlib import Path

    from zrt_core.plugin import load_bundled

    return load_bundled(Path(__file__).parent / "models.yaml")


def _platform_kernels(_ctx: Any) -> Any:
    from zrt_deepseek.kernels import PlatformKernels

    return PlatformKernels()


@hookimpl
def zrt_graph_transforms() -> list[Any]:
    from zrt_core.plugin import TransformSpec

    return [
        TransformSpec(
            name="deepseek.platform_kernels", factory=_platform_kernels,
            point="before_fusion", platforms=("ascend",),
            description="DSA kernels of Ascend hardware: deepseek.lightning_indexer → "
                        "npu_lightning_indexer, sparse mla_attention(_backward) → "
                        "npu_sparse_flash_attention(_backward), formulas re-evaluated"),
    ]


@hookimpl
def zrt_reference_flops(config: Mapping[str, Any], phase: str, batch: int,
                        seq_len: int) -> Any:
    """DeepSeek-V4's analytic FLOPs (:func:`zrt_deepseek.analytic.v4_phase_flops`); None
    for every other model."""
    from zrt_deepseek.analytic import is_v4, v4_phase_flops

    if not is_v4(config):
        return None
    return v4_phase_flops(config, phase, batch, seq_len)
