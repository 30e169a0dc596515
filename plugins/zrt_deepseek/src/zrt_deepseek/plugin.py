"""The ``zrt_deepseek`` plugin module, loaded through the ``zrt`` entry point.

Contributes DeepSeek's production attention to capture: model patches
(``zrt_model_patches``) that rewrite transformers' reference attention into the kernels
engines run, the FLOP/byte formulas of those kernels (``zrt_op_formulas``) and DeepSeek
configs the core does not bundle (``zrt_model_configs``).
"""

from __future__ import annotations

from typing import Any

from zrt_core import hookimpl


def _mla_context(config: Any, options: Any) -> Any:
    from zrt_deepseek.mla import mla_context

    return mla_context(config, options)


def _mla_applies(config: Any) -> bool:
    from zrt_deepseek.mla import applies_to

    return applies_to(config)


@hookimpl
def zrt_model_patches() -> list[Any]:
    from zrt_core.capture.patches import ModelPatch

    return [
        ModelPatch(
            name="deepseek.mla", applies_to=_mla_applies, context=_mla_context,
            description="MLA as FlashMLA runs it: decode absorbs W_UK/W_UV and attends over "
                        "the 576-wide latent cache (deepseek.mla_attention); prefill and "
                        "training expand K/V; V3.2 adds deepseek.lightning_indexer and "
                        "top-k sparse attention"),
    ]


@hookimpl
def zrt_op_formulas() -> list[Any]:
    from zrt_deepseek.formulas import deepseek_formulas

    return deepseek_formulas()
