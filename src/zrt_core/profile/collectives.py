"""``zrt calibrate --ranks N``: all-reduce timed with ``torch.distributed`` over N ranks of one
machine (NCCL between its GPUs, gloo between CPU processes) and fitted as the ring
all-reduce zrt prices (``cost/collectives.py``): ``t = 2(n-1)/n · S / B + 2(n-1) · α``, so the
pack's link prices the measured collectives back.

Each rank is a process (``spawn``); every size is timed after two warm-ups as the best of
``repeats``, each sample the slowest rank's time (a collective ends when its last rank does).
"""

from __future__ import annotations

import math
import queue as _queue
import socket
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from zrt_core.errors import InternalError
from zrt_core.profile.device import DeviceError

#: message bytes per rank timed (1 MiB to 64 MiB: past the latency-bound sizes)
DEFAULT_SIZES = tuple(1 << p for p in range(20, 27, 2))
#: seconds to wait for the ranks (starting N processes that import torch, then the timings)
TIMEOUT_S = 600.0


@frozen
class LinkFit:
    """The ring all-reduce fit: bus bandwidth and per-step latency over ``ranks`` ranks."""

    ranks: int
    bandwidth_gb_per_s: float
    latency_us: float
    points: tuple[tuple[int, float], ...]  # (bytes per rank, seconds)
    rms_rel_error: float
    backend: str


def measure_link(kind: str, ranks: int, *, sizes: Sequence[int] = DEFAULT_SIZES,
                 repeats: int = 5) -> LinkFit:
    """Time all-reduce over ``ranks`` ranks of device ``kind`` and fit the ring's link.

    :raises DeviceError: fewer than 2 ranks, or more ranks than the machine has GPUs.
    """
    import torch
    import torch.multiprocessing as mp

    if ranks < 2:
        raise DeviceError(f"--ranks {ranks}: a collective needs 2 ranks at least")
    if kind == "cuda" and ranks > torch.cuda.device_count():
        raise DeviceError(f"--ranks {ranks}: this machine has {torch.cuda.device_count()} "
                          "GPU(s)", "give at most that many ranks")
    backend = "nccl" if kind == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, ranks, kind, backend, port, tuple(sizes),
                                             repeats, queue), daemon=True)
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        status, payload = queue.get(timeout=TIMEOUT_S)
    except _queue.Empty:  # a rank died or hung
        status, payload = "error", f"no result within {TIMEOUT_S:.0f} s"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    if status != "ok":
        raise DeviceError(f"timing all-reduce over {ranks} {kind} ranks ({backend}) failed: "
                          f"{payload}")
    points = tuple((int(s), float(t)) for s, t in payload)
    return fit_ring(points, ranks, backend)


def fit_ring(points: Sequence[tuple[int, float]], ranks: int, backend: str = "") -> LinkFit:
    """``t = c + k·S`` by least squares on relative error (c, k ≥ 0; k > 0): the bus
    bandwidth ``2(n-1)/n / k`` and the per-step latency ``c / 2(n-1)``."""
    import numpy as np

    if len(points) < 2:
        raise InternalError(f"calibrate: {len(points)} all-reduce sizes cannot fit a link",
                            "time two sizes at least")
    size = np.array([float(s) for s, _ in points])
    t = np.array([float(x) for _, x in points])
    design = np.stack([np.ones_like(size), size], axis=1) / t[:, None]
    (c, k), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if c < 0:  # no fixed term: the slope alone
        c, k = 0.0, float(np.sum(size / t) / np.sum((size / t) ** 2))
    if k <= 0:
        raise InternalError("calibrate: the all-reduce fit has no bandwidth term",
                            "the timings are dominated by noise; time larger sizes")
    rms = float(math.sqrt(float(np.mean((design @ np.array([c, k]) - 1.0) ** 2))))
    steps = 2 * (ranks - 1)
    return LinkFit(ranks=ranks, bandwidth_gb_per_s=steps / ranks / k / 1e9,
                   latency_us=c / steps * 1e6, points=tuple(points), rms_rel_error=rms,
                   backend=backend)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, kind: str, backend: str, port: int, sizes: tuple[int, ...],
          repeats: int, queue: Any) -> None:
    """One rank: join the group on 127.0.0.1, time every size, rank 0 reports."""
    import time

    import torch
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        if kind == "cuda":
            torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank) if kind == "cuda" else torch.device("cpu")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)

        def sync() -> None:
            if kind == "cuda":
                torch.cuda.synchronize(dev)

        out = []
        for size in sizes:
            x = torch.ones(max(1, size // 4), dtype=torch.float32, device=dev)
            for _ in range(2):
                dist.all_reduce(x)
            best = float("inf")
            for _ in range(repeats):
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(x)
                sync()
                best = min(best, time.perf_counter() - t0)
            slowest = torch.tensor([best], dtype=torch.float64, device=dev)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            out.append((x.numel() * 4, float(slowest.item())))
        dist.destroy_process_group()
        if rank == 0:
            queue.put(("ok", out))
    except Exception as exc:  # reported by the parent as one line
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
