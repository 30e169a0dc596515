"""Expert parallelism as a transform of its own (experts split over ``ep`` ranks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.transforms.parallel.transform import ParallelTransform

if TYPE_CHECKING:
    pass


class ExpertParallel(ParallelTransform):
    """EP alone (experts split over ``ep`` ranks, expert TP ``etp``)."""

    name = "ep"
