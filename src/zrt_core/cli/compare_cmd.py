"""``zrt compare MODEL --hw h100,h200,...``: the best layout of a model on each machine,
throughput normalised to the first, energy per token and cost (:func:`zrt_core.compare`)."""

from __future__ import annotations

import argparse
from typing import Any

from zrt_core.cli._output import console, table
from zrt_core.cli.search_cmd import (
    _f,
    add_space_args,
    print_written,
    search_options,
    space_from_args,
    write_outputs,
)
from zrt_core.errors import SpecError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compare", help="the best machine for a model: each machine's best layout side by side",
        description="Search the same space on each hardware and compare the winners: "
        "throughput per GPU normalised to the first, joules per token from the board power, "
        "USD per million tokens (and per step) from --price or the pack's price.")
    p.add_argument("model", metavar="MODEL", help="bundled name, config.json or directory")
    hw = p.add_mutually_exclusive_group(required=True)
    hw.add_argument("--hw", metavar="IDS", help="hardware ids, comma-separated; the first is "
                    "the baseline")
    hw.add_argument("--groups", metavar="YAML", help="a YAML file with comparison_hw_groups: "
                    "{group: [ids]} (the first of each group is its baseline)")
    p.add_argument("--price", metavar="ID=USD,...", default=None,
                   help="price per GPU-hour, e.g. h100=2.5,h200=3.2 (default: the pack's)")
    add_space_args(p)
    p.set_defaults(func=run, mode=None)


def run(args: argparse.Namespace) -> int:
    from zrt_core.search import compare, load_groups, parse_prices

    args.mode = args.mode or "infer"
    if args.groups:
        hardware: Any = load_groups(args.groups)
        ids = [h for hs in hardware.values() for h in hs]
    else:
        ids = [h.strip() for h in args.hw.split(",") if h.strip()]
        if not ids:
            raise SpecError("--hw names no hardware", "write e.g. --hw h100,h200")
        hardware = ids
    prices = parse_prices(args.price, ids)
    space = space_from_args(args)
    con = console()
    options = search_options(args)
    result = compare(args.model, hardware, space, prices=prices,
                     progress=None if args.json else (lambda h: con.print(f"searching {h}…")),
                     **options)
    from zrt_core.search.outputs import write_compare_outputs

    written = write_outputs(args, lambda d: write_compare_outputs(result, d), result.to_json)
    if written is None:
        return 0
    train = result.mode == "train"
    per_gpu = "tokens_per_s_per_gpu" if train else "output_tokens_per_s_per_gpu"
    head = ("group", "hardware", "best layout", "tok/s/GPU", "× first", "J/token",
            "$/GPU-h", "$/M tokens") + (("$/step",) if train else ("TTFT ms", "TPOT ms"))
    rows = []
    for r in result.results:
        if "error" in r:
            rows.append((r["group"] or "", r["hardware"], r["error"], *[""] * (len(head) - 3)))
            continue
        tail = ((_f(r.get("usd_per_step")),) if train
                else (_f(r.get("ttft_ms")), _f(r.get("tpot_ms"))))
        rows.append((r["group"] or "", r["hardware"], r["layout"], _f(r[per_gpu]),
                     _f(r["normalised_throughput"], 3), _f(r["joules_per_token"]),
                     _f(r["price_per_gpu_hour_usd"]), _f(r["usd_per_million_tokens"]),
                     *tail))
    if not any(r.get("group") for r in result.results):  # a plain --hw list: no groups
        head, rows = head[1:], [row[1:] for row in rows]
    con.print(table(f"zrt compare: {result.model}", head, rows))
    print_written(written)
    return 0
