"""Estimation: serving predictions from captured graphs (docs/inference-model.md).

:func:`estimate_inference` is the entry point; captures are reused across layouts
(:func:`load_or_capture`, :class:`CapturedModel`).
"""

from zrt_core.estimate.captures import CapturedModel, load_or_capture
from zrt_core.estimate.engine import ENGINES, EngineProfile, EngineSettings, engine_profile
from zrt_core.estimate.inference import estimate_inference
from zrt_core.estimate.serving import PagedKVCache, Rescale

__all__ = [
    "ENGINES",
    "CapturedModel",
    "EngineProfile",
    "EngineSettings",
    "PagedKVCache",
    "Rescale",
    "engine_profile",
    "estimate_inference",
    "load_or_capture",
]
