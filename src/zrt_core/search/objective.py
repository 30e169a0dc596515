"""What a training search ranks by: tokens/s per GPU (``throughput``, the default), useful
tokens/s per GPU once interruptions and checkpoints are paid (``goodput``), or the wall time
to train the token budget (``time-to-train``), from the whole-run model of
:mod:`zrt_core.goodput` applied to each row."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from zrt_core.errors import SpecError

OBJECTIVES = ("throughput", "goodput", "time-to-train")


def check_objective(objective: str, run: Any, train: bool, hw: Any) -> None:
    """Before the search: :raises SpecError: an unknown objective, one that needs the run it
    was not given, or a run without a checkpoint bandwidth."""
    if objective not in OBJECTIVES:
        raise SpecError(f"unknown objective {objective!r}", f"use one of {', '.join(OBJECTIVES)}")
    if objective != "throughput" and (run is None or not train):
        raise SpecError(f"--objective {objective} ranks training runs by their length",
                        "add --train and --tokens (15T, 300B) or --steps N")
    if run is not None and not train:
        raise SpecError("--tokens and --steps describe a training run", "add --train")
    if run is not None:
        from zrt_core.estimate.goodput import checkpoint_gb_per_s

        checkpoint_gb_per_s(hw, run)


def add_goodput(rows: Sequence[dict[str, Any]], hw: Any, run: Any, global_batch: int,
                seq_len: int) -> None:
    """Add ``goodput``, ``goodput_tokens_per_s_per_gpu``, ``wall_days``, ``gpu_hours`` and
    ``checkpoint_every_steps`` to every row with a step time (in place)."""
    from zrt_core.estimate.goodput import checkpoint_gb_per_s
    from zrt_core.goodput import goodput

    bandwidth = checkpoint_gb_per_s(hw, run)
    for row in rows:
        if not row.get("step_time_s") or not row.get("checkpoint_bytes"):
            continue
        try:
            g = goodput(run, step_time_s=row["step_time_s"],
                        tokens_per_step=global_batch * seq_len, num_gpus=row["gpus"],
                        checkpoint_bytes=row["checkpoint_bytes"],
                        checkpoint_bytes_per_device=row["checkpoint_bytes_per_device"],
                        device_gb_per_s=bandwidth)
        except SpecError as exc:  # a layout whose run never finishes: last, with the reason
            row.update({"goodput": 0.0, "goodput_tokens_per_s_per_gpu": 0.0,
                        "wall_days": None, "run_error": exc.message})
            continue
        row.update({"goodput": g.goodput,
                    "goodput_tokens_per_s_per_gpu": row["tokens_per_s_per_gpu"] * g.goodput,
                    "wall_days": g.wall_s / 86400.0, "gpu_hours": g.gpu_hours,
                    "interruptions": g.interruptions,
                    "checkpoint_every_steps": g.checkpoint_every_steps})


def rank_key(objective: str, rows: Sequence[dict[str, Any]]) -> Callable[[int], tuple[Any, ...]]:
    """The sort key of row indices, best first (ties: the enumeration order)."""
    if objective == "goodput":
        return lambda i: (-rows[i].get("goodput_tokens_per_s_per_gpu", 0.0), i)
    if objective == "time-to-train":
        return lambda i: (rows[i].get("wall_days") or math.inf, i)
    return lambda i: (-rows[i]["tokens_per_s_per_gpu"], i)
