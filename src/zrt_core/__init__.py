"""zrt: predict how fast, how large and how costly it is to train or serve an LLM.

The public API; heavy parts (torch, transformers) are imported only when used::

    import zrt_core
    graphs = zrt_core.capture("llama3-8b", phases=["prefill"], batch=1, seq_len=4096)
"""

from __future__ import annotations

from typing import Any

from zrt_core.errors import ZrtError
from zrt_core.plugins import get_plugin_manager, hookimpl

__version__ = "0.1.0"

__all__ = ["ZrtError", "__version__", "capture", "compare", "get_plugin_manager", "hookimpl",
           "search"]


def __getattr__(name: str) -> Any:
    if name == "capture":
        from zrt_core.capture.api import capture

        return capture
    if name == "compare":  # zrt_core.search is a callable package: search(...) itself
        from zrt_core.search import compare

        return compare
    if name == "search":
        import importlib

        return importlib.import_module("zrt_core.search")
    raise AttributeError(f"module 'zrt_core' has no attribute {name!r}")
