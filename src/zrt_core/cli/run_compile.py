"""``zrt run --graph-mode`` / ``--compare-compile``: capture through torch.compile, and
price each phase as Inductor would fuse it beside PyTorch eager (docs/graph-mode.md)."""

from __future__ import annotations

import argparse
from typing import Any


def add_compile_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("torch.compile")
    g.add_argument("--graph-mode", action="store_true",
                   help="capture through torch.compile (AOTAutograd's aten graphs) instead "
                        "of eager dispatch")
    g.add_argument("--compare-compile", action="store_true",
                   help="also price each phase as Inductor fuses it (fused pointwise and "
                        "reduction kernels, extern GEMMs) beside one kernel per aten op, and "
                        "report the predicted gain")


def captured_for_training(args: argparse.Namespace, model: str, micro_batch: int,
                          seq_len: int, host: Any) -> Any:
    """The training capture graph mode asks for, or None (the estimator captures as usual)."""
    if not args.graph_mode and not args.compare_compile:
        return None
    from zrt_core.estimate.training import capture_for_training

    return capture_for_training(model, micro_batch, seq_len, host=host,
                                use_cache=False if args.no_cache else None,
                                graph_mode=args.graph_mode)


def captured_for(args: argparse.Namespace, model: str, input_len: int, dtype: str,
                 host: Any) -> Any:
    """The capture graph mode asks for, or None (the estimator captures as usual)."""
    if not args.graph_mode and not args.compare_compile:
        return None
    from zrt_core.estimate.captures import load_or_capture

    return load_or_capture(model, input_len, host=host, dtype=dtype,
                           use_cache=False if args.no_cache else None,
                           graph_mode=args.graph_mode)


def compare(args: argparse.Namespace, captured: Any, hw: Any, host: Any) -> list[Any]:
    if not args.compare_compile or captured is None:
        return []
    from zrt_core.capture.inductor import compare_compile

    return compare_compile([captured.graphs[p] for p in ("prefill", "decode", "train_forward",
                                                         "train_backward")
                            if p in captured.graphs], hw, host)


def print_gains(gains: list[Any]) -> None:
    from zrt_core.cli._output import console, table

    rows = [(g.phase, f"{g.eager_s * 1e3:.3f}", f"{g.inductor_s * 1e3:.3f}",
             f"{g.speedup:.2f}x", f"{g.kernels_eager:,}", f"{g.kernels_inductor:,}",
             f"{g.bytes_eager / 1e9:.2f}", f"{g.bytes_inductor / 1e9:.2f}") for g in gains]
    console().print(table(
        "torch.compile (Inductor fusion) vs eager, one device, unsharded, ops back to back",
        ("phase", "eager ms", "inductor ms", "gain", "kernels eager", "kernels inductor",
         "GB eager", "GB inductor"), rows,
        justify=("left",) + ("right",) * 7))
