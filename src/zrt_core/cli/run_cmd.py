"""``zrt run MODEL --hw ID``: predict serving (``--infer``, the default) or training
(``--train``) of a model on a machine and a parallel layout.

Flags every mode shares (the layout, ``--out``, ``--json``) are added here; each mode adds
its own argument group and its runner through :data:`MODES` (``infer`` here; training
registers ``train`` — see :func:`add_mode`). With ``--out DIR`` the run writes
``report.html`` (self-contained), ``report.json`` and ``trace.json`` (Chrome/Perfetto).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zrt_core.cli._output import add_json_flag, console, out_dir, positive_int, print_json, table
from zrt_core.errors import ZrtError

#: mode -> (add its argument group to the parser, run it with the parsed args)
MODES: dict[str, tuple[Callable[[argparse.ArgumentParser], None],
                       Callable[[argparse.Namespace], int]]] = {}
DEFAULT_MODE = "infer"


def add_mode(name: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], int]) -> None:
    """Register a mode of ``zrt run`` (``--NAME`` selects it)."""
    MODES[name] = (add_arguments, run)




def add_parallel_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel layout")
    for flag, what in (("--tp", "tensor parallel"), ("--pp", "pipeline stages"),
                       ("--vp", "virtual stages per pipeline rank"),
                       ("--cp", "context parallel"), ("--ep", "expert parallel"),
                       ("--dp", "data-parallel replicas")):
        g.add_argument(flag, type=positive_int(flag), default=1, metavar="N",
                       help=f"{what} degree (default 1)")
    g.add_argument("--etp", type=positive_int("--etp"), default=None, metavar="N",
                   help="tensor parallel inside each expert (default: --tp when training; "
                        "tp × dp / ep when serving, as TensorRT-LLM, SGLang and vLLM "
                        "carve experts out of the attention ranks)")
    g.add_argument("--cp-kind", choices=("ring", "ulysses"), default="ring",
                   help="context parallel attention (default ring)")
    g.add_argument("--ep-dispatcher", choices=("alltoall", "deepep", "hybridep"),
                   default="alltoall",
                   help="MoE token dispatch over the EP group: alltoall (Megatron's default, "
                        "a row per token and expert), deepep or hybridep (a token once per "
                        "destination GPU and node) (default alltoall)")
    sp = g.add_mutually_exclusive_group()
    sp.add_argument("--sp", dest="sp", action="store_const", const=True, default=None,
                    help="sequence parallelism (default: off for serving, on for training)")
    sp.add_argument("--no-sp", dest="sp", action="store_const", const=False)
    from zrt_core.cli.moe_args import add_moe_args

    add_moe_args(g)


def add_infer_args(p: argparse.ArgumentParser) -> None:
    from zrt_core.estimate.engine import ENGINES
    from zrt_core.strategy import QUANT

    g = p.add_argument_group("inference (--infer)")
    g.add_argument("--batch", type=positive_int("--batch"), default=None, metavar="B",
                   help="a static batch of B prompts prefilled together, then decoded "
                        "together (a latency benchmark; default: in-flight batching, "
                        "offline max-throughput as trtllm-bench runs it)")
    g.add_argument("--concurrency", type=positive_int("--concurrency"), default=None,
                   metavar="N", help="closed-loop clients keeping N requests in flight on "
                        "in-flight batching (benchmark_serving/bench_serving "
                        "--max-concurrency, genai-perf --concurrency): throughput, TTFT and "
                        "TPOT of that steady state; not with --batch")
    g.add_argument("--num-requests", type=positive_int("--num-requests"), default=None,
                   metavar="N", help="offline max-throughput over a set of N requests queued "
                        "at once, ramp-up and drain included (trtllm-bench's dataset size; "
                        "default: the steady state)")
    g.add_argument("--input-len", type=positive_int("--input-len"), default=1024,
                   metavar="L", help="prompt tokens (default 1024)")
    g.add_argument("--output-len", type=positive_int("--output-len"), default=256,
                   metavar="O", help="generated tokens (default 256)")
    g.add_argument("--quant", choices=QUANT, default="none",
                   help="int8/int4 weight-only, fp8 (W8A8) or fp4 (NVFP4 W4A4)")
    g.add_argument("--kv-dtype", default=None, metavar="DTYPE",
                   help="KV-cache dtype: fp8, bf16... (default: fp8 with --quant fp8/fp4, "
                        "else the activation dtype)")
    g.add_argument("--engine", choices=sorted(ENGINES), default="trtllm",
                   help="serving engine whose memory and batching rules apply "
                        "(default trtllm)")
    from zrt_core.cli.moe_args import add_mtp_args

    add_mtp_args(p)


#: modules that register further modes with :func:`add_mode` when imported, loaded by name
#: in :func:`register` (the training mode imports this module's helpers: no import cycle)
MODE_MODULES = ("zrt_core.cli.run_train",)


def register(sub: Any) -> None:
    for module_name in MODE_MODULES:
        importlib.import_module(module_name)
    p = sub.add_parser(
        "run", help="predict serving (default) or training of a model on a machine",
        description="Capture the model from its config, shard it over the layout, price "
        "every kernel on the hardware and schedule it: TTFT, TPOT, throughput, memory per "
        "device and where the time goes.")
    p.add_argument("model", metavar="MODEL",
                   help="bundled name (zrt models), config.json or its directory, or a "
                        "HuggingFace id in the local cache")
    p.add_argument("--hw", required=True, metavar="ID",
                   help="hardware id (zrt hw list) or a pack YAML (zrt calibrate -o FILE.yaml)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--infer", dest="mode", action="store_const", const="infer",
                      help="predict serving (the default)")
    mode.add_argument("--train", dest="mode", action="store_const", const="train",
                      help="predict one training step")
    add_parallel_args(p)
    for name, (add_arguments, _run) in MODES.items():
        del name
        add_arguments(p)
    from zrt_core.cli.run_frameworks import add_framework_args

    add_framework_args(p)
    from zrt_core.cli.run_compile import add_compile_args

    add_compile_args(p)
    p.add_argument("--out", metavar="DIR",
                   help="write report.html, report.json and trace.json here")
    p.add_argument("--tables", metavar="DIR|NAME", default=None,
                   help="measured kernel tables (a directory of *.csv from zrt profile, or a "
                        "shipped table's name) to price from first; "
                        "the report says what share they priced and the biggest misses")
    add_fusion_rules_flag(p)
    p.add_argument("--no-cache", action="store_true",
                   help="capture again instead of using the capture cache")
    p.add_argument("--server", metavar="URL", help="compute on a `zrt serve` at URL "
                   "(prints JSON; token from $ZRT_TOKEN; docs/serve.md)")
    add_json_flag(p)
    p.set_defaults(func=run, mode=None)


def add_fusion_rules_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fusion-rules", metavar="FILE", default=None,
                   help="a fusion-rule pack YAML applied ahead of the installed packs "
                        "(zrt fusion discover drafts one; docs/fusion.md)")


def use_fusion_rules(host: Any, args: argparse.Namespace) -> None:
    """``--fusion-rules FILE``: the user's pack into ``host``, ahead of the installed ones."""
    if getattr(args, "fusion_rules", None):
        from zrt_core.transforms.fusion.user import add_user_pack

        add_user_pack(host, args.fusion_rules)


