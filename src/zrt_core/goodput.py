"""Goodput and time to train: the wall time of a whole training run with interruptions,
restarts and checkpoints, the share of it that is useful work, and the checkpoint interval
that maximises that share (docs/goodput.md has the derivations and the sources).

The model (exponential failures, a synchronous job that restarts from its last checkpoint):

* ``N`` GPUs, each failing (with whatever else takes the job down: hosts, links, software)
  once per ``mtbf_gpu_hours`` on average, so the job is interrupted at the rate
  ``λ = N / (mtbf_gpu_hours × 3600)`` per second; the system MTBF is ``M = 1 / λ``.
* ``W`` useful seconds (steps × step time) in segments of ``τ`` (checkpoint every ``k``
  steps: ``τ = k × step time``), each followed by a blocking checkpoint write of ``C``
  seconds; a segment and its checkpoint, ``s = τ + C``, is lost whole when a failure
  strikes inside it, and the job then spends ``R`` (restart: detection, rescheduling,
  initialisation, checkpoint load) before retrying it.
* A segment is retried until it runs ``s`` seconds without a failure: the failed tries
  before success are geometric, ``E[failures] = e^{λs} − 1``, and each costs
  ``R + E[time to the failure | failure < s]``; summed, ``E[segment] = (e^{λs} − 1)(1/λ + R)``
  (the standard renewal result; Daly 2006, eq. 13 without failures during the restart).
* ``T = (W / τ) (e^{λs} − 1)(1/λ + R)``; goodput ``= W / T``. ``T`` splits exactly into
  ``W`` + checkpoints ``(W/τ) C`` + restarts ``F R`` + recomputation (the rest: work and
  checkpoints lost since the last checkpoint, ≈ ``F s / 2`` when ``λs ≪ 1``), with
  ``F = (W/τ)(e^{λs} − 1)`` the expected interruptions.

The interval that maximises goodput minimises ``(e^{λ(τ+C)} − 1) / τ`` (``R`` only scales
it); its derivative vanishes where ``(1 − λτ) e^{λ(τ+C)} = 1``, solved here by bisection on
``(0, 1/λ)``. To first order in ``λ`` that is Young's ``τ* = sqrt(2 C M)`` (Young 1974;
Daly 2006), printed beside it as a cross-check.
"""

from __future__ import annotations

import math
import re
from typing import Any

from attrs import field, frozen

from zrt_core.errors import SpecError

#: Meta, "The Llama 3 Herd of Models" (2024), section 3.3.4: a 54-day snapshot of Llama 3
#: 405B pre-training on 16,384 H100 had 466 job interruptions, 419 of them unexpected
#: (GPU, HBM3, host, network and software faults; the 47 planned ones are maintenance).
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_UNEXPECTED_INTERRUPTIONS = 419
#: per-GPU MTBF: 16,384 GPUs × 54 days × 24 h / 419 = 21,233,664 / 419 = 50,677.0 GPU-hours
#: (a system MTBF of 54 × 24 / 419 = 3.09 h at 16,384 GPUs). It counts every unexpected
#: interruption of the job, whatever failed, per GPU of the job: the rate a job sees.
DEFAULT_MTBF_GPU_HOURS = LLAMA3_GPUS * LLAMA3_DAYS * 24 / LLAMA3_UNEXPECTED_INTERRUPTIONS
#: seconds from a failure to training again, before the checkpoint load (which is modelled
#: from the checkpoint's size): detection, rescheduling onto spare nodes, process and
#: communicator start-up. 10 minutes; docs/goodput.md lists the published figures it sits
#: among (ByteDance: 1,047 s of initialisation for an unoptimised 2,048-GPU job, seconds
#: once optimised; Huawei MindCluster's breakdown of resumable-training start-up).
DEFAULT_RESTART_S = 600.0

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_DURATION = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_tokens(text: str) -> float:
    """``15T``, ``1.5e13``, ``300B``, ``2.5M`` or ``1000000`` as a number of tokens.

    :raises SpecError: not a positive, finite count in one of those forms.
    """
    raw = str(text).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)", raw)
    if m is None:
        raise SpecError(f"--tokens {text!r} is not a token count",
                        "write it as 15T, 1.5e13, 300B or 2.5M")
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"--tokens must be positive and finite, got {text!r}",
                        "write it as 15T, 1.5e13, 300B or 2.5M")
    return value


