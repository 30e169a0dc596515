"""zrt's size limits and pipeline-schedule rules: the checks every layer may use (no zrt imports
but errors), re-exported by :mod:`zrt_core.checks`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zrt_core.errors import LayoutError, SpecError, UnknownNameError

#: Largest value zrt accepts per kind of size, each past every published model (the
#: largest real one in the comment), so a typo or an overflow is refused up front instead
#: of priced (a 10,000,000-layer config used to run for minutes).
LIMITS: Mapping[str, int] = {
    "layers": 4_096,  # Megatron 1T: 128; DeepNet (2022): 1,000
    "width": 1 << 18,  # hidden/FFN/expert/latent widths: PaLM's FFN 73,728; Llama-3.1-405B 53,248
    "heads": 4_096,  # Megatron 1T: 160
    "head_dim": 4_096,  # Gemma: 256; MLA heads: 192
    "vocab": 1 << 22,  # Gemma 3: 262,144
    "experts": 16_384,  # Qwen3-Next: 512; Kimi K2: 384
    "tokens": 1 << 24,  # sequence, prompt or generated tokens: Llama 4 Scout's 10,485,760
    "batch": 1 << 24,  # sequences per step or micro-batch
    "degree": 1 << 20,  # a parallel degree or GPU count: the largest clusters are ~2^17
}


def check_count(value: Any, name: str, kind: str, error: type = SpecError) -> int:
    """A positive integer within :data:`LIMITS`\\[kind\\]; else ``error`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be a positive integer, got {_show(value)}",
                    f"give {name} as a whole number")
    if value < 1:
        raise error(f"{name} must be a positive integer, got {value}",
                    f"give {name} as 1 or more")
    if value > LIMITS[kind]:
        raise error(f"{name} = {_show(value)} is beyond any real run (zrt's limit for {kind} "
                    f"is {LIMITS[kind]:,})", f"give a real {name}")
    return value


def _show(value: Any) -> str:
    """A value in a message: long integers and reprs shortened to stay one readable line."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        digits = int(abs(value).bit_length() * math.log10(2)) + 1  # str() refuses 4,300+
        return f"an integer of about {digits:,} digits"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- pipeline layout rules (used by the estimators and the pipeline simulation) ---------

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe", "dualpipev")


def virtual_stages(schedule: str, pp: int, vp: int = 1) -> int:
    """How many per-stage times a schedule takes (see the module docstring)."""
    _check_name(schedule)
    if schedule == "interleaved":
        return pp * vp
    if schedule in ("zb-v", "dualpipev"):
        return 2 * pp
    return pp


def _check_name(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise UnknownNameError(f"unknown pipeline schedule {schedule!r}",
                               f"use one of {', '.join(SCHEDULES)}")


def check_schedule(schedule: str, pp: int, vp: int, microbatches: int) -> None:
    """Raise :class:`LayoutError` naming the rule when a schedule cannot run this layout."""
    _check_name(schedule)
    if pp < 1 or vp < 1 or microbatches < 1:
        raise LayoutError(f"pp={pp}, vp={vp}, microbatches={microbatches} must all be ≥ 1",
                          "give positive degrees and at least one micro-batch")
    if schedule == "interleaved":
        if vp < 2 or pp < 2:
            raise LayoutError(
                f"interleaved 1F1B needs pp ≥ 2 and vp ≥ 2 (got pp={pp}, vp={vp})",
                "use 1f1b for vp=1, or set vp to the model chunks per rank")
        if microbatches % pp:
            raise LayoutError(
                f"interleaved 1F1B needs the micro-batches ({microbatches}) to be a multiple "
                f"of pp={pp} (Megatron's rule)", "adjust the global batch or micro-batch")
        return
    if schedule in ("zb-v", "dualpipev"):
        if vp not in (1, 2):
            raise LayoutError(
                f"{schedule} always runs two chunks per rank in a V; vp={vp} is not supported",
                "use vp=1 (or 2); the model is cut into 2 × pp virtual stages")
    elif vp != 1:
        raise LayoutError(f"{schedule} does not interleave model chunks; vp={vp} needs "
                          "the interleaved schedule",
                          "set vp=1 or use the interleaved schedule")
    if schedule == "zb-h1" and microbatches < pp:
        raise LayoutError(
            f"zb-h1 needs at least pp={pp} micro-batches (got {microbatches})",
            "raise the global batch or lower pp")
    if schedule == "dualpipe" and (pp % 2 or microbatches % 2):
        raise LayoutError(
            f"dualpipe needs an even pp and an even number of micro-batches "
            f"(got pp={pp}, microbatches={microbatches})",
            "half of the micro-batches enter at each end of the pipeline")
    if schedule in ("dualpipe", "dualpipev") and microbatches < 2 * pp:
        raise LayoutError(
            f"{schedule} needs at least 2 × pp = {2 * pp} micro-batches (got {microbatches})",
            "raise the global batch or lower pp")
