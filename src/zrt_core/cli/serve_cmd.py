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
        raise ZrtError(f"zrt serve needs the serve extra ({exc.name or exc} is not installed)",
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
                             max_body_bytes=args.max_body_bytes, defer_start=True)
    app = create_app(settings)

    class Server(uvicorn.Server):
        """Workers and plugins start once the port is open: a cold server answers at once."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            app.state.zrt_start()

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                            access_log=False)
    Server(config).run()
    return 0


#: ``zrt run --train`` flags a spec document has no key for, with their defaults: a
#: different value cannot go to a server, and is refused rather than dropped.
_LOCAL_ONLY = {"lora_rank": 0, "lora_modules": None, "freeze_language_model": False,
               "host_link_gbps": None,
               "attention": "flash", "embedding_loss_stages": False,
               "decoder_first_pipeline_num_layers": None,
               "decoder_last_pipeline_num_layers": None,
               "pipeline_model_parallel_layout": None, "no_cache": False,
               "reshard_after_forward": None, "hsdp": None, "gpus": None, "mtp": None}


def run_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The spec document (docs/estimate.md) of a ``zrt run`` command line, capture
    front-end (what ``zrt run`` uses): the same estimate, computed by a server."""
    mode = args.mode or "infer"
    parallel = {"tp": args.tp, "pp": args.pp, "vp": args.vp, "cp": args.cp, "ep": args.ep,
                "etp": args.etp, "dp": args.dp, "sp": args.sp, "cp_kind": args.cp_kind}
    from zrt_core.cli.moe_args import moe_load_from_args

    load = moe_load_from_args(args)
    if load is not None:
        parallel["moe_load"] = load.to_json()
    spec: dict[str, Any] = {"model": args.model, "hardware": args.hw,
                            "parallel": {k: v for k, v in parallel.items() if v is not None},
                            "frontend": "capture"}
    if mode == "infer":
        if getattr(args, "mtp", None) is not None:
            raise ZrtError("--mtp is not available with --server (an estimate spec has "
                           "no key for it)", "drop --mtp, or run without --server")
        kv = args.kv_dtype or ("fp8" if args.quant in ("fp8", "fp4") else None)
        spec["infer"] = {"input_len": args.input_len, "output_len": args.output_len,
                         "batch": args.batch, "quant": args.quant, "kv_dtype": kv,
                         "engine": args.engine}
        return spec
    for key, default in _LOCAL_ONLY.items():
        if getattr(args, key, default) != default:
            flag = "--" + key.replace("_", "-")
            raise ZrtError(f"{flag} is not available with --server (an estimate spec has no "
                           "key for it)", f"drop {flag}, or run without --server")
    train = {"micro_batch": args.micro_batch,
             "global_batch": args.global_batch or args.micro_batch * args.dp,
             "seq_len": args.seq_len, "recompute": args.recompute, "zero": args.zero,
             "fsdp": args.fsdp, "optimizer": args.optimizer, "precision": args.precision,
             "offload_optimizer": args.offload_optimizer}
    if args.pp_schedule:
        train["pp_schedule"] = args.pp_schedule
    spec["train"] = train
    if args.num_gpus is not None:
        spec["num_gpus"] = args.num_gpus
    return spec


def run_remote(args: argparse.Namespace) -> int:
    """``zrt run ... --server URL``: the estimate computed by a ``zrt serve``; prints what
    ``zrt run --json`` prints (always JSON), and with ``--out DIR`` writes the report
    files the server made."""
    import json

    from zrt_core.cli._output import out_dir, print_json
    from zrt_core.client import Client

    spec = run_spec(args)
    with Client(args.server) as client:
        params = {"files": "true"} if args.out else None
        job = client.submit("estimate", spec, params=params)
        job = client.wait(job["id"])
        result = dict(job["result"])
        result.pop("spec", None)
        if args.out:
            directory = out_dir(args.out)
            written = []
            for name in job["files"]:
                path = directory / name
                path.write_bytes(client.file(job["id"], name))
                written.append(path)
            path = directory / "report.json"
            path.write_text(json.dumps(result, indent=1), encoding="utf-8")
            if path not in written:
                written.append(path)
            result["files"] = [str(p) for p in written]
    print_json(result)
    return 0