def parse_interval(text: str) -> tuple[int | None, float | None]:
    """``--checkpoint-every``: ``500`` (steps) or a duration ``30m``, ``2h``, ``90s``,
    ``1.5d``, as ``(steps, None)`` or ``(None, seconds)``.

    :raises SpecError: zero, negative, or neither form.
    """
    raw = str(text).strip().lower()
    hint = "give a number of steps (500) or a duration (90s, 30m, 2h, 1d)"
    if re.fullmatch(r"[0-9]+", raw):
        steps = int(raw)
        if steps <= 0:
            raise SpecError(f"--checkpoint-every must be at least one step, got {text!r}", hint)
        return steps, None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(s|min|m|h|d)", raw)
    if m is None:
        raise SpecError(f"--checkpoint-every {text!r} is neither steps nor a duration", hint)
    seconds = float(m.group(1)) * _DURATION[m.group(2)]
    if seconds <= 0:
        raise SpecError(f"--checkpoint-every must be positive, got {text!r}", hint)
    return None, seconds


def _positive(what: str):  # an attrs validator with a one-line SpecError
    def check(_inst: Any, _attr: Any, value: Any) -> None:
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise SpecError(f"{what} must be positive and finite, got {value}",
                            f"give {what} a positive number")
    return check


@frozen
class GoodputSpec:
    """What the run is and how it is protected.

    :param tokens: the token budget (steps = ⌈tokens / tokens per step⌉); or ``steps``.
    :param mtbf_gpu_hours: mean time between job interruptions per GPU (the default: Llama
        3's 54-day snapshot, :data:`DEFAULT_MTBF_GPU_HOURS`).
    :param checkpoint_every_steps: checkpoint every k steps; or ``checkpoint_every_s``
        (rounded to whole steps); neither: the interval that maximises goodput.
    :param checkpoint_gb_per_s: what one device writes to storage, GB/s (default: the
        hardware pack's ``checkpoint_write_gb_per_s``).
    :param storage_gb_per_s: what the whole storage system takes, GB/s (no cap when None).
    :param restart_s: seconds to restart after a failure, before loading the checkpoint.
    """

    tokens: float | None = field(default=None, validator=_positive("--tokens"))
    steps: int | None = field(default=None, validator=_positive("--steps"))
    mtbf_gpu_hours: float = field(default=DEFAULT_MTBF_GPU_HOURS,
                                  validator=_positive("--mtbf-gpu-hours"))
    checkpoint_every_steps: int | None = field(default=None,
                                               validator=_positive("--checkpoint-every"))
    checkpoint_every_s: float | None = field(default=None,
                                             validator=_positive("--checkpoint-every"))
    checkpoint_gb_per_s: float | None = field(default=None,
                                              validator=_positive("--checkpoint-gbps"))
    storage_gb_per_s: float | None = field(default=None, validator=_positive("--storage-gbps"))
    restart_s: float = field(default=DEFAULT_RESTART_S, converter=float,
                             validator=lambda _i, _a, v: _non_negative_restart(v))

    def __attrs_post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise SpecError("a run needs its length: give --tokens or --steps, not both",
                            "e.g. --tokens 15T or --steps 1000")
        if self.checkpoint_every_steps is not None and self.checkpoint_every_s is not None:
            raise SpecError("give the checkpoint interval once, in steps or as a duration")

    def to_json(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "steps": self.steps,
                "mtbf_gpu_hours": self.mtbf_gpu_hours,
                "checkpoint_every_steps": self.checkpoint_every_steps,
                "checkpoint_every_s": self.checkpoint_every_s,
                "checkpoint_gb_per_s": self.checkpoint_gb_per_s,
                "storage_gb_per_s": self.storage_gb_per_s, "restart_s": self.restart_s}


