"""``zrt search MODEL --hw ID``: the best training (``--train``) or serving (``--infer``)
layouts of a model on a machine (:func:`zrt_core.search.search`, docs/search.md): the top-k,
the Pareto front, what each rule or the memory limit removed, and the winner's report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zrt_core.cli._output import add_json_flag, console, positive_int, print_json, table
from zrt_core.errors import SpecError


def int_list(what: str) -> Callable[[str], tuple[int, ...]]:
    """``8``, ``8,16,32`` or a doubling range ``8-64`` (8, 16, 32, 64); ``A-B:S`` steps by
    S. One line, exit 2, on anything else."""

    def parse(text: str) -> tuple[int, ...]:
        out: list[int] = []
        try:
            for part in text.split(","):
                part = part.strip()
                if "-" in part:
                    span, _, step = part.partition(":")
                    lo, hi = (int(v) for v in span.split("-", 1))
                    if lo < 1 or hi < lo or (step and int(step) < 1):
                        raise ValueError
                    value = lo
                    while value <= hi:
                        out.append(value)
                        value = value + int(step) if step else value * 2
                else:
                    out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be N, a list N,M,... or a range A-B (doubling) or A-B:STEP, "
                f"got {text!r}") from None
        if not out or min(out) < 1:
            raise argparse.ArgumentTypeError(f"{what} values must be positive, got {text!r}")
        return tuple(out)

    return parse


def name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_space_args(p: argparse.ArgumentParser) -> None:
    """The flags ``zrt search`` and ``zrt compare`` share: the mode and the space."""
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="mode", action="store_const", const="train",
                      help="search training layouts")
    mode.add_argument("--infer", dest="mode", action="store_const", const="infer",
                      help="search serving layouts (the default)")
    p.add_argument("--gpus", type=int_list("--gpus"), required=True, metavar="N",
                   help="GPU count: N, a list 8,16 or a range 8-64 (doubling)")
    g = p.add_argument_group("fixed dimensions and filters (lists: 1,2,4; ranges: 1-8)")
    for flag in ("tp", "pp", "vp", "cp", "ep", "etp", "dp"):
        g.add_argument(f"--{flag}", type=int_list(f"--{flag}"), default=None, metavar="N",
                       help=f"{flag} degrees to try (default: powers of two within bounds)"
                       + (" (serving: attention data parallel)" if flag == "dp" else ""))
    g.add_argument("--max-tp", type=positive_int("--max-tp"), default=None, metavar="N",
                   help="largest tp (default 8 for training, the GPUs for serving)")
    g.add_argument("--max-pp", type=positive_int("--max-pp"), default=None, metavar="N",
                   help="largest pp (default: the layers)")
    g.add_argument("--max-cp", type=positive_int("--max-cp"), default=None, metavar="N",
                   help="largest cp (default 8)")
    g.add_argument("--max-vp", type=positive_int("--max-vp"), default=None, metavar="N",
                   help="largest vp (default 8)")
    t = p.add_argument_group("training (--train)")
    t.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                   metavar="G", help="sequences per step (required with --train)")
    t.add_argument("--seq-len", type=positive_int("--seq-len"), default=4096, metavar="S")
    t.add_argument("--micro-batch", type=int_list("--micro-batch"), default=(1, 2, 4),
                   metavar="B", help="micro-batches to try (default 1,2,4)")
    t.add_argument("--recompute", type=name_list, default=("none", "selective", "full"),
                   metavar="LIST", help="none,selective,full,op (default the first three)")
    t.add_argument("--sharding", type=name_list, default=("zero1", "fsdp"), metavar="LIST",
                   help="zero0,zero1,zero2,zero3,fsdp (default zero1,fsdp; zero1 is "
                        "Megatron's distributed optimizer)")
    t.add_argument("--pp-schedule", type=name_list, default=("1f1b", "interleaved"),
                   metavar="LIST", help="pipeline schedules (default 1f1b,interleaved)")
    t.add_argument("--precision", type=name_list, default=("bf16",), metavar="LIST",
                   help="bf16,fp8,... (default bf16)")
    t.add_argument("--mtp", type=positive_int("--mtp"), default=None, metavar="N",
                   help="train N MTP modules on every layout, as zrt run --train --mtp N "
                        "(default none); they count in the pipeline split")
    s = p.add_argument_group("serving (--infer)")
    s.add_argument("--input-len", type=positive_int("--input-len"), default=1024, metavar="L")
    s.add_argument("--output-len", type=positive_int("--output-len"), default=256,
                   metavar="O")
    s.add_argument("--quant", type=name_list, default=("none", "fp8"), metavar="LIST",
                   help="none,fp8,fp4,int8,int4 (default none,fp8; those the hardware runs)")
    s.add_argument("--batch", default="max,1,4,16,64,256", metavar="LIST",
                   help="concurrencies to try; max = the largest that fits (default "
                        "max,1,4,16,64,256)")
    s.add_argument("--ttft-ms", type=float, default=None, metavar="MS", help="TTFT target")
    s.add_argument("--tpot-ms", type=float, default=None, metavar="MS", help="TPOT target")
    s.add_argument("--rate", type=float, default=None, metavar="REQ_S",
                   help="requests/s to sustain: the fewest GPUs that do, within the targets")
    s.add_argument("--engine", choices=("sglang", "trtllm", "vllm"), default="trtllm")
    r = p.add_argument_group("running")
    r.add_argument("--top-k", type=positive_int("--top-k"), default=10, metavar="K")
    r.add_argument("--workers", type=positive_int("--workers"), default=1, metavar="N",
                   help="local processes (default 1)")
    r.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the estimates as Ray tasks (zrt-core[ray]); no ADDRESS: a "
                        "local Ray instance")
    r.add_argument("--exact", action="store_true", default=None,
                   help="training: estimate every layout exactly (default: screen them in "
                        "closed form and estimate exactly those that can reach the top-k "
                        "or the front; docs/search.md)")
    r.add_argument("--out", metavar="DIR",
                   help="write results.csv, results.xlsx and search.html here")
    r.add_argument("--no-cache", action="store_true", help="capture again")
    r.add_argument("--objective", choices=("throughput", "goodput", "time-to-train"),
                   default="throughput",
                   help="rank training layouts by tokens/s per GPU (default), by useful "
                        "tokens/s per GPU after interruptions and checkpoints (goodput), or "
                        "by wall time to train --tokens (time-to-train); docs/goodput.md")
    from zrt_core.cli.goodput_args import add_goodput_args

    add_goodput_args(p)
    add_json_flag(p)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "search", help="the best training or serving layouts of a model on a machine",
        description="Enumerate parallel layouts and recipes, drop the invalid ones (counted "
        "by rule), estimate the rest with zrt run's estimators and rank them.")
    p.add_argument("model", metavar="MODEL", help="bundled name, config.json or directory")
    p.add_argument("--hw", required=True, metavar="ID", help="hardware id (zrt hw list)")
    add_space_args(p)
    p.add_argument("--strategies", action="store_true",
                   help="with --train: the named families (DDP, FSDP, TP, SP, PP, EP, 3D) "
                        "side by side for one GPU count instead of a search")
    p.add_argument("--emit", metavar="FRAMEWORK", default=None,
                   help="print the winner as that framework's arguments or config "
                        "(megatron, bridge, torchtitan, deepspeed, trtllm, vllm; "
                        "docs/frameworks.md) instead of the report")
    p.set_defaults(func=run, mode=None)


def _batches(text: str) -> tuple[int | None, ...]:
    out: list[int | None] = []
    for part in name_list(text):
        if part == "max":
            out.append(None)
            continue
        try:
            value = int(part)
        except ValueError:
            value = 0
        if value < 1:
            raise SpecError(f"--batch {part!r} is not a positive integer or max",
                            "write e.g. --batch max,1,8,64")
        out.append(value)
    if not out:
        raise SpecError("--batch is empty", "write e.g. --batch max,1,8,64")
    return tuple(dict.fromkeys(out))


def space_from_args(args: argparse.Namespace) -> Any:
    from zrt_core.search.space import space_from_values

    return space_from_values({**vars(args), "batch": _batches(args.batch)})


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"top_k": args.top_k, "ttft_ms": args.ttft_ms, "tpot_ms": args.tpot_ms,
            "rate": args.rate, "engine": args.engine, "workers": args.workers,
            "ray_address": args.ray, "use_cache": False if args.no_cache else None,
            **({"exact": True} if getattr(args, "exact", None) else {}),
            **_objective_options(args)}


def _objective_options(args: argparse.Namespace) -> dict[str, Any]:
    """``objective`` and ``run`` (the whole-run spec) when the flags give them."""
    from zrt_core.cli.goodput_args import goodput_spec_from_args

    run = goodput_spec_from_args(args) if hasattr(args, "tokens") else None
    out: dict[str, Any] = {}
    if getattr(args, "objective", "throughput") != "throughput":
        out["objective"] = args.objective
    if run is not None:
        out["run"] = run
    return out


def write_outputs(args: argparse.Namespace, write: Callable[[Path], Sequence[Path]],
                  data: Callable[[], dict[str, Any]]) -> list[Path] | None:
    """``--out DIR``'s files (``write(DIR)``), then with ``--json`` the data and the files
    printed: None (nothing more to print); else the files written, for :func:`print_written`."""
    from zrt_core.cli._output import out_dir

    written = list(write(out_dir(args.out))) if args.out else []
    if not args.json:
        return written
    payload = data()
    if written:
        payload["files"] = [str(p) for p in written]
    print_json(payload)
    return None


def print_written(written: Sequence[Path]) -> None:
    for path in written:
        console().print(f"wrote {path}")


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr (a terminal only); None elsewhere."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("estimating layouts", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def run(args: argparse.Namespace) -> int:
    from zrt_core.search import search

    args.mode = args.mode or "infer"
    if args.strategies:
        if args.exact:
            from zrt_core.errors import SpecError

            raise SpecError("--exact and --strategies do not go together (the families "
                            "are estimated exactly)", "drop --exact")
        return run_strategies(args)
    if args.emit is not None:
        from zrt_core.frameworks import framework_of

        framework_of(args.emit)  # an unknown name fails before the search
    space = space_from_args(args)
    with progress_bar(True) as update:
        result = search(args.model, args.hw, space, progress=update, **search_options(args))
    if args.emit is not None:
        from zrt_core.cli.run_frameworks import emit_run

        if result.winner_spec is None or result.winner_report_object is None:
            from zrt_core.errors import SpecError

            raise SpecError("no layout to emit: the search kept none",
                            "relax the filters (zrt search --help)")
        emit_run(args, result.winner_report_object, **result.winner_spec)
        return 0
    from zrt_core.search.outputs import write_search_outputs

    written = write_outputs(args, lambda d: write_search_outputs(result, d), result.to_json)
    if written is not None:
        print_search(result)
        print_written(written)
    return 0


def run_strategies(args: argparse.Namespace) -> int:
    from zrt_core.search.strategies import compare_strategies

    if args.mode != "train" or args.global_batch is None or len(args.gpus) != 1:
        raise SpecError("--strategies compares training layouts for one GPU count",
                        "use --train --gpus N --global-batch G")
    rows = compare_strategies(args.model, args.hw, args.gpus[0], args.global_batch,
                              args.seq_len, micro_batch=args.micro_batch[0],
                              recompute=args.recompute[0], precision=args.precision[0],
                              use_cache=False if args.no_cache else None)
    from zrt_core.search.outputs import write_strategy_outputs

    written = write_outputs(args, lambda d: write_strategy_outputs(
        rows, d, f"zrt search --strategies: {args.model}"), lambda: {"strategies": rows})
    if written is None:
        return 0
    body = []
    for r in rows:
        if "error" in r:
            body.append((r["strategy"], r["error"], "", "", "", "", ""))
            continue
        layout = (f"tp{r['tp']} pp{r['pp']} ep{r['ep']} dp{r['dp']}"
                  f"{' sp' if r.get('sp') else ''} {r['sharding']}")
        body.append((r["strategy"], layout, _f(r["step_time_s"]),
                     _f(r["tokens_per_s_per_gpu"]), _f(r["mfu"]), _f(r["memory_gib"]),
                     "yes" if r["fits"] else "no"))
    con = console()
    con.print(table(f"parallelism families on {args.gpus[0]} × {args.hw}",
                    ("family", "layout", "step s", "tok/s/GPU", "MFU", "GiB/dev", "fits"),
                    body))
    print_written(written)
    return 0


def _f(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.{digits}g}"
    return str(value)


TRAIN_COLUMNS = (("gpus", "GPUs"), ("tp", "tp"), ("pp", "pp"), ("vp", "vp"), ("cp", "cp"),
                 ("ep", "ep"), ("dp", "dp"), ("micro_batch", "mb"), ("recompute", "recompute"),
                 ("sharding", "sharding"), ("pp_schedule", "schedule"),
                 ("precision", "precision"), ("step_time_s", "step s"),
                 ("tokens_per_s_per_gpu", "tok/s/GPU"), ("mfu", "MFU"),
                 ("memory_gib", "GiB/dev"))
SERVE_COLUMNS = (("gpus", "GPUs"), ("tp", "tp"), ("ep", "ep"), ("dp", "dp"),
                 ("quant", "quant"), ("batch", "batch"), ("ttft_ms", "TTFT ms"),
                 ("tpot_ms", "TPOT ms"), ("output_tokens_per_s_per_gpu", "out tok/s/GPU"),
                 ("tokens_per_s_per_user", "tok/s/user"), ("requests_per_s", "req/s"),
                 ("memory_gib", "GiB/dev"))


def _rows_table(title: str, rows: list[dict[str, Any]], cols: tuple[tuple[str, str], ...],
                rank: bool = True) -> Any:
    head = (("#",) if rank else ()) + tuple(label for _, label in cols)
    body = [((str(i + 1),) if rank else ()) + tuple(_f(r.get(k)) for k, _ in cols)
            for i, r in enumerate(rows)]
    return table(title, head, body, justify=("right",) * len(head))


def print_search(result: Any) -> None:
    con = console()
    train = result.mode == "train"
    cols = TRAIN_COLUMNS if train else SERVE_COLUMNS
    if train and any("goodput" in r for r in result.rows):
        cols = (*cols, ("goodput", "goodput"), ("wall_days", "days"))
    con.print(f"{result.model} on {result.hardware}: {result.enumerated:,} layouts "
              f"enumerated, {result.evaluated:,} estimated in {result.elapsed_s:.1f} s"
              + (" (interrupted: partial results)" if result.partial else "")
              + (f"; {result.extra['screened']:,} screened in closed form, "
                 f"{result.extra['estimated_exactly']:,} estimated exactly"
                 if result.extra.get("screened") else ""))
    if result.rejected:
        con.print(table("removed", ("rule or limit", "layouts"),
                        sorted(result.rejected.items(), key=lambda kv: -kv[1]),
                        justify=("left", "right")))
    else:
        con.print("removed: none (every enumerated layout is valid and fits)")
    top = [result.rows[i] for i in result.ranking[:result.top_k]]
    what = "tokens/s per GPU" if train else "output tokens/s per GPU within the targets"
    what = {"goodput": "useful tokens/s per GPU (goodput)",
            "time-to-train": "time to train"}.get(result.extra.get("objective", ""), what)
    con.print(_rows_table(f"top {len(top)} by {what}", top, cols))
    front = [result.rows[i] for i in result.pareto]
    con.print(_rows_table("Pareto front: " + ("tokens/s per GPU against memory per device"
                                              if train else "output tokens/s per GPU "
                                              "against tokens/s per user"),
                          front, cols, rank=False))
    if result.gpus_front:
        con.print(_rows_table("step time against GPU count (best per count)",
                              [result.rows[i] for i in result.gpus_front], cols, rank=False))
    rate = result.extra.get("rate")
    if rate:
        r = rate["layout"]
        con.print(f"{rate['requests_per_s']:g} requests/s: {rate['gpus']} GPUs, "
                  f"{rate['replicas']} replica(s) of tp {r['tp']} × ep {r['ep']} × dp "
                  f"{r['dp']} {r['quant']} batch {r['batch']}")
    elif "rate" in result.extra:
        con.print("no layout meets the targets, so no GPU count sustains the rate")
    split = result.extra.get("disaggregated")
    if split:
        p, d = split["prefill"], split["decode"]
        con.print(f"disaggregated: {split['prefill_workers']} prefill × (tp {p['tp']} dp "
                  f"{p['dp']} {p['quant']} batch {p['batch']}) + {split['decode_workers']} "
                  f"decode × (tp {d['tp']} dp {d['dp']} {d['quant']} batch {d['batch']}) on "
                  f"{split['gpus']} GPUs: {split['output_tokens_per_s_per_gpu']:,.1f} output "
                  f"tokens/s per GPU, TTFT {split['ttft_ms']:.1f} ms (KV transfer "
                  f"{split['kv_transfer_ms']:.2f} ms), TPOT {split['tpot_ms']:.2f} ms"
                  + (f"; {result.extra['disaggregated_over_aggregated']:.2f}× the best "
                     "aggregated layout" if "disaggregated_over_aggregated" in result.extra
                     else ""))
    for note in result.extra.get("notes", ()):
        con.print(f"note: {note}")
    report = result.winner_report_object
    if report is not None:
        con.print("the winner's report:")
        if train:
            from zrt_core.reports.training import render

            render(report, con)
        else:
            from zrt_core.reports.inference import summary_rows

            con.print(table("zrt run --infer", ("", ""), summary_rows(report)))
