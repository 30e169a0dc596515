"""Weak scaling: the same layout and per-replica batch at several GPU counts, the data-parallel
degree growing with the GPUs (``zrt run --train --gpus 64,128,...``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from attrs import evolve

from zrt_core.errors import LayoutError
from zrt_core.reports.scaling import ScalingPoint, WeakScaling

if TYPE_CHECKING:
    from zrt_core.reports.training import TrainingReport
    from zrt_core.strategy import Parallel, TrainSpec


def scaled_layouts(parallel: Parallel, train: TrainSpec, gpus: Sequence[int]
                   ) -> list[tuple[Parallel, TrainSpec]]:
    """One (layout, workload) per GPU count: ``dp = gpus / (tp × cp × pp)`` and the global
    batch ``dp ×`` the base run's sequences per replica (``global_batch / dp``), so every GPU
    runs the same micro-batches.

    :raises LayoutError: a count that ``tp × cp × pp`` does not divide; an empty or
        unsorted list.
    """
    if not gpus:
        raise LayoutError("--gpus lists no GPU count", "e.g. --gpus 64,128,256")
    if list(gpus) != sorted(set(gpus)):
        raise LayoutError(f"--gpus must list distinct counts in increasing order, got "
                          f"{','.join(map(str, gpus))}", "e.g. --gpus 64-16384 (doubling)")
    model_parallel = parallel.tp * parallel.cp * parallel.pp
    if train.global_batch % parallel.dp:
        raise LayoutError(f"global batch {train.global_batch} is not a multiple of "
                          f"dp={parallel.dp}", "give a global batch divisible by dp")
    per_replica = train.global_batch // parallel.dp
    out = []
    for n in gpus:
        if n % model_parallel:
            raise LayoutError(
                f"{n} GPUs is not a multiple of tp × cp × pp = {parallel.tp} × {parallel.cp} "
                f"× {parallel.pp} = {model_parallel}",
                f"give GPU counts that are multiples of {model_parallel}")
        dp = n // model_parallel
        out.append((evolve(parallel, dp=dp),
                    evolve(train, global_batch=per_replica * dp)))
    return out


def weak_scaling(estimate: Callable[[Parallel, TrainSpec], TrainingReport],
                 parallel: Parallel, train: TrainSpec, gpus: Sequence[int]
                 ) -> tuple[WeakScaling, list[TrainingReport]]:
    """Estimate every point of the curve with ``estimate`` (the caller's
    :func:`~zrt_core.estimate.training.estimate_training` with its options); returns the
    curve and the reports, smallest first."""
    reports = [estimate(p, t) for p, t in scaled_layouts(parallel, train, gpus)]
    first = reports[0]
    layout = "-".join(f"{k}{v}" for k, v in (("tp", parallel.tp), ("cp", parallel.cp),
                                             ("pp", parallel.pp)) if v > 1) or "dp only"
    curve = WeakScaling(model=first.model, hardware_id=first.hardware_id, layout=layout,
                        batch_per_replica=train.global_batch // parallel.dp,
                        points=tuple(ScalingPoint.of(r) for r in reports))
    return curve, reports
