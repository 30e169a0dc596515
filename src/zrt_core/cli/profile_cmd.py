"""``zrt profile MODEL --device cpu|cuda --hw ID|FILE.yaml --out DIR``: micro-benchmark the
kernels the model needs and append them to DIR/<hardware id>.csv, a measured table
``zrt run --tables DIR`` and ``zrt diff --tables DIR`` price from (zrt_core.profile.kernels)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from zrt_core.cli._output import add_json_flag, console, positive_int, print_json


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="micro-benchmark the kernels a model needs into a "
                       "measured table",
                       description="Capture the model, collect the distinct (op, shapes, "
                       "dtype) of its GEMMs, attention and pointwise ops, grow a grid around "
                       "them, time each on the device and append them to DIR/<hw id>.csv "
                       "with their provenance. An interrupted run keeps its rows; a rerun "
                       "skips them (docs/profile.md).")
    p.add_argument("model", metavar="MODEL", help="bundled name, config.json or its directory")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--hw", required=True, metavar="ID",
                   help="the hardware the table is for: an id or a pack YAML (zrt calibrate)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the table goes")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="mode", action="store_const", const="train",
                      help="the kernels of a training step (the default)")
    mode.add_argument("--infer", dest="mode", action="store_const", const="infer",
                      help="the kernels of a prefill and a decode step")
    p.add_argument("--tp", type=positive_int("--tp"), default=1,
                   help="profile one tensor-parallel rank's kernels (default 1)")
    p.add_argument("--cp", type=positive_int("--cp"), default=1,
                   help="context-parallel degree: one rank's share of the sequence")
    p.add_argument("--ep", type=positive_int("--ep"), default=1,
                   help="expert-parallel degree: one rank's experts (data parallel as wide)")
    p.add_argument("--batch", type=positive_int("--batch"), default=1)
    p.add_argument("--seq-len", type=positive_int("--seq-len"), default=128)
    p.add_argument("--dtype", default="float32", help="the model's dtype (default float32)")
    p.add_argument("--dtypes", default="",
                   help="also time each GEMM in these dtypes (comma-separated: bfloat16,...)")
    p.add_argument("--no-grid", action="store_true",
                   help="time only the model's own shapes (no scaled or padded variants)")
    p.add_argument("--limit", type=positive_int("--limit"), default=None,
                   help="time at most N new kernels this run")
    p.add_argument("--repeats", type=positive_int("--repeats"), default=5)
    p.add_argument("--min-time-ms", type=float, default=10.0)
    p.add_argument("--threads", type=positive_int("--threads"), default=1)
    add_json_flag(p)
    p.set_defaults(func=run, mode=None)


def run(args: argparse.Namespace) -> int:
    from zrt_core.capture.api import capture
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.profile.device import DeviceError, open_device
    from zrt_core.profile.kernels import kernels_of, profile

    device = open_device(args.device, threads=args.threads)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    for dtype in (args.dtype, *dtypes):
        if dtype not in names:
            raise DeviceError(f"unknown dtype {dtype!r}", "use float32, bfloat16 or float16")
        device.check_dtype(names[dtype])
    host = get_plugin_manager()
    hw = host.hardware_spec(args.hw)
    phases = (("train_forward", "train_backward") if (args.mode or "train") == "train"
              else ("prefill", "decode"))
    captured = capture(args.model, phases, batch=args.batch, seq_len=args.seq_len, host=host,
                       dtype=args.dtype)
    graphs = [captured.graph(p) for p in phases]
    if (args.tp, args.cp, args.ep) != (1, 1, 1):
        from zrt_core.profile.layout import rank_graphs

        graphs = rank_graphs(captured, phases, hw, host, tp=args.tp, cp=args.cp, ep=args.ep,
                             batch=args.batch, seq_len=args.seq_len, dtype=args.dtype)
    kernels, skipped = kernels_of(graphs, grid=not args.no_grid, dtypes=dtypes)
    out = Path(args.out) / f"{hw.id}.csv"
    con = console()
    written = []
    try:
        for row in profile(kernels, device, out, hw.id, repeats=args.repeats,
                           min_time_s=args.min_time_ms / 1e3, limit=args.limit):
            written.append(row)
            if not args.json:
                shape = " ".join(f"{c}={row[c]}" for c in ("b", "m", "n", "k", "h", "s_q",
                                                          "s_kv", "d") if row[c])
                con.print(f"{row['op']} {row['dtype']} {shape} {row['time_us']} µs")
    except KeyboardInterrupt:
        con.print(f"interrupted: {len(written)} new rows kept in {out}")
        raise
    if args.json:
        print_json({"table": str(out), "kernels": len(kernels), "new_rows": len(written),
                    "not_replayable": skipped, "rows": written})
        return 0
    con.print(f"{len(written)} new rows in {out} ({len(kernels)} kernels, "
              f"{len(kernels) - len(written)} already there or over --limit; {skipped} "
              "distinct ops the graph keeps too little of to replay are left to the "
              "roofline)")
    return 0