def _non_negative_restart(value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise SpecError(f"--restart-min must be zero or positive, got {value / 60:g}",
                        "give the minutes a restart takes, e.g. --restart-min 10")


@frozen
class Goodput:
    """A whole run: its length, its time lost and its goodput (times in seconds).

    ``wall_s = useful_s + checkpoint_lost_s + restart_lost_s + recompute_lost_s`` exactly;
    ``goodput = useful_s / wall_s``. The ``optimal_*`` fields are the interval (whole steps)
    that maximises goodput under the same model, ``young_daly_interval_s`` the first-order
    optimum ``sqrt(2 C M)`` as a cross-check.
    """

    steps: int
    tokens: float
    num_gpus: int
    step_time_s: float
    useful_s: float
    wall_s: float
    mtbf_gpu_hours: float
    system_mtbf_s: float
    checkpoint_bytes: float
    checkpoint_bytes_per_device: float
    checkpoint_write_s: float
    checkpoint_load_s: float
    restart_s: float
    checkpoint_every_steps: int
    interval_source: str
    checkpoints: float
    interruptions: float
    checkpoint_lost_s: float
    restart_lost_s: float
    recompute_lost_s: float
    goodput: float
    optimal_every_steps: int
    optimal_interval_s: float
    optimal_goodput: float
    young_daly_interval_s: float

    @property
    def gpu_hours(self) -> float:
        return self.wall_s * self.num_gpus / 3600.0

    @property
    def useful_gpu_hours(self) -> float:
        return self.useful_s * self.num_gpus / 3600.0

    @property
    def checkpoint_interval_s(self) -> float:
        return self.checkpoint_every_steps * self.step_time_s

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "tokens": self.tokens, "num_gpus": self.num_gpus,
                "step_time_s": self.step_time_s, "useful_s": self.useful_s,
                "wall_s": self.wall_s, "wall_days": self.wall_s / 86400.0,
                "gpu_hours": self.gpu_hours, "useful_gpu_hours": self.useful_gpu_hours,
                "mtbf_gpu_hours": self.mtbf_gpu_hours, "system_mtbf_s": self.system_mtbf_s,
                "checkpoint_bytes": self.checkpoint_bytes,
                "checkpoint_bytes_per_device": self.checkpoint_bytes_per_device,
                "checkpoint_write_s": self.checkpoint_write_s,
                "checkpoint_load_s": self.checkpoint_load_s, "restart_s": self.restart_s,
                "checkpoint_every_steps": self.checkpoint_every_steps,
                "checkpoint_interval_s": self.checkpoint_interval_s,
                "interval_source": self.interval_source, "checkpoints": self.checkpoints,
                "interruptions": self.interruptions,
                "checkpoint_lost_s": self.checkpoint_lost_s,
                "restart_lost_s": self.restart_lost_s,
                "recompute_lost_s": self.recompute_lost_s, "goodput": self.goodput,
                "optimal_every_steps": self.optimal_every_steps,
                "optimal_interval_s": self.optimal_interval_s,
                "optimal_goodput": self.optimal_goodput,
                "young_daly_interval_s": self.young_daly_interval_s}


def expected_wall_s(useful_s: float, interval_s: float, write_s: float, restart_s: float,
                    rate_per_s: float) -> float:
    """``T = (W/τ)(e^{λ(τ+C)} − 1)(1/λ + R)`` (the module docstring); ``W + (W/τ) C`` when
    nothing fails."""
    segments = useful_s / interval_s
    if rate_per_s == 0:
        return useful_s + segments * write_s
    if rate_per_s * (interval_s + write_s) > 700:
        raise SpecError(
            f"a checkpoint every {interval_s:.4g} s with failures every {1 / rate_per_s:.4g} s "
            "almost never completes: the run would never finish",
            "checkpoint more often (--checkpoint-every) or leave it out for the optimum")
    return segments * math.expm1(rate_per_s * (interval_s + write_s)) * (1 / rate_per_s
                                                                          + restart_s)


def optimal_interval_s(write_s: float, rate_per_s: float) -> float:
    """The ``τ`` that minimises ``(e^{λ(τ+C)} − 1) / τ``: the root of
    ``g(τ) = (1 − λτ) e^{λ(τ+C)} − 1`` on ``(0, 1/λ)``, where ``g(0) = e^{λC} − 1 > 0`` and
    ``g(1/λ) = −1 < 0`` (``g`` falls monotonically: ``g' = −λ²τ e^{λ(τ+C)}``)."""
    if write_s <= 0 or rate_per_s <= 0:
        raise SpecError("the optimal checkpoint interval needs a positive write time and "
                        "failure rate")
    lo, hi = 0.0, 1.0 / rate_per_s
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        # (1 − λτ) e^{λ(τ+C)} − 1, written with expm1 so a tiny λ keeps its digits
        g = (1 - rate_per_s * mid) * math.expm1(rate_per_s * (mid + write_s)) \
            - rate_per_s * mid
        if g > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return 0.5 * (lo + hi)


def young_daly_interval_s(write_s: float, system_mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * write_s * system_mtbf_s)


