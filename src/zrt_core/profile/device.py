"""The device a measurement runs on: presence and dtype checks, thread pinning, and a timer
(CUDA events on a GPU; on a CPU the CPU time of the measuring thread).

With one intra-op thread every CPU kernel, forward and backward, runs on the calling thread,
so its CPU time (``time.thread_time``) is the kernel's time without the slices other
processes take on a busy machine — wall time on an idle one. With more threads the workers'
time is not on the caller's clock: wall time (``perf_counter``) is used then.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from attrs import frozen

from zrt_core.errors import ZrtError

DEVICES = ("cpu", "cuda")
#: compute dtype names (hardware.py's keys) → torch dtype attribute names
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16",
                "fp8": "float8_e4m3fn", "int8": "int8"}


def significant(x: float) -> float:
    """Four significant digits: a pack is read by people."""
    return float(f"{x:.4g}")


class DeviceError(ZrtError):
    """The device named is not present, or lacks what was asked of it."""


@frozen
class Device:
    """One device to time on.

    :param kind: ``cpu`` or ``cuda``.
    :param name: the processor or GPU name, as the system reports it.
    :param threads: intra-op threads (CPU; 0 on a GPU).
    """

    kind: str
    name: str
    threads: int
    #: what the timings depend on beyond torch (a GPU's driver, CUDA, cuBLAS, cuDNN): the
    #: provenance tables and packs carry
    libraries: str = ""
    #: the torch that timed (a saved calibration re-read elsewhere); "": this process's
    torch_version: str = ""

    @property
    def torch_device(self) -> str:
        return "cuda:0" if self.kind == "cuda" else "cpu"

    def supported_dtypes(self) -> tuple[str, ...]:
        """Compute dtypes (hardware.py's keys) this device runs GEMMs in."""
        if self.kind == "cpu":
            return ("fp32", "bf16", "fp16")
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        found = ["fp32", "fp16"]
        if major >= 8:
            found += ["tf32", "bf16"]
        if (major, minor) >= (8, 9):
            found.append("fp8")
        return tuple(found)

    def check_dtype(self, dtype: str) -> None:
        if dtype not in self.supported_dtypes():
            raise DeviceError(f"device {self.kind} ({self.name}) has no {dtype} GEMMs",
                              f"use one of {', '.join(self.supported_dtypes())}")

    def to_json(self) -> dict[str, Any]:
        import torch

        return {"kind": self.kind, "name": self.name, "threads": self.threads,
                "torch": self.torch_version or torch.__version__,
                "cuda": torch.version.cuda if self.kind == "cuda" else None,
                "libraries": self.libraries}

    def sm_clock_mhz(self) -> int | None:
        """The GPU's SM clock now, MHz (NVML's last sample, through ``torch.cuda``); None on
        a CPU or without NVML's Python binding. A GEMM timed back to back runs at the clock
        its power limit allows, below the boost clock a step of mixed kernels keeps
        (docs/profile.md), so a row's clock says which regime it measured."""
        if self.kind != "cuda":
            return None
        import torch

        try:
            return int(torch.cuda.clock_rate(0))
        except Exception:  # no pynvml, or NVML not answering: the row just has no clock
            return None

    def provenance(self) -> str:
        """One line naming the device and the software its timings came from."""
        import torch

        if self.kind == "cpu":
            where = f"{self.threads} thread{'s' * (self.threads > 1)}"
        else:
            where = self.libraries or f"CUDA {torch.version.cuda}"
        return f"{self.name} ({self.kind}, {where}), torch {self.torch_version or torch.__version__}"


def open_device(kind: str, *, threads: int = 1) -> Device:
    """The device ``kind``, checked present; on a CPU pin ``threads`` intra-op threads.

    :raises DeviceError: an unknown kind, or ``cuda`` without a visible GPU.
    """
    import torch

    if kind not in DEVICES:
        raise DeviceError(f"unknown device {kind!r}", f"use one of {', '.join(DEVICES)}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("device cuda is not present (torch sees no CUDA GPU)",
                              "run on a machine with a GPU and a CUDA build of torch, "
                              "or use --device cpu")
        return Device("cuda", torch.cuda.get_device_name(0), 0, _cuda_libraries())
    if threads < 1:
        raise DeviceError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    return Device("cpu", _cpu_name(), threads)


def _cuda_libraries() -> str:
    """Driver, CUDA, cuBLAS and cuDNN versions, as far as they can be read."""
    import importlib.metadata
    import subprocess

    import torch

    parts = []
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                 "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=20, check=False).stdout.split()
        if driver:
            parts.append(f"driver {driver[0]}")
    except (OSError, subprocess.SubprocessError):
        pass
    parts.append(f"CUDA {torch.version.cuda}")
    for dist in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"):
        try:
            parts.append(f"cuBLAS {importlib.metadata.version(dist)}")
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    cudnn = torch.backends.cudnn.version()
    if cudnn:
        parts.append(f"cuDNN {cudnn}")
    return ", ".join(parts)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_clock(device: Device) -> Callable[[], float]:
    """The clock CPU timings read (module docstring)."""
    return time.thread_time if device.threads == 1 else time.perf_counter


def synchronize(device: Device) -> None:
    if device.kind == "cuda":
        import torch

        torch.cuda.synchronize()


#: calls one GPU sample queues at most: 256 one-element adds queued behind a sleep read an
#: H100's 2.15 µs launch three times out of three (docs/profile.md), well short of the
#: launch queue's depth (about a thousand), where the host would block and the GPU wait
MAX_QUEUED_CALLS = 256
#: the GPU sleeps this many times the host's time to queue a sample, and at least this long
SLEEP_MARGIN = 2.0
MIN_SLEEP_S = 1e-3


def calls_per_sample(one_call_s: float, min_time_s: float) -> int:
    """How many calls a GPU sample queues between its two events: enough to last
    ``min_time_s`` at ``one_call_s`` each (one timed call), at least 1 and at most
    :data:`MAX_QUEUED_CALLS`."""
    if one_call_s <= 0:
        return MAX_QUEUED_CALLS
    return max(1, min(MAX_QUEUED_CALLS, math.ceil(min_time_s / one_call_s)))


def sleep_cycles(issue_s: float, cycles_per_s: float) -> int:
    """GPU clock cycles of ``torch.cuda._sleep`` that outlast the host queueing a sample it
    took ``issue_s`` to queue once: :data:`SLEEP_MARGIN` times that, :data:`MIN_SLEEP_S`
    at least."""
    return max(1, round(max(MIN_SLEEP_S, SLEEP_MARGIN * issue_s) * cycles_per_s))


def time_call(device: Device, fn: Callable[[], Any], *, warmup: int = 2, repeats: int = 5,
              min_time_s: float = 0.0) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then ``repeats`` timed ones
    (each repeated until it lasts ``min_time_s``, averaged), sorted ascending.

    On a GPU a sample is the time between two CUDA events around a number of calls fixed
    beforehand from one timed call (:func:`calls_per_sample`), queued while the GPU sleeps
    (:func:`sleep_cycles`), so that the events time the device alone. Two faults this
    avoids (docs/profile.md): a loop that ran until the host's clock passed ``min_time_s``
    queued a launch queue's worth of 20 ms GEMMs per sample (an H200's calibration spent
    145 s on nine of them); and calls queued as the host issues them time the host
    whenever a kernel is shorter than its issue (~10-20 µs from Python), as the launch and
    the small GEMMs of the grid were before.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.kind == "cuda":
        return sorted(_gpu_samples(fn, repeats, min_time_s))
    samples = []
    for _ in range(repeats):
        calls = 0
        clock = cpu_clock(device)
        t0 = clock()
        while True:
            fn()
            calls += 1
            elapsed = clock() - t0
            if elapsed >= min_time_s:
                break
        samples.append(elapsed / calls)
    return sorted(samples)


