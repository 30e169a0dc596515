"""``zrt capture MODEL``: record each phase's operator graph and check it against the
analytic FLOPs.

MODEL is a bundled name (``zrt models``), a directory holding ``config.json`` or the file
itself, or a HuggingFace id already in the local cache. Counts are for the whole model
(every layer). ``--out DIR`` writes the raw and fused graphs (fused with ``--platform``'s
rule packs), op tables and workbooks, fusion provenance, DOT and ONNX (see
:mod:`zrt_core.capture.export`).
"""

from __future__ import annotations

import argparse

from zrt_core.analytic.catalog import analytic_params, capture_json
from zrt_core.cli._output import (
    add_json_flag,
    console,
    positive_int,
    print_json,
    styled,
    table,
)
from zrt_core.transforms.base import PLATFORMS

CAPTURED_PHASES = ("prefill", "decode", "train_forward", "train_backward")
GAP_THRESHOLD = 0.10




def _phases(text: str) -> tuple[str, ...]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no phase given")
    for name in names:
        if name not in CAPTURED_PHASES:
            raise argparse.ArgumentTypeError(
                f"unknown phase {name!r} (choose from {', '.join(CAPTURED_PHASES)})")
    return tuple(dict.fromkeys(names))


def _imbalance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"moe imbalance must be a number, got {text!r}"
                                         ) from None
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"moe imbalance must be >= 1.0, got {value:g}")
    return value


