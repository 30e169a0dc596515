"""The ``zrt_xai`` plugin module, loaded through the ``zrt`` entry point: Grok-1 as a model type
(``zrt_model_types``) and its released configuration as a bundled model
(``zrt_model_configs``). Nothing here imports torch or transformers."""

from __future__ import annotations

from typing import Any

from zrt_core.plugin import hookimpl


def _config_class() -> Any:
    from zrt_xai.grok import GrokConfig

    return GrokConfig


def _model_class() -> Any:
    from zrt_xai.grok import GrokForCausalLM

    return GrokForCausalLM


@hookimpl
def zrt_model_types() -> list[Any]:
    from zrt_core.plugin import ModelType

    return [ModelType(
        name="grok-1", config_class=_config_class, model_class=_model_class,
        description="xAI Grok-1 (xai-org/grok-1 model.py): GQA with tanh-capped logits, "
                    "sandwich RMSNorms, 8 GeGLU experts top-2, tied scaled embedding")]


@hookimpl
def zrt_model_configs() -> list[Any]:
    """Grok-1 as released (xai-org/grok-1 ``run.py``)."""
    from pathlib import Path

    from zrt_core.plugin import load_bundled

    return load_bundled(Path(__file__).parent / "models.yaml")
