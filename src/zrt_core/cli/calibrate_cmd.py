"""``zrt calibrate --device cpu|cuda -o FILE.yaml``: measure the device and write a hardware
pack that ``--hw ./FILE.yaml`` reads (zrt_core.profile.calibrate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from zrt_core.cli._output import add_json_flag, console, positive_int, print_json, table


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="measure this device and write a hardware pack YAML",
                       description="Time GEMMs per dtype over a size grid, a large copy, a "
                       "one-element op and an elementwise op on the device; fit peak rate, "
                       "K-loop overhead and fixed costs; write a hardware pack YAML that "
                       "--hw ./FILE.yaml accepts (docs/profile.md).")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("-o", "--output", required=True, metavar="FILE.yaml",
                   help="the pack to write")
    p.add_argument("--id", dest="hw_id", default=None,
                   help="hardware id in the pack (default measured_<device>_<name>)")
    p.add_argument("--dtypes", default=None,
                   help="comma-separated GEMM dtypes to time (fp32 always; default fp32 on "
                        "a CPU, whose bf16/fp16 GEMMs are emulated and slow to time, "
                        "fp32,tf32,bf16,fp16 on a GPU)")
    p.add_argument("--sizes", default="64,128,256,512,1024",
                   help="GEMM dimensions of the grid (default 64,128,256,512,1024)")
    p.add_argument("--mem-mb", type=float, default=64.0,
                   help="buffer copied to measure bandwidth, and the GEMM weights cycled "
                        "through, MB (default 64: beyond a CPU's caches)")
    p.add_argument("--repeats", type=positive_int("--repeats"), default=5)
    p.add_argument("--min-time-ms", type=float, default=20.0,
                   help="each sample repeats a call until it lasts this long (default 20)")
    p.add_argument("--threads", type=positive_int("--threads"), default=1,
                   help="CPU intra-op threads (default 1, as zrt measure)")
    p.add_argument("--ranks", type=positive_int("--ranks"), default=None,
                   help="time all-reduce over this many ranks with torch.distributed (NCCL "
                        "between GPUs, gloo between CPU processes) and write the link they "
                        "measure (default: every GPU of the machine; 1 on a CPU)")
    p.add_argument("--from", dest="source", default=None, metavar="CAL.json",
                   help="no device: re-derive the pack from a saved run's measurements (the "
                        "JSON zrt calibrate --json printed, say on a lent GPU) with this "
                        "version's fits")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zrt_core.profile.calibrate import calibrate
    from zrt_core.profile.device import DeviceError, open_device

    if args.source is not None:
        result = _saved(Path(args.source))
        return _write(args, result)
    if args.dtypes is None:
        args.dtypes = "fp32" if args.device == "cpu" else "fp32,tf32,bf16,fp16"
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    try:
        sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    except ValueError:
        raise DeviceError(f"--sizes must be integers, got {args.sizes!r}") from None
    if len(sizes) < 2 or min(sizes) < 1:
        raise DeviceError(f"--sizes needs at least two positive sizes, got {args.sizes!r}",
                          "the fit separates rate and overheads over sizes")
    device = open_device(args.device, threads=args.threads)
    ranks = args.ranks
    if ranks is None:
        import torch

        ranks = torch.cuda.device_count() if args.device == "cuda" else 1
    result = calibrate(device, dtypes=dtypes, sizes=sizes, mem_mb=args.mem_mb,
                       repeats=args.repeats, min_time_s=args.min_time_ms / 1e3, ranks=ranks,
                       progress=_progress)
    return _write(args, result)


def _saved(path: Path) -> Any:
    """The calibration saved in ``path`` (``zrt calibrate --json``'s output, or its
    ``calibration`` alone), re-fitted."""
    from zrt_core._data import read_json_file
    from zrt_core.errors import SpecError
    from zrt_core.profile.calibrate import Calibration

    data = read_json_file(path, "give the JSON file zrt calibrate --json wrote")
    if not isinstance(data, dict):
        raise SpecError(f"--from {path} holds no calibration",
                        "give the JSON file zrt calibrate --json wrote")
    memory = (data.get("pack") or {}).get("memory") or {}
    return Calibration.from_json(data.get("calibration", data), memory.get("capacity_gb"))


def _write(args: argparse.Namespace, result: Any) -> int:
    import yaml

    from zrt_core.hardware import HardwareSpec

    pack = result.to_pack(args.hw_id)
    HardwareSpec.from_mapping(pack, source_file=args.output)  # what --hw will read
    out = Path(args.output)
    how = f"--from {args.source}" if args.source else f"--device {args.device}"
    out.write_text(f"# written by zrt calibrate {how}\n"
                   + yaml.safe_dump(pack, sort_keys=False), encoding="utf-8")
    if args.json:
        print_json({"file": str(out), "pack": pack, "calibration": result.to_json()})
        return 0
    con = console()
    con.print(table(f"{pack['name']}", ("dtype", "rate TFLOP/s", "k0", "tile_m", "row overhead",
                                            "fixed µs", "fit RMS"),
                    [(f.dtype, f"{f.rate_flops / 1e12:.4g}", f"{f.k0:.0f}", f.tile_m,
                      f.row_overhead,
                      f"{f.fixed_s * 1e6:.1f}", f"{f.rms_rel_error:.1%}")
                     for f in result.fits]))
    fwd, bwd = result.attention
    con.print(f"attention {fwd.rate_flops / 1e9:.3g} / {bwd.rate_flops / 1e9:.3g} GFLOP/s "
              f"(forward / backward), memory {result.memory_gb_per_s:.1f} GB/s, launch "
              f"{result.launch_overhead_us:.1f} µs, pointwise {result.vector_flops / 1e9:.3g} "
              "GFLOP/s")
    if result.alignment:
        con.print("GEMMs with unaligned rows, over the aligned rate: " + ", ".join(
            f"{key.removeprefix('matmul_unaligned_')} {value:.3g}"
            for key, value in result.alignment.items()))
    if result.group_rows_overhead is not None:
        con.print(f"grouped GEMMs: each group's GEMM costs {result.group_rows_overhead} rows "
                  "beyond its own (matmul_group_rows_overhead)")
    if result.link is not None:
        link = result.link
        con.print(f"all-reduce over {link.ranks} ranks ({link.backend}): bus bandwidth "
                  f"{link.bandwidth_gb_per_s:.3g} GB/s, {link.latency_us:.1f} µs per ring "
                  f"step (fit RMS {link.rms_rel_error:.1%})")
    con.print(f"wrote {out} (use --hw {out})")
    return 0


def _progress(stage: str) -> None:
    """One line on stderr as each stage ends (stdout stays the pack's JSON or table)."""
    print(f"zrt calibrate: {stage}", file=sys.stderr, flush=True)