def best_interleaved(device: Device, calls: Sequence[Callable[[], Any]], *, repeats: int,
                     min_time_s: float = 0.0) -> list[float]:
    """Seconds per call of each of ``calls``: the best of ``repeats`` samples, each a
    :func:`time_call` sample, taken in turn over the calls (every call warmed up first). A
    slow spell of a shared machine (other tenants' memory traffic, seconds long) then
    falls on every call's samples alike instead of on the few calls timed during it, which
    a fit over them (``zrt calibrate``'s GEMM grid) would read as a shape effect. A GPU is
    the session's own: its calls are timed one after the other."""
    if device.kind == "cuda":
        return [time_call(device, fn, repeats=repeats, min_time_s=min_time_s)[0]
                for fn in calls]
    for fn in calls:  # two untimed calls each, as time_call warms up
        fn()
        fn()
    best = [math.inf] * len(calls)
    for _ in range(repeats):
        for i, fn in enumerate(calls):
            best[i] = min(best[i], time_call(device, fn, warmup=0, repeats=1,
                                             min_time_s=min_time_s)[0])
    return best


def _gpu_samples(fn: Callable[[], Any], repeats: int, min_time_s: float) -> list[float]:
    import torch

    def batch(calls: int, cycles: int) -> tuple[float, float]:
        """(device seconds per call, host seconds to queue them)"""
        start, end = (torch.cuda.Event(enable_timing=True),
                      torch.cuda.Event(enable_timing=True))
        if cycles:
            torch.cuda._sleep(cycles)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        issue = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / calls, issue

    one, _ = batch(1, 0)
    calls = calls_per_sample(one, min_time_s)
    _, issue = batch(calls, 0)
    cycles = sleep_cycles(issue, _sleep_cycles_per_s())
    return [batch(calls, cycles)[0] for _ in range(repeats)]


_SLEEP_RATE: list[float] = []


def _sleep_cycles_per_s() -> float:
    """The rate ``torch.cuda._sleep`` spins at on this GPU (its SM clock), timed once."""
    if not _SLEEP_RATE:
        import torch

        cycles = 10_000_000
        torch.cuda._sleep(cycles // 10)  # the clock ramps up
        start, end = (torch.cuda.Event(enable_timing=True),
                      torch.cuda.Event(enable_timing=True))
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_RATE.append(cycles / max(start.elapsed_time(end) * 1e-3, 1e-6))
    return _SLEEP_RATE[0]


def median(samples: list[float]) -> float:
    return statistics.median(samples)