def run(args: argparse.Namespace) -> int:
    from zrt_core.cli.run_frameworks import apply_from

    apply_from(args)
    from zrt_core.cli.goodput_args import refuse_unused

    refuse_unused(args)
    if args.server:
        if args.fusion_rules:
            raise ZrtError("--fusion-rules is not sent to a zrt serve",
                           "run it without --server")
        from zrt_core.cli.serve_cmd import run_remote

        return run_remote(args)
    mode = args.mode or DEFAULT_MODE
    entry = MODES.get(mode)
    if entry is None:
        raise ZrtError(f"zrt run --{mode} is not available in this zrt",
                       f"use one of {', '.join('--' + m for m in MODES)}")
    return entry[1](args)


def parallel_from_args(args: argparse.Namespace) -> Any:
    from zrt_core.cli.moe_args import moe_load_from_args
    from zrt_core.strategy import Parallel

    return Parallel(tp=args.tp, pp=args.pp, vp=args.vp, cp=args.cp, ep=args.ep,
                    etp=args.etp, dp=args.dp, sp=args.sp, cp_kind=args.cp_kind,
                    ep_dispatcher=args.ep_dispatcher, moe_load=moe_load_from_args(args))


def run_infer(args: argparse.Namespace) -> int:
    from zrt_core.capture.sources import raw_config
    from zrt_core.checks import check_infer_request
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import InferSpec

    host = get_plugin_manager()
    use_fusion_rules(host, args)
    hw = host.hardware_spec(args.hw)
    held: frozenset[str] = frozenset()  # the dtypes the --tables rows hold
    if args.tables:
        from zrt_core.profile.tables import register_tables

        held = register_tables(host, args.tables, hw)
    kv = args.kv_dtype
    if kv is None and args.quant in ("fp8", "fp4"):
        kv = "fp8"
    infer = InferSpec(input_len=args.input_len, output_len=args.output_len,
                      batch=args.batch, quant=args.quant, kv_dtype=kv,
                      num_requests=getattr(args, "num_requests", None),
                      concurrency=getattr(args, "concurrency", None),
                      dtype=getattr(args, "dtype", None) or "bfloat16",
                      shared_expert_overlap=bool(getattr(args, "moe_shared_expert_overlap",
                                                         False)))
    parallel = parallel_from_args(args)
    # the config's numbers and the layout, before the estimator (and torch) is imported
    config, where = raw_config(args.model, host)
    check_infer_request(config, parallel, infer, where=where)
    from zrt_core.cli import run_compile
    from zrt_core.estimate import estimate_inference

    captured = run_compile.captured_for(args, args.model, infer.input_len, infer.dtype, host)
    report = estimate_inference(args.model, hw, parallel, infer, host=host,
                                engine=args.engine, captured=captured,
                                use_cache=False if args.no_cache else None)
    if args.mtp is not None or args.mtp_acceptance is not None:
        from zrt_core.cli.moe_args import serve_with_mtp

        report = serve_with_mtp(args, report, config, hw, parallel, infer, host)
    gains = run_compile.compare(args, captured, hw, host)
    written = write_outputs(report, args.out) if args.out else []
    from zrt_core.cli.run_frameworks import emit_run

    if emit_run(args, report, parallel=parallel, infer=infer, engine=args.engine):
        return 0
    if args.json:
        data = report.to_json()
        if written:
            data["files"] = [str(p) for p in written]
        if gains:
            data["compare_compile"] = [g.to_json() for g in gains]
        print_json(data)
    else:
        print_report(report, written)
        if gains:
            run_compile.print_gains(gains)
        if args.tables:
            from zrt_core.cli._output import console
            from zrt_core.cli.coverage_view import print_coverage

            for phase in (report.prefill, report.decode):
                console().print(f"{phase.phase}:")
                print_coverage(console(), dict(phase.price_coverage), held)
    return 0


