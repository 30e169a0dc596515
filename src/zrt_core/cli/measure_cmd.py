"""``zrt measure CONFIG --device cpu|cuda --train|--infer``: run the real model (random
weights) and time it per step, layer, sub-module and kernel (zrt_core.profile.measure)."""

from __future__ import annotations

import argparse
from typing import Any

from zrt_core.cli._output import add_json_flag, console, positive_int, print_json, table


def register(sub: Any) -> None:
    p = sub.add_parser("measure", help="time the real model on this device (per layer, "
                       "sub-module and kernel)",
                       description="Build the transformers model from its config with random "
                       "weights, run real steps on the device and time the step, each "
                       "decoder layer and its sub-modules (hooks) and each kernel "
                       "(torch.profiler); --json for what zrt diff reads (docs/profile.md).")
    p.add_argument("model", metavar="MODEL", help="bundled name, config.json or its directory")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="mode", action="store_const", const="train",
                      help="a training step: forward and backward (the default)")
    mode.add_argument("--infer", dest="mode", action="store_const", const="infer",
                      help="serving: a prefill (or --decode step)")
    p.add_argument("--decode", action="store_true",
                   help="with --infer: one decode step over a cache of --seq-len tokens")
    p.add_argument("--batch", type=positive_int("--batch"), default=1)
    p.add_argument("--seq-len", type=positive_int("--seq-len"), default=128)
    p.add_argument("--layers", type=positive_int("--layers"), default=None,
                   help="keep the first N decoder layers")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    p.add_argument("--repeats", type=positive_int("--repeats"), default=5)
    p.add_argument("--compile", action="store_true",
                   help="run under torch.compile; compare its outputs with eager's "
                        "(torch.allclose)")
    p.add_argument("--threads", type=positive_int("--threads"), default=1,
                   help="CPU intra-op threads (default 1, as zrt calibrate)")
    add_json_flag(p)
    p.set_defaults(func=run, mode=None)


def run(args: argparse.Namespace) -> int:
    from zrt_core.errors import ZrtError
    from zrt_core.profile.device import open_device
    from zrt_core.profile.measure import MeasureRequest, measure

    mode = args.mode or "train"
    if args.decode and mode != "infer":
        raise ZrtError("--decode needs --infer", "zrt measure MODEL --infer --decode")
    if mode == "infer":
        mode = "decode" if args.decode else "prefill"
    device = open_device(args.device, threads=args.threads)
    result = measure(MeasureRequest(model=args.model, mode=mode, batch=args.batch,
                                    seq_len=args.seq_len, layers=args.layers,
                                    dtype=args.dtype, repeats=args.repeats,
                                    compile=args.compile), device)
    if args.json:
        print_json(result)
        return 0
    con = console()
    con.print(f"{result['model']} {mode} batch {args.batch} seq {args.seq_len} on "
              f"{device.name}: step {result['step_s'] * 1e3:.2f} ms (best of {args.repeats})")
    con.print(table("per layer", ("layer", "forward ms", "backward ms"),
                    [(r["index"], f"{r['forward_s'] * 1e3:.3f}", f"{r['backward_s'] * 1e3:.3f}")
                     for r in result["layers"]]))
    con.print(table("per sub-module (all layers)", ("module", "forward ms", "backward ms"),
                    [(r["name"], f"{r['forward_s'] * 1e3:.3f}",
                      f"{r['backward_s'] * 1e3:.3f}") for r in result["modules"]]))
    con.print(table("top kernels", ("op", "calls", "self ms"),
                    [(r["op"], r["calls"], f"{r['self_s'] * 1e3:.3f}")
                     for r in result["kernels"][:12]]))
    if result["numerics"]:
        con.print(f"compiled vs eager: allclose {result['numerics']['allclose']}, max |Δ| "
                  f"{result['numerics']['max_abs_diff']:.3g}")
    return 0