def checkpoint_write_s(bytes_per_device: float, total_bytes: float,
                       device_gb_per_s: float, storage_gb_per_s: float | None) -> float:
    """Every device writes its shard at once: the slowest device's bytes over its
    bandwidth, or the whole checkpoint over the storage system's, whichever is longer."""
    per_device = bytes_per_device / (device_gb_per_s * 1e9)
    if storage_gb_per_s is None:
        return per_device
    return max(per_device, total_bytes / (storage_gb_per_s * 1e9))


def goodput(spec: GoodputSpec, *, step_time_s: float, tokens_per_step: int, num_gpus: int,
            checkpoint_bytes: float, checkpoint_bytes_per_device: float,
            device_gb_per_s: float) -> Goodput:
    """The run of ``spec`` at ``step_time_s`` per step on ``num_gpus`` GPUs, checkpointing
    ``checkpoint_bytes`` (``checkpoint_bytes_per_device`` on the device that writes most) at
    ``device_gb_per_s`` per device. Loading the checkpoint on restart is priced at the
    write bandwidth."""
    for what, value in (("the step time", step_time_s), ("the tokens per step",
                        tokens_per_step), ("the GPU count", num_gpus),
                        ("the checkpoint size", checkpoint_bytes),
                        ("the checkpoint size per device", checkpoint_bytes_per_device)):
        if not math.isfinite(value) or value <= 0:
            raise SpecError(f"goodput needs a positive {what}, got {value}")
    _positive("the checkpoint write bandwidth")(None, None, device_gb_per_s)
    if spec.steps is not None:
        steps = spec.steps
    else:
        assert spec.tokens is not None
        steps = max(1, math.ceil(spec.tokens / tokens_per_step))
    tokens = float(steps * tokens_per_step)
    useful = steps * step_time_s
    rate = num_gpus / (spec.mtbf_gpu_hours * 3600.0)  # λ, interruptions per second
    mtbf_s = 1.0 / rate
    write = checkpoint_write_s(checkpoint_bytes_per_device, checkpoint_bytes, device_gb_per_s,
                               spec.storage_gb_per_s)
    load = write  # read back at the bandwidth it was written at
    restart = spec.restart_s + load

    if rate * (step_time_s + write) > 700:
        # e^{λs} beyond a float: a single step and its checkpoint almost never complete
        raise SpecError(
            f"at {spec.mtbf_gpu_hours:g} GPU-hours between failures per GPU, {num_gpus} GPUs "
            f"fail every {mtbf_s:.3g} s, far shorter than one step and its checkpoint "
            f"({step_time_s + write:.3g} s): the run would never finish",
            "check --mtbf-gpu-hours (hours per GPU, e.g. 50000)")

    def wall(k: int) -> float:
        return expected_wall_s(useful, k * step_time_s, write, restart, rate)

    best_s = optimal_interval_s(write, rate)
    # the best whole number of steps: one side of the continuous optimum or the other
    lo_k = max(1, math.floor(best_s / step_time_s))
    best_k = min((lo_k, lo_k + 1), key=lambda k: (wall(k), k))
    best_k = min(best_k, steps)
    if spec.checkpoint_every_steps is not None:
        every, source = spec.checkpoint_every_steps, "given"
    elif spec.checkpoint_every_s is not None:
        every, source = max(1, round(spec.checkpoint_every_s / step_time_s)), "given"
    else:
        every, source = best_k, "optimal"
    interval = every * step_time_s
    total = wall(every)
    segments = useful / interval
    failures = segments * math.expm1(rate * (interval + write))
    ckpt_lost = segments * write
    restart_lost = failures * restart
    return Goodput(
        steps=steps, tokens=tokens, num_gpus=num_gpus, step_time_s=step_time_s,
        useful_s=useful, wall_s=total, mtbf_gpu_hours=spec.mtbf_gpu_hours,
        system_mtbf_s=mtbf_s, checkpoint_bytes=checkpoint_bytes,
        checkpoint_bytes_per_device=checkpoint_bytes_per_device, checkpoint_write_s=write,
        checkpoint_load_s=load, restart_s=restart, checkpoint_every_steps=every,
        interval_source=source, checkpoints=segments, interruptions=failures,
        checkpoint_lost_s=ckpt_lost, restart_lost_s=restart_lost,
        recompute_lost_s=total - useful - ckpt_lost - restart_lost, goodput=useful / total,
        optimal_every_steps=best_k, optimal_interval_s=best_s,
        optimal_goodput=useful / wall(best_k),
        young_daly_interval_s=young_daly_interval_s(write, mtbf_s))
