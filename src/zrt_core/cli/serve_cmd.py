"""``zrt serve``: start the HTTP API (``zrt-core[serve]``; docs/serve.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from zrt_core.cli._output import positive_int
from zrt_core.errors import ZrtError


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve the CLI as an HTTP API with persistent jobs",
                       description="An HTTP API (FastAPI under uvicorn) mirroring the CLI: "
                       "estimate, capture and validate jobs kept in SQLite, run in worker "
                       "processes; OpenAPI at /openapi.json, docs at /docs (docs/serve.md). "
                       "Needs the serve extra: pip install 'zrt-core[serve]'.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                   "127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a "
                   "free one)")
    p.add_argument("--db", default="zrt-jobs.sqlite", metavar="PATH",
                   help="SQLite file holding the jobs (default ./zrt-jobs.sqlite)")
    p.add_argument("--workers", type=positive_int("--workers"), default=2, metavar="N",
                   help="worker processes, one job each at a time (default 2)")
    p.add_argument("--model-dir", metavar="DIR", help="the only folder whose configs a "
                   "request may name (default: none; bundled names and inline configs only)")
    p.add_argument("--token", default=None, help="bearer token every endpoint but /healthz "
                   "requires (default: $ZRT_TOKEN; none: no token)")
    p.add_argument("--max-queue", type=positive_int("--max-queue"), default=64, metavar="N",
                   help="queued jobs before new ones get 429 (default 64)")
    p.add_argument("--job-timeout", type=float, default=600.0, metavar="S",
                   help="seconds a job may run before it fails (default 600)")
    p.add_argument("--max-body-bytes", type=positive_int("--max-body-bytes"),
                   default=1 << 20, metavar="N", help="largest request body (default 1 MiB)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from zrt_core.serve.app import ServeSettings, create_app
    except ImportError as exc:
        raise ZrtError(f"zrt serve needs the serve extra ({exc.name} is not installed)",
                       "pip install 'zrt-core[serve]'") from None
    model_dir = None
    if args.model_dir:
        model_dir = Path(args.model_dir).expanduser()
        if not model_dir.is_dir():
            raise ZrtError(f"--model-dir {args.model_dir}: no such directory",
                           "pass the folder holding the model configs")
    if not args.job_timeout > 0:
        raise ZrtError(f"--job-timeout must be a positive number of seconds, got "
                       f"{args.job_timeout:g}")
    db = Path(args.db).expanduser()
    if not db.parent.is_dir():
        raise ZrtError(f"--db {args.db}: the folder {db.parent} does not exist",
                       "create it, or pass another path")
    settings = ServeSettings(db=str(db), workers=args.workers, model_dir=model_dir,
                             token=args.token or os.environ.get("ZRT_TOKEN") or None,
                             max_queue=args.max_queue, job_timeout_s=args.job_timeout,
                             max_body_bytes=args.max_body_bytes)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info",
                access_log=False)
    return 0
