"""``zrt estimate --config FILE.yaml``: one training or serving estimate described in a file
(a model — name, config or model numbers —, a hardware id, a layout and a workload; see
docs/estimate.md), through the analytic front-end unless the file asks for the capture.

Prints the same tables as ``zrt run`` (``--json`` for the report as JSON, ``--out DIR`` for
``report.html``, ``report.json`` and ``trace.json``).
"""

from __future__ import annotations

import argparse
from typing import Any

from zrt_core.cli._output import add_json_flag, console, print_json
from zrt_core.estimate.from_spec import estimate_from_spec


def register(sub: Any) -> None:
    p = sub.add_parser("estimate", help="estimate a training step or serving from a YAML "
                       "spec (model numbers, hardware, layout, workload)",
                       description="One training or serving estimate described in a YAML file: a "
                       "model (bundled name, path, config or model numbers), a hardware id, a "
                       "parallel layout and a train or infer workload (docs/estimate.md). The "
                       "graphs come from the analytic front-end unless the file asks for the "
                       "capture.")
    p.add_argument("--config", required=True, metavar="FILE",
                   help="the estimate spec (docs/estimate.md; examples/*.yaml)")
    p.add_argument("--frontend", choices=("analytic", "capture"), default=None,
                   help="override the file's front-end (default: analytic)")
    p.add_argument("--out", metavar="DIR", help="write report.html, report.json and "
                   "trace.json here")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attrs import evolve

    from zrt_core.analytic.spec import EstimateSpec
    from zrt_core.plugins import get_plugin_manager

    spec = EstimateSpec.from_yaml(args.config)
    if args.frontend:
        spec = evolve(spec, frontend=args.frontend)
    host = get_plugin_manager()
    hw = host.hardware_spec(spec.hardware)
    report = estimate(spec, host, hw, keep_timelines=bool(args.out))
    written = []
    if spec.workload == "train":
        if args.out:
            from zrt_core.cli.run_train import write_training_outputs

            written = write_training_outputs(report, args.out)
    elif args.out:
        from zrt_core.cli.run_cmd import write_outputs

        written = write_outputs(report, args.out)
    if args.json:
        data = {"spec": spec.to_json(), **report.to_json()}
        if written:
            data["files"] = [str(p) for p in written]
        print_json(data)
        return 0
    con = console()
    con.print(f"{spec.model_label} on {hw.name} ({spec.parallel.describe()}), "
              f"{spec.frontend} front-end")
    if spec.workload == "train":
        from zrt_core.reports.training import render

        render(report, con)
        for path in written:
            con.print(f"wrote {path}")
    else:
        from zrt_core.cli.run_cmd import print_report

        print_report(report, written)
    return 0


#: the library function (zrt_core.estimate.from_spec), under the name this module gave it
estimate = estimate_from_spec
