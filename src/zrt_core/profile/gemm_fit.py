"""The GEMM fits of ``zrt calibrate`` (:mod:`zrt_core.profile.calibrate`): the compute fit
over the timed grid (rate, K-loop overhead, fixed cost, row tile or row overhead) and the
weight-stream fit over its skinny rows (how a GEMM of a few rows streams its weight)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attrs import frozen

from zrt_core.errors import InternalError

#: row-tile sizes the GEMM fit tries (a CPU micro-kernel's rows, a GPU tile's)
TILE_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128)
#: rows' worth of per-call work the GEMM fit tries, each with no row tile (a CPU BLAS packs
#: the weight panel once per call: work that grows with n × k, as each row's does)
ROW_OVERHEAD_CANDIDATES = (2, 4, 8, 12, 16, 20, 24, 32)
#: the skinny rows whose weight streaming gives ``matmul_memory`` (:func:`fit_weight_stream`)
SKINNY_STREAM_ROWS = (2, 8)


@frozen
class GemmPoint:
    """One timed GEMM."""

    dtype: str
    m: int
    n: int
    k: int
    time_s: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@frozen
class GemmFit:
    """``t = fixed_s + F/rate + F·k0/(rate·k)`` for one dtype."""

    dtype: str
    rate_flops: float
    k0: float
    fixed_s: float
    rms_rel_error: float
    tile_m: int = 1
    #: rows' worth of work per GEMM beyond its own (with ``tile_m`` 1): :func:`fit_gemm`
    row_overhead: int = 0


def grid_points(points: Sequence[GemmPoint], dtype: str) -> list[GemmPoint]:
    """``dtype``'s points of the compute fit's grid: square ``m = n`` GEMMs over every k, and
    the skinny rows at the largest size; the weight-stream probes (a few rows over a
    smaller square weight) are left to :func:`fit_weight_stream`."""
    mine = [p for p in points if p.dtype == dtype]
    big = max((p.n for p in mine), default=0)
    return [p for p in mine if p.m == p.n or p.n == p.k == big]


def fit_weight_stream(points: Sequence[GemmPoint], elem_bytes: float, copy_bytes_per_s: float
                      ) -> tuple[float, int] | None:
    """How a GEMM of a few rows streams its weight: for each square weight ``n = k`` timed
    with 2–8 rows, the fastest of them (one row is left out: a CPU BLAS runs it as a GEMV,
    which streams near copy speed; past 8 rows compute shares the time), fitted as
    ``t = c + n·(k + k0)·bytes / R`` by least squares on relative error (c, k0 ≥ 0): each
    weight row of k elements streams as ``k + k0`` (a BLAS's per-column work beyond the
    bytes: on this CPU k0 ≈ 200, so rows of 512 stream at 0.72 of rows of 2048).
    Returns (R over the copy's rate, at most 1; round(k0)). With fewer than three
    weights, or a fit with no rate: the fastest rate at the largest weight and k0 = 0
    (a pack calibrated before the probes). None without skinny rows."""
    import numpy as np

    lo, hi = SKINNY_STREAM_ROWS
    fastest: dict[tuple[int, int], float] = {}
    for p in points:
        if lo <= p.m <= hi and p.n == p.k:
            key = (p.n, p.k)
            fastest[key] = min(fastest.get(key, math.inf), p.time_s)
    if not fastest or copy_bytes_per_s <= 0:
        return None
    if len(fastest) >= 3:
        t = np.array(list(fastest.values()))
        design = np.array([[1.0, n * k * elem_bytes, n * elem_bytes]
                           for n, k in fastest]) / t[:, None]
        _, u, v = (float(x) for x in _nnls(design, np.ones_like(t)))
        if u > 0:
            return min(1.0, 1.0 / u / copy_bytes_per_s), round(v / u)
    n, k = max(fastest)
    return min(1.0, n * k * elem_bytes / fastest[n, k] / copy_bytes_per_s), 0


def fit_gemm(dtype: str, points: Sequence[GemmPoint],
             tiles: Sequence[int] = TILE_CANDIDATES,
             row_overheads: Sequence[int] = ROW_OVERHEAD_CANDIDATES) -> GemmFit:
    """Least squares of ``t = c + F'·u + F'/k·v`` on relative error (rows divided by t),
    for each way of counting a GEMM's rows: ``F' = F/padding(m, tile)`` for each row
    tile (a GPU's output tiles), and ``F' = F·(m + r)/m`` for each row overhead ``r``
    (a CPU BLAS's per-call packing of the weight); the one of the least error is kept.
    rate = 1/u, k0 = v/u. A fit that gives no positive rate is an error, not a number.
    """
    import numpy as np

    if len(points) < 3:
        raise InternalError(f"calibrate: {len(points)} {dtype} GEMMs cannot fit 3 numbers",
                            "give --sizes at least two values")
    t = np.array([p.time_s for p in points])
    best: GemmFit | None = None
    counts = [(tile, 0) for tile in tiles] + [(1, r) for r in row_overheads]
    for tile, extra in counts:
        pad = [p.m / (math.ceil(p.m / tile) * tile + extra) for p in points]
        design = np.array([[1.0, p.flops / f, p.flops / f / p.k]
                           for p, f in zip(points, pad, strict=True)]) / t[:, None]
        coef = _nnls(design, np.ones_like(t))
        c, u, v = (float(x) for x in coef)
        if u <= 0:
            continue
        rms = float(math.sqrt(float(np.mean((design @ coef - 1.0) ** 2))))
        if best is None or rms < best.rms_rel_error:
            best = GemmFit(dtype=dtype, rate_flops=1.0 / u, k0=v / u, fixed_s=c,
                           rms_rel_error=rms, tile_m=tile, row_overhead=extra)
    if best is None:
        raise InternalError(f"calibrate: the {dtype} GEMM fit has no throughput term",
                            "the timings are dominated by noise; rerun with larger --sizes")
    return best


def _nnls(a: Any, b: Any) -> Any:
    """Non-negative least squares over the subsets of the three unknowns that keep the
    throughput term (column 1): exhaustive, so the best non-negative fit with a rate."""
    import itertools

    import numpy as np

    best, best_err = np.zeros(a.shape[1]), float("inf")
    cols = range(a.shape[1])
    for r in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(cols, r):
            if 1 not in subset:
                continue
            sol, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if (sol < 0).any():
                continue
            full = np.zeros(a.shape[1])
            full[list(subset)] = sol
            err = float(np.sum((a @ full - b) ** 2))
            if err < best_err:
                best, best_err = full, err
    return best
