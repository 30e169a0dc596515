"""The goodput of a whole training run from one estimated step: the step time, the GPU
count and the checkpoint size of a :class:`TrainingReport`, the checkpoint bandwidth of the
hardware pack (or the spec's), through the model of :mod:`zrt_core.goodput`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zrt_core.errors import SpecError
from zrt_core.goodput import Goodput, GoodputSpec, goodput

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.reports.training import TrainingReport


def checkpoint_gb_per_s(hw: HardwareSpec, spec: GoodputSpec) -> float:
    """The spec's per-device checkpoint bandwidth, else the pack's.

    :raises SpecError: neither gives one.
    """
    value = spec.checkpoint_gb_per_s or hw.checkpoint_write_gb_per_s
    if value is None:
        raise SpecError(f"{hw.id} has no checkpoint write bandwidth (checkpoint_write_gb_per_s "
                        "in its pack)", "give --checkpoint-gbps (GB/s one device writes)")
    return value


def training_goodput(report: TrainingReport, hw: HardwareSpec, spec: GoodputSpec) -> Goodput:
    """The run of ``spec`` at the report's step time, on its GPUs, checkpointing its model
    state (:attr:`TrainingReport.checkpoint_bytes`)."""
    return goodput(spec, step_time_s=report.step_time_s,
                   tokens_per_step=report.train.global_batch * report.train.seq_len,
                   num_gpus=report.num_gpus, checkpoint_bytes=report.checkpoint_bytes,
                   checkpoint_bytes_per_device=report.checkpoint_bytes_per_device,
                   device_gb_per_s=checkpoint_gb_per_s(hw, spec))
