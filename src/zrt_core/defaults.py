"""The core's own contributions, registered through the same hooks plugins use."""

from __future__ import annotations

from zrt_core.plugins import hookimpl


@hookimpl
def zrt_model_configs():
    from zrt_core.models import load_bundled

    return load_bundled()
