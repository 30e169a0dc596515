"""zrt-xai: xAI's Grok-1 for zrt, a ``model_type`` (``grok-1``) transformers does not build.

:mod:`zrt_xai.grok` writes Grok-1's published architecture (``xai-org/grok-1``, ``model.py``)
with transformers' building blocks, so the capture front-end builds it on fake tensors like a
built-in family; the plugin contributes it through ``zrt_model_types`` and bundles the
released configuration (``zrt_model_configs``).
"""

__version__ = "0.1.0"
