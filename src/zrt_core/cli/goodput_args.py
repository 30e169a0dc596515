"""``zrt run --train --tokens 15T`` (or ``--steps N``) and ``zrt search --objective``: the
flags of the whole-run model (docs/goodput.md), turned into a :class:`GoodputSpec`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from zrt_core.errors import ZrtError

#: flags that mean nothing without --tokens or --steps
_NEEDS_LENGTH = ("mtbf_gpu_hours", "checkpoint_every", "checkpoint_gbps", "storage_gbps",
                 "restart_min")


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ZrtError: a one-line usage error."""

    def run(text: str) -> Any:
        try:
            return parse(text)
        except ZrtError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return run


def _number(what: str, *, zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(
                f"{what} must be {'zero or more' if zero else 'positive'}, got {text!r}")
        return value

    return parse


def add_goodput_args(p: argparse.ArgumentParser, *, steps: bool = True) -> None:
    """The whole-run flags (``steps=False``: without ``--steps``, for ``zrt search``)."""
    from zrt_core.cli._output import positive_int
    from zrt_core.goodput import DEFAULT_MTBF_GPU_HOURS, DEFAULT_RESTART_S, parse_tokens

    g = p.add_argument_group("training run: time to train and goodput (docs/goodput.md)")
    g.add_argument("--tokens", type=_checked(parse_tokens), default=None, metavar="N",
                   help="train this many tokens (15T, 1.5e13, 300B): wall time, GPU-hours, "
                        "interruptions, checkpoints and goodput")
    if steps:
        g.add_argument("--steps", type=positive_int("--steps"), default=None, metavar="N",
                       help="train this many steps (instead of --tokens)")
    g.add_argument("--mtbf-gpu-hours", type=_number("--mtbf-gpu-hours"), default=None,
                   metavar="H", help="mean time between job interruptions per GPU, hours "
                   f"(default {DEFAULT_MTBF_GPU_HOURS:,.0f}: Llama 3's 419 unexpected "
                   "interruptions in 54 days on 16,384 H100)")
    g.add_argument("--checkpoint-every", type=_checked(_interval), default=None,
                   metavar="K|DURATION", help="checkpoint every K steps or every 30m, 2h... "
                   "(default: the interval that maximises goodput)")
    g.add_argument("--checkpoint-gbps", type=_number("--checkpoint-gbps"), default=None,
                   metavar="GB_S", help="GB/s one device writes to checkpoint storage "
                   "(default: the hardware pack's checkpoint_write_gb_per_s)")
    g.add_argument("--storage-gbps", type=_number("--storage-gbps"), default=None,
                   metavar="GB_S", help="GB/s the whole storage system takes (default: no "
                   "cap beyond the devices' own)")
    g.add_argument("--restart-min", type=_number("--restart-min", zero=True), default=None,
                   metavar="MIN", help="minutes from a failure to training again, before "
                   f"the checkpoint load (default {DEFAULT_RESTART_S / 60:g})")


def _interval(text: str) -> tuple[int | None, float | None]:
    from zrt_core.goodput import parse_interval

    return parse_interval(text)


def goodput_spec_from_args(args: argparse.Namespace) -> Any:
    """The :class:`GoodputSpec` the flags ask for, or None without --tokens/--steps.

    :raises SpecError: a whole-run flag without --tokens or --steps, or both of them.
    """
    from zrt_core.errors import SpecError
    from zrt_core.goodput import DEFAULT_MTBF_GPU_HOURS, DEFAULT_RESTART_S, GoodputSpec

    tokens, steps = getattr(args, "tokens", None), getattr(args, "steps", None)
    if tokens is None and steps is None:
        given = [f for f in _NEEDS_LENGTH if getattr(args, f, None) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise SpecError(f"{flag} needs the run's length",
                            "add --tokens (15T, 300B) or --steps N")
        return None
    every_steps, every_s = args.checkpoint_every or (None, None)
    restart = args.restart_min
    return GoodputSpec(
        tokens=tokens, steps=steps,
        mtbf_gpu_hours=(DEFAULT_MTBF_GPU_HOURS if args.mtbf_gpu_hours is None
                        else args.mtbf_gpu_hours),
        checkpoint_every_steps=every_steps, checkpoint_every_s=every_s,
        checkpoint_gb_per_s=args.checkpoint_gbps, storage_gb_per_s=args.storage_gbps,
        restart_s=DEFAULT_RESTART_S if restart is None else restart * 60.0)


def refuse_unused(args: argparse.Namespace) -> None:
    """``zrt run``: whole-run flags where they would be dropped silently.

    :raises SpecError: with ``--server`` (the service's estimate body has no run yet) or
        without ``--train``.
    """
    from zrt_core.errors import SpecError

    given = [f for f in ("tokens", "steps", *_NEEDS_LENGTH) if getattr(args, f, None) is not None]
    if not given:
        return
    flag = "--" + given[0].replace("_", "-")
    if args.mode != "train":
        raise SpecError(f"{flag} describes a training run", "add --train")
    if args.server:
        raise SpecError(f"{flag} is not sent to a zrt serve yet", "run it without --server")
