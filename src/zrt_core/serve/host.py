"""The worker process's plugin host, built once per process."""

from __future__ import annotations

from typing import Any

_WORKER_HOST: list[Any] = []


def worker_host() -> Any:
    """The worker process's plugin host, built once (a host takes a second or two to build,
    and the estimators' caches live as long as it does)."""
    if not _WORKER_HOST:
        from zrt_core.plugins import get_plugin_manager

        _WORKER_HOST.append(get_plugin_manager())
    return _WORKER_HOST[0]
