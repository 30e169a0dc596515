"""``zrt serve``: the CLI as an HTTP API with persistent jobs (FastAPI, uvicorn, SQLite),
installed with the ``zrt-core[serve]`` extra; see docs/serve.md."""

from __future__ import annotations

from zrt_core.serve.app import ServeSettings, create_app

__all__ = ["ServeSettings", "create_app"]
