"""The plugin host and a memoised capture of each tiny config (``tiny_configs.TINY``).

``captured(family, **options)`` returns one :class:`CaptureResult` per distinct call, so
tests that look at the same capture share it.
"""

from __future__ import annotations

from typing import Any

import pytest
from tiny_configs import TINY

from zrt_core.plugins import PluginHost, get_plugin_manager


@pytest.fixture(scope="session")
def host() -> PluginHost:
    """The core's plugins only: results do not depend on what else is installed."""
    return get_plugin_manager(autoload=False)


_CACHE: dict[tuple, Any] = {}


@pytest.fixture(scope="session")
def captured(host: PluginHost):
    """``captured(family, **options)`` → a memoised :class:`CaptureResult`."""
    from zrt_core.capture.api import capture

    def run(family: str, **options: Any) -> Any:
        opts = {"batch": 2, "seq_len": 16, **options}
        key = (family, tuple(sorted((k, repr(v)) for k, v in opts.items())))
        if key not in _CACHE:
            _CACHE[key] = capture(TINY[family], host=host, **opts)
        return _CACHE[key]

    return run
