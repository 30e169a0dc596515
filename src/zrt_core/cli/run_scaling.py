"""``zrt run --train --gpus 64,128,...``: the weak-scaling curve of a training layout
(:mod:`zrt_core.estimate.training.scaling`) as a table, JSON (``--json``) or files
(``--out DIR``: the largest point's report with the curve first)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from zrt_core.cli._output import console, out_dir, print_json, table
from zrt_core.errors import SpecError


def run_weak_scaling(args: argparse.Namespace, estimate: Callable[..., Any], parallel: Any,
                     train: Any) -> int:
    from zrt_core.estimate.training.scaling import scaled_layouts, weak_scaling
    from zrt_core.reports.scaling import COLUMNS

    if args.num_gpus is not None:
        raise SpecError("--gpus (a weak-scaling curve) and --num-gpus (one run's check) "
                        "cannot be combined", "drop --num-gpus")
    if getattr(args, "emit", None):
        raise SpecError("--emit writes one run's config, --gpus estimates several",
                        "drop --gpus or --emit")
    scaled_layouts(parallel, train, args.gpus)  # bad counts: one line before any estimate
    largest = args.gpus[-1]

    def one(p: Any, t: Any) -> Any:
        # only the largest point's timelines go to the files
        return estimate(p, t, num_gpus=None,
                        keep_timelines=bool(args.out) and p.world_size == largest)

    curve, reports = weak_scaling(one, parallel, train, args.gpus)
    written = []
    if args.out:
        from zrt_core.reports.scaling import write_scaling_outputs

        written = write_scaling_outputs(curve, reports, out_dir(args.out))
    if args.json:
        data: dict[str, Any] = {"weak_scaling": curve.to_json()}
        if written:
            data["files"] = [str(p) for p in written]
        print_json(data)
        return 0
    con = console()
    con.print(table(f"weak scaling: {curve.model} on {curve.hardware_id}, {curve.layout}, "
                    f"{curve.batch_per_replica} sequences per replica", COLUMNS, curve.rows()))
    if not curve.monotone:
        con.print("note: the step time falls somewhere along the curve")
    for path in written:
        con.print(f"wrote {path}")
    return 0
