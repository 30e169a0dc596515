"""The public plugin API: every name a zrt plugin (hardware, model or rule pack) may import.

``from zrt_core.plugin import ...`` is the stable surface (docs/plugins.md); other zrt_core
modules are internals that may move. Names load on first use, so importing this is cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zrt_core.errors import (
    InternalError,
    LayoutError,
    ModelError,
    PluginError,
    SpecError,
    UnknownNameError,
    ZrtError,
)
from zrt_core.hookspecs import PROJECT, hookimpl

if TYPE_CHECKING:
    pass

#: public name → the internal module that defines it (imported on first use: some pull torch)
_LAZY: dict[str, str] = {
    # the plugin host (for tests and tools that list what is installed)
    "ENTRY_POINT_GROUP": "zrt_core.plugins",
    "PluginHost": "zrt_core.plugins",
    "get_plugin_manager": "zrt_core.plugins",
    # contribution value types, one per contribution hook
    "HardwareSpec": "zrt_core.hardware",
    "load_specs": "zrt_core.hardware",
    "MeasuredTable": "zrt_core.cost.measured",
    "MeasuredRow": "zrt_core.cost.measured",
    "BundledModel": "zrt_core.models",
    "load_bundled": "zrt_core.models",
    "ModelPatch": "zrt_core.capture.patches",
    "ModelType": "zrt_core.capture.model_types",
    "OpFormula": "zrt_core.formulas.registry",
    "OpCall": "zrt_core.formulas.registry",
    "FormulaRegistry": "zrt_core.formulas.registry",
    "FusionRulePack": "zrt_core.transforms.fusion",
    "TransformSpec": "zrt_core.transforms.base",
    "TransformContext": "zrt_core.transforms.base",
    "CostBackendSpec": "zrt_core.cost.backend",
    "PriceSource": "zrt_core.cost.backend",
    "PhaseFlops": "zrt_core.modelmath.flops",
    # the IR
    "OpGraph": "zrt_core.ir.graph",
    "OpNode": "zrt_core.ir.graph",
    "TensorMeta": "zrt_core.ir.graph",
    "Category": "zrt_core.ir.graph",
    "Phase": "zrt_core.ir.graph",
    # helpers for formulas and model patches
    "attention_pairs": "zrt_core.formulas.aten",
    "annotate": "zrt_core.capture.recorder",
    "take_cache": "zrt_core.capture.compat",
    "output_cache": "zrt_core.capture.compat",
    "cache_keyword": "zrt_core.capture.compat",
}

__all__ = [
    "PROJECT",
    "InternalError",
    "LayoutError",
    "ModelError",
    "PluginError",
    "SpecError",
    "UnknownNameError",
    "ZrtError",
    "hookimpl",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zrt_core.plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