def write_outputs(report: Any, out: str) -> list[Path]:
    """``report.html``, ``report.json`` and ``trace.json`` in ``out``."""
    from zrt_core.reports.files import write_inference_outputs

    return write_inference_outputs(report, out_dir(out))


def print_report(report: Any, written: list[Path]) -> None:
    from zrt_core.reports.inference import summary_rows

    con = console()
    con.print(table("zrt run --infer", ("", ""), summary_rows(report)))
    phases = [p for p in (report.prefill, report.decode) if p is not None]
    if phases:
        cats = sorted({k for p in phases for k in p.by_category_s},
                      key=lambda k: -sum(p.by_category_s.get(k, 0) for p in phases))
        rows = [(c, *(f"{p.by_category_s.get(c, 0.0) * 1e3:.3f}" for p in phases))
                for c in cats if any(p.by_category_s.get(c, 0.0) > 0 for p in phases)]
        rows.append(("total", *(f"{p.time_s * 1e3:.3f}" for p in phases)))
        con.print(table("time per step by op category (ms)",
                        ("category", *(f"{p.phase} (batch {p.batch})" for p in phases)),
                        rows, justify=("left",) + ("right",) * len(phases)))
        kinds = sorted({k for p in phases for k in p.per_layer_s})
        rows = [(k, str(phases[0].layer_counts.get(k, "")),
                 *(f"{p.per_layer_s.get(k, 0.0) * 1e3:.4f}" for p in phases)) for k in kinds]
        con.print(table("time per layer (ms)", ("layer kind", "layers",
                                                *(p.phase for p in phases)), rows,
                        justify=("left", "right") + ("right",) * len(phases)))
    for note in report.notes:
        con.print(f"note: {note}")
    for path in written:
        con.print(f"wrote {path}")


add_mode("infer", add_infer_args, run_infer)
