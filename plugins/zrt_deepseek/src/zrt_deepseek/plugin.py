"""The ``zrt_deepseek`` plugin module, loaded through the ``zrt`` entry point.

It implements no hook yet: ``zrt plugins`` lists it with nothing contributed. DeepSeek
model patches (``zrt_model_patches``), its fused-op formulas (``zrt_op_formulas``) and
fusion rules (``zrt_fusion_rules``) go here, each as a function marked with
``@zrt_core.hookimpl`` that returns a list of frozen values.
"""

from __future__ import annotations