def register(sub) -> None:
    p = sub.add_parser(
        "capture", help="capture each phase's operator graph from a model config",
        description="Build the model from its config on fake tensors (no weights, no GPU), "
        "record every operator of each phase, and compare the FLOPs with the analytic "
        "count (a gap over 10% is flagged).")
    p.add_argument("model", metavar="MODEL",
                   help="bundled name (zrt models), config.json or its directory, or a "
                        "HuggingFace id in the local cache")
    p.add_argument("--phases", type=_phases, default=CAPTURED_PHASES, metavar="LIST",
                   help="comma-separated: " + ",".join(CAPTURED_PHASES) + " (default: all)")
    p.add_argument("--batch", type=positive_int("--batch"), default=1, metavar="B",
                   help="sequences per step (default 1)")
    p.add_argument("--seq-len", type=positive_int("--seq-len"), default=2048, metavar="S",
                   help="tokens per sequence; decode attends to S cached tokens "
                        "(default 2048)")
    p.add_argument("--out", metavar="DIR",
                   help="write per phase the raw and fused graph JSON, the op workbook "
                        "<phase>.ops.xlsx, a DOT file per layer kind and ONNX (with the onnx "
                        "extra), plus ops.xlsx, the CSV op lists and fusion_rules.json here")
    p.add_argument("--platform", choices=PLATFORMS, default=None,
                   help="whose fusion rules make the fused graphs of --out (default: the "
                        "--fusion-rules pack's platform, else cuda)")
    p.add_argument("--full-depth", action="store_true",
                   help="capture every decoder layer instead of one per kind")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                   help="parameter and activation dtype (default bfloat16)")
    p.add_argument("--moe-imbalance", type=_imbalance, default=1.0, metavar="X",
                   help="busiest expert's load over the mean (default 1.0, balanced)")
    p.add_argument("--graph-mode", action="store_true",
                   help="capture through torch.compile (AOTAutograd's aten graphs) instead "
                        "of eager dispatch (docs/graph-mode.md)")
    from zrt_core.cli.run_cmd import add_fusion_rules_flag

    add_fusion_rules_flag(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from zrt_core.capture.sources import check_capture_request
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    user_pack = None
    if args.fusion_rules:  # the pack is read (and refused) before the capture
        from zrt_core.transforms.fusion.user import add_user_pack

        user_pack = add_user_pack(host, args.fusion_rules)
    # Find the config (or say how to get it) and check its numbers before paying for the
    # torch import: transformers would fill a missing hidden size with a default.
    check_capture_request(args.model, args.phases, args.seq_len, host)
    if args.out:
        from zrt_core.capture.export import prepare_out_dir

        prepare_out_dir(args.out)  # a bad --out fails now, not after the capture
    from zrt_core.capture.api import capture

    result = capture(args.model, phases=args.phases, batch=args.batch, seq_len=args.seq_len,
                     host=host, full_depth=args.full_depth, moe_imbalance=args.moe_imbalance,
                     dtype=args.dtype, graph_mode=args.graph_mode)
    from zrt_core.capture.export import export_capture, summarize

    analytic = {phase: check.analytic for phase, check in result.flops_checks.items()}
    timings = {k: float(v) for k, v in result.timings_s.items()}
    summaries = summarize(result.graphs, analytic_flops=analytic, capture_s=timings)
    exported = None
    if args.out:
        from zrt_core.transforms.fusion import fuse, packs_for_platform

        platform = args.platform
        if platform is None:  # the user pack's platform, else cuda
            platform = (user_pack.platform if user_pack is not None
                        and user_pack.platform != "generic" else "cuda")
        packs = packs_for_platform(platform, host.fusion_rules)
        fused = {phase: fuse(graph, packs) for phase, graph in result.graphs.items()}
        exported = export_capture(result, args.out, fused=fused, platform=platform)
    fusion = _fusion(result.graphs, user_pack, host) if user_pack is not None else None

    if args.json:
        data = capture_json(result, summaries, exported, timings)
        if fusion is not None:
            data["fusion"] = fusion
        print_json(data)
        return 0
    _print(result, summaries, exported, timings)
    if fusion is not None:
        _print_fusion(fusion)
    return 0


def _fusion(graphs, pack, host) -> dict:
    """Each phase fused with the user's pack ahead of the installed packs of its platform:
    nodes before and after, and the fused nodes per ``pack/rule``."""
    from zrt_core.transforms.fusion import fuse, packs_for_platform

    packs = packs_for_platform(pack.platform, host.fusion_rules)
    phases = {}
    for phase, graph in graphs.items():
        fused = fuse(graph, packs)
        phases[phase] = {"nodes_before": len(graph.nodes), "nodes_after": len(fused.nodes),
                         "fused": dict(fused.meta.get("fusion", {}).get("fused", {}))}
    return {"pack": pack.name, "source": pack.source, "platform": pack.platform,
            "packs": [p.name for p in packs], "phases": phases}


def _print_fusion(fusion: dict) -> None:
    out = console()
    rows = [(phase, f"{f['nodes_before']:,}", f"{f['nodes_after']:,}",
             ", ".join(f"{rule.split('/', 1)[1]} {n}" for rule, n in f["fused"].items()
                       if rule.startswith(fusion["pack"] + "/")))
            for phase, f in fusion["phases"].items()]
    out.print(table(f"fusion: {fusion['pack']} ({fusion['source']}) ahead of "
                    f"{', '.join(fusion['packs'][1:]) or 'no installed pack'}",
                    ("phase", "nodes", "fused", f"{fusion['pack']} rules"), rows,
                    justify=("left", "right", "right", "left")))


def _print(result, summaries, exported, timings) -> None:
    out = console()
    rows = []
    for s in summaries:
        gap = "—" if s.gap is None else f"{s.gap:+.1%}"
        if s.gap_flagged:
            gap = styled(f"{gap} !", "bold red")
        missing = ", ".join(s.missing_formulas)
        rows.append((
            s.phase, f"{s.ops:,}", _si(s.flops), _si(s.bytes, "B"),
            "—" if s.capture_s is None else f"{s.capture_s:.2f}",
            "—" if s.analytic_flops is None else _si(s.analytic_flops),
            gap, styled(missing, "yellow") if missing else "",
        ))
    o = result.options
    out.print(table(
        f"{result.model} ({result.model_type}) · batch {o.batch} · seq {o.seq_len} · "
        f"{o.dtype}" + (" · full depth" if o.full_depth else "")
        + (" · graph mode" if o.graph_mode else ""),
        ("phase", "ops", "FLOPs", "bytes", "time s", "analytic", "gap", "missing formulas"),
        rows, justify=("left", "right", "right", "right", "right", "right", "right", "left"),
    ))
    p = result.params
    analytic = analytic_params(result.config)
    differs = analytic is not None and abs(p.total - analytic["total"]) > 0.005 * p.total
    out.print(f"params {_count(p.total)} total, {_count(p.active)} active"
              + (f" (analytic {_count(analytic['total'])} total, "
                 f"{_count(analytic['active'])} active)" if differs else "")
              + f" · built in {timings.get('build', 0.0):.2f}s · {result.source}")
    if any(s.gap_flagged for s in summaries):
        out.print(styled("!", "bold red"), f"gap over {GAP_THRESHOLD:.0%} between captured "
                  "and analytic FLOPs: the graph follows HF's reference code, not a "
                  "production kernel; explain it or add a model patch")
    for warning in result.warnings:
        out.print(styled(f"note: {warning}", "dim"))
    if exported is not None:
        out.print(f"wrote {len(exported.files)} files to {exported.out_dir}")
        for note in exported.notes:
            out.print(styled(note, "dim"))


def _si(value: float, unit: str = "") -> str:
    """``5.01G``, ``1.20TB``: three significant figures with an SI prefix."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.3g}{prefix}{unit}"
    return f"{value:,.0f}{unit}"


def _count(value: float) -> str:
    """Parameter counts the way model cards write them: ``30.5B``, ``124M``."""
    for factor, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:,.3g}{suffix}"
    return f"{value:,.0f}"
