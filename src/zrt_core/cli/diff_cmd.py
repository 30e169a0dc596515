"""``zrt diff m.json --hw ID|FILE.yaml``: a ``zrt measure`` result against zrt's prediction
per layer, sub-module and op category, with the end-to-end ratio (zrt_core.profile.diff)."""

from __future__ import annotations

import argparse
from typing import Any

from zrt_core.cli._output import add_json_flag, console, print_json, table


def register(sub: Any) -> None:
    p = sub.add_parser("diff", help="compare a zrt measure result with zrt's prediction",
                       description="Capture and price the measured model, step and shapes on "
                       "the hardware (a calibrated pack from zrt calibrate, typically) and "
                       "line the prediction up with the measurement per layer, sub-module "
                       "and op category; end_to_end_ratio is predicted / measured "
                       "(docs/profile.md).")
    p.add_argument("measurement", metavar="M.json", help="what zrt measure --json wrote")
    p.add_argument("--hw", required=True, metavar="ID",
                   help="hardware id or a pack YAML (zrt calibrate -o FILE.yaml)")
    p.add_argument("--tables", metavar="DIR|NAME", default=None,
                   help="measured kernel tables (a directory of *.csv from zrt profile, or a "
                        "shipped table's name: nvidia_h200/zrt_profile) to price from first")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="write the two timelines and the tables as HTML")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.profile.diff import diff, load_measurement, predict, write_html
    from zrt_core.profile.tables import backends_with_tables

    measurement = load_measurement(args.measurement)
    host = get_plugin_manager()
    hw = host.hardware_spec(args.hw)
    backends = backends_with_tables(hw, host, args.tables)
    result = diff(measurement, predict(measurement, hw, host, backends), hw)
    if args.html:
        result["files"] = [str(write_html(result, args.html))]
    if args.json:
        print_json(result)
        return 0
    con = console()
    con.print(f"{result['model']} {result['mode']} on {hw.name}: predicted "
              f"{result['predicted_s'] * 1e3:.3f} ms, measured "
              f"{result['measured_s'] * 1e3:.3f} ms, ratio {result['end_to_end_ratio']:.3f}")
    if result["host_model"]:
        h = result["host_model"]
        where = "before each op (CPU)" if h["serial"] else "beside the device (GPU)"
        con.print(f"eager host: {h['forward_us']:.1f} / {h['backward_us']:.1f} / "
                  f"{h['infer_us']:.1f} / {h['decode_us']:.1f} µs per op and "
                  f"{h['forward_fixed_us']:.0f} / {h['backward_fixed_us']:.0f} / "
                  f"{h['infer_fixed_us']:.0f} / {h['decode_fixed_us']:.0f} µs per pass "
                  f"(training forward / backward / inference / decode), {where}")
    if result["op_ratio"] is not None:
        con.print(f"the ops' own time: predicted {result['predicted_op_s'] * 1e3:.3f} ms, "
                  f"measured (profiler) {result['measured_op_s'] * 1e3:.3f} ms, ratio "
                  f"{result['op_ratio']:.3f}; the rest of the measured step, "
                  f"{(result['measured_s'] - result['measured_op_s']) * 1e3:.3f} ms, is time "
                  "no op ran (the host issuing eager ops, Python)")

    def rows(items: list[dict[str, Any]], key: str) -> list[tuple[Any, ...]]:
        return [(r[key], f"{r['predicted_s'] * 1e3:.3f}", f"{r['measured_s'] * 1e3:.3f}",
                 "—" if r["error"] is None else f"{r['error']:+.1%}") for r in items]

    cols = ("predicted ms", "measured ms", "error")
    con.print(table("per layer", ("layer", *cols), rows(result["layers"], "index")))
    con.print(table("per sub-module", ("module", *cols), rows(result["modules"], "name")))
    con.print(table("per op category", ("category", *cols),
                    rows(result["categories"], "category")))
    if result["layer_mape"] is not None:
        con.print(f"per-layer MAPE {result['layer_mape']:.1%}")
    from zrt_core.cli.coverage_view import print_coverage

    print_coverage(con, result["coverage"])
    for f in result.get("files", []):
        con.print(f"wrote {f}")
    return 0
