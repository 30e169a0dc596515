"""Estimators: a model, a machine, a layout and a workload in; a broken-down prediction out.

``zrt_core.estimate.training.estimate_training`` predicts one training step;
:func:`estimate_inference` serving (docs/inference-model.md), from captures reused across
layouts (:func:`load_or_capture`, :class:`CapturedModel`).
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
