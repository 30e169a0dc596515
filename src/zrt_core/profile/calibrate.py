"""``zrt calibrate``: measure a device's GEMM throughput per dtype, memory bandwidth, launch
overhead and GEMM efficiency curve, and write them as a hardware-pack YAML.

Every number in the pack is fitted by code from timings taken here (docs/profile.md):

* GEMM: ``m × n × k`` over a grid (``m = n`` from the sizes with every ``k``, and skinny
  ``m`` of 1 to 32 rows at the largest ``n = k``: decode steps); per dtype the time is fitted
  as ``t = c + F'/P + F'·k0/(P·k)`` with ``F' = F / padding(m)`` — a fixed cost ``c``, the
  rate ``P``, a K-loop overhead ``k0`` (the roofline's ``k/(k + k0)`` factor) and the row
  tile ``tile_m`` of the padding factor ``m / (⌈m/tile_m⌉·tile_m)`` (docs/cost-model.md):
  least squares on relative error for each candidate tile, the best tile kept. ``P`` is
  written as the dtype's peak and ``efficiency.matmul`` is 1. Each GEMM cycles through
  weight matrices filling ``mem_mb`` MB, as a model's layers do: its weights come from
  memory, not from a cache the previous call warmed.
* attention: causal SDPA forward and backward over the sequence lengths of the grid,
  fitted the same way in the visible keys per query: the efficiency (of the GEMM rate of
  the same dtype) and the KV-loop overhead ``kv0`` of the roofline's attention rule. On a
  CPU in fp32 with ``b=1, h=4, d=64``; on a GPU in bf16 (the dtype models run in there, and
  the one its flash kernels take) with ``b=2, h=32, d=128``, enough query tiles to fill
  the SMs from the shortest length up.
* memory: a copy of ``mem_mb`` MB (read + write) at the best of the repeats: with the
  default 64 MB, beyond a CPU's caches — a training step's saved activations and a decode
  step's weights stream from DRAM.
* launch overhead: a one-element ``add`` (on a CPU the call; on a GPU the device's time per
  kernel of an eager stream, the adds queued while it sleeps: :func:`_launch_s`).
* link (``ranks`` > 1): all-reduce over that many ranks of the machine with
  ``torch.distributed`` (:mod:`zrt_core.profile.collectives`), fitted as zrt's ring; else the
  pack's one tier is a copy through the device's memory.
* eager host: the wall time of a small eager decoder's training forward, its backward and
  its forward without autograd (hidden 64, so its ops' own work is a few microseconds), at
  four depths, against the nodes zrt's capture counts in them (every node, views included):
  the least-squares line through the depths gives the host's time per op of eager PyTorch —
  module Python, autograd, dispatch and launch — and, where it meets zero nodes, the pass's
  fixed cost (model-level Python no node stands for), which ``zrt diff`` runs beside the
  device.
* vector: the pointwise ops decoder layers run (:data:`VECTOR_OPS`) on a cache-resident
  tensor (32k elements on a CPU; 4M on a GPU, whose launch would otherwise be all of it),
  one FLOP per element as zrt's formulas count them: the geometric mean of their rates
  (launch taken off) over the fp32 GEMM rate is ``efficiency.vector``.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from zrt_core.ir.graph import dtype_bytes
from zrt_core.profile.device import TORCH_DTYPES, Device, best_interleaved, time_call
from zrt_core.profile.device import significant as _sig
from zrt_core.profile.gemm_fit import (
    GemmFit,
    GemmPoint,
    fit_gemm,
    fit_weight_stream,
    grid_points,
)
from zrt_core.profile.host_probe import EagerHost
from zrt_core.profile.host_probe import eager_host as eager_host_probe

DEFAULT_SIZES = (64, 128, 256, 512, 1024)
#: skinny GEMM rows timed at the largest n = k
SKINNY_ROWS = (1, 2, 4, 8, 16, 32)
#: rows timed over each smaller square weight for :func:`fit_weight_stream` only
STREAM_PROBE_ROWS = (2, 4, 8)
DEFAULT_DTYPES = ("fp32",)
#: pointwise ops of decoder layers (norms, RoPE, activations, residuals) timed for ``vector``
VECTOR_OPS = ("mul", "add", "neg", "rsqrt", "silu", "gelu", "exp", "pow2")


@frozen
class Calibration:
    """What ``zrt calibrate`` measured on one device."""

    device: Device
    gemm: tuple[GemmPoint, ...] = field(converter=tuple)
    fits: tuple[GemmFit, ...] = field(converter=tuple)
    attention: tuple[GemmFit, GemmFit]
    memory_gb_per_s: float
    launch_overhead_us: float
    vector_flops: float
    capacity_gb: float
    date: str
    #: the dtype attention was timed in (its efficiency is over this dtype's GEMM rate)
    attention_dtype: str = "fp32"
    #: the eager host's cost per op and per pass (:func:`~zrt_core.profile.host_probe.eager_host`)
    eager_host: EagerHost = field(factory=EagerHost)
    #: the ring all-reduce fit over several ranks (``--ranks``); None: one device
    link: Any = None
    #: the unaligned-row GEMM timings (:func:`_alignment_points`)
    alignment_points: tuple[Mapping[str, Any], ...] = field(default=(), converter=tuple)
    #: the grouped GEMMs against dense ones (:func:`_grouped_points`)
    grouped_points: tuple[Mapping[str, Any], ...] = field(default=(), converter=tuple)
    #: a decode attention's KV cache streamed per second (:func:`_decode_attention_rate`)
    decode_attention_bytes_per_s: float | None = None

    @property
    def alignment(self) -> dict[str, float]:
        """The pack's unaligned-row GEMM fractions, fitted on :attr:`alignment_points`."""
        return fit_alignment(self.alignment_points)

    @property
    def group_rows_overhead(self) -> int | None:
        """The pack's ``matmul_group_rows_overhead``, fitted on :attr:`grouped_points`
        (None: not timed)."""
        return fit_group_rows(self.grouped_points)

    @property
    def model_dtype(self) -> str:
        """The dtype models run in on this device (bf16 on a GPU, fp32 on a CPU: the one
        attention was timed in), whose GEMM fit gives the pack's shape terms (row tile, row
        and k overheads, fixed cost, weight streaming); fp32 where it was not fitted."""
        fitted = {f.dtype for f in self.fits}
        return self.attention_dtype if self.attention_dtype in fitted else "fp32"

    def gemm_stream(self) -> tuple[float, int] | None:
        """The pack's ``matmul_memory`` and ``matmul_memory_k_overhead``: how a GEMM of a
        few rows in :attr:`model_dtype` streams its weight (:func:`fit_weight_stream` over
        the grid's skinny rows); None without such rows. On an H200 (docs/profile.md,
        "Fifth run") fp32's skinny GEMMs stream at 0.47 of the copy and bf16's at 0.91:
        the pack prices the dtype the models run in."""
        if self.memory_gb_per_s <= 0:
            return None
        dtype = self.model_dtype
        return fit_weight_stream([p for p in self.gemm if p.dtype == dtype],
                                 dtype_bytes(TORCH_DTYPES[dtype]),
                                 self.memory_gb_per_s * 1e9)

    def fit(self, dtype: str) -> GemmFit:
        return next(f for f in self.fits if f.dtype == dtype)

    def hardware_id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "_", self.device.name.lower()).strip("_")[:40]
        return f"measured_{self.device.kind}_{slug or 'device'}"

    def to_pack(self, hw_id: str | None = None) -> dict[str, Any]:
        """The hardware-pack mapping (``HardwareSpec.from_mapping`` reads it)."""
        fp32 = self.fit("fp32")
        shape = self.fit(self.model_dtype)
        compute: dict[str, float | None] = {}
        for f in self.fits:
            compute[f.dtype] = _sig(f.rate_flops / 1e12)
        # hardware.py requires bf16 and fp16: one not timed is written at the fp32 rate and
        # the source says so
        untimed = [key for key in ("bf16", "fp16") if key not in compute]
        for key in untimed:
            compute[key] = compute["fp32"]
        launch = self.launch_overhead_us
        attn_rate = self.fit(self.attention_dtype).rate_flops
        eff = {
            "matmul": 1.0,
            "memory": 1.0,
            # SDPA's fitted rate over the GEMM rate of its dtype (capped at 1: a fraction)
            "attention": _sig(min(1.0, self.attention[0].rate_flops / attn_rate)),
            "attention_backward": _sig(min(1.0, self.attention[1].rate_flops / attn_rate)),
            # pointwise FLOP rate over the fp32 GEMM rate (capped at 1: a fraction)
            "vector": _sig(min(1.0, self.vector_flops / fp32.rate_flops)),
            "launch_overhead_us": _sig(launch),
            # a GEMM's fixed cost beyond the dispatch every op pays
            "matmul_overhead_us": _sig(max(0.0, shape.fixed_s * 1e6 - launch)),
            "matmul_k_overhead": max(1, round(shape.k0)),
            # the fitted row tile or row overhead; columns are never the skinny side of a
            # model's GEMM
            "matmul_tile_m": shape.tile_m,
            **({"matmul_row_overhead": shape.row_overhead} if shape.row_overhead else {}),
            **({"matmul_memory": _sig(stream[0])}
               if (stream := self.gemm_stream()) is not None else {}),
            **({"matmul_memory_k_overhead": stream[1]} if stream and stream[1] else {}),
            **({"attention_decode_memory": _sig(min(
                1.0, self.decode_attention_bytes_per_s / (self.memory_gb_per_s * 1e9)))}
               if self.decode_attention_bytes_per_s else {}),
            "matmul_tile_n": 1,
            "attention_kv_overhead": max(1, round(self.attention[0].k0)),
            **self.eager_host.to_efficiency(),
            **{key: _sig(value) for key, value in self.alignment.items()},
            **({"matmul_group_rows_overhead": group_rows}
               if (group_rows := self.group_rows_overhead) else {}),
        }
        return {
            "id": hw_id or self.hardware_id(),
            "name": f"{self.device.name} (measured, {self.device.kind}"
                    + (f", {self.device.threads} thread{'s' * (self.device.threads > 1)})"
                       if self.device.kind == "cpu" else ")"),
            "vendor": "measured",
            "source": (f"zrt calibrate on {self.date}: {self.device.provenance()}"
                       f", {len(self.gemm)} GEMMs, attention in {self.attention_dtype}, fit RMS "
                       + ", ".join(f"{f.dtype} {f.rms_rel_error:.1%}" for f in self.fits)
                       + (f"; {' and '.join(untimed)} not timed: the fp32 rate"
                          if untimed else "")),
            "compute": compute,
            "memory": {"capacity_gb": _sig(self.capacity_gb),
                       "bandwidth_gb_per_s": _sig(self.memory_gb_per_s)},
            "interconnect": [self._link_tier()],
            "efficiency": eff,
        }

    def _link_tier(self) -> dict[str, Any]:
        if self.link is None:
            # one device: its only "link" is a copy through its own memory
            return {"name": "local_copy", "bandwidth_gb_per_s": _sig(self.memory_gb_per_s),
                    "latency_us": _sig(self.launch_overhead_us), "devices": None,
                    "efficiency": 1.0}
        # the measured ranks of this machine; unbounded, as far as the pack knows
        return {"name": f"measured_{self.link.backend}_{self.link.ranks}_ranks",
                "bandwidth_gb_per_s": _sig(self.link.bandwidth_gb_per_s),
                "latency_us": _sig(self.link.latency_us), "devices": None,
                "efficiency": 1.0}

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device.to_json(), "date": self.date,
                "attention_dtype": self.attention_dtype, "capacity_gb": self.capacity_gb,
                "eager_host": self.eager_host.to_json(),
                "link": None if self.link is None else {
                    "ranks": self.link.ranks, "backend": self.link.backend,
                    "bandwidth_gb_per_s": self.link.bandwidth_gb_per_s,
                    "latency_us": self.link.latency_us,
                    "rms_rel_error": self.link.rms_rel_error,
                    "all_reduce": [{"bytes": b, "time_us": t * 1e6}
                                   for b, t in self.link.points]},
                "alignment": dict(self.alignment),
                "alignment_points": [dict(p) for p in self.alignment_points],
                "group_rows_overhead": self.group_rows_overhead,
                "decode_attention_gb_per_s": None if not self.decode_attention_bytes_per_s
                else self.decode_attention_bytes_per_s / 1e9,
                "grouped_points": [dict(p) for p in self.grouped_points],
                "memory_gb_per_s": self.memory_gb_per_s,
                "launch_overhead_us": self.launch_overhead_us,
                "vector_flops": self.vector_flops,
                "attention": [{"pass": p, "rate_tflops": f.rate_flops / 1e12, "kv0": f.k0,
                               "fixed_us": f.fixed_s * 1e6, "rms_rel_error": f.rms_rel_error}
                              for p, f in zip(("forward", "backward"), self.attention,
                                              strict=True)],
                "fits": [{"dtype": f.dtype, "rate_tflops": f.rate_flops / 1e12, "k0": f.k0,
                          "tile_m": f.tile_m, "row_overhead": f.row_overhead,
                          "fixed_us": f.fixed_s * 1e6, "rms_rel_error": f.rms_rel_error}
                         for f in self.fits],
                "gemm": [{"dtype": p.dtype, "m": p.m, "n": p.n, "k": p.k,
                          "time_us": p.time_s * 1e6} for p in self.gemm]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], capacity_gb: float | None = None
                  ) -> Calibration:
        """A calibration re-read from :meth:`to_json` (the ``calibration`` of
        ``zrt calibrate --json``), its GEMM grid and all-reduce points re-fitted by this
        version's :func:`fit_gemm` and :func:`~zrt_core.profile.collectives.fit_ring`: a
        pack re-derived from a device's measurements without the device
        (``zrt calibrate --from``). Attention keeps its fits (its points are not saved).

        :param capacity_gb: the device's memory where ``data`` does not say (files written
            before it did; the pack beside it in ``--json`` output has it).
        :raises SpecError: a key missing or of the wrong kind.
        """
        from zrt_core.errors import SpecError
        from zrt_core.profile.diff import HOST_PASSES

        try:
            dev = data["device"]
            device = Device(kind=str(dev["kind"]), name=str(dev["name"]),
                            threads=int(dev["threads"]), libraries=str(dev.get("libraries", "")),
                            torch_version=str(dev.get("torch") or ""))
            gemm = tuple(GemmPoint(str(g["dtype"]), int(g["m"]), int(g["n"]), int(g["k"]),
                                   float(g["time_us"]) / 1e6) for g in data["gemm"])
            dtypes = tuple(dict.fromkeys(p.dtype for p in gemm))
            fits = tuple(fit_gemm(d, grid_points(gemm, d)) for d in dtypes)
            attention = tuple(
                GemmFit(name, float(a["rate_tflops"]) * 1e12, float(a["kv0"]),
                        float(a["fixed_us"]) / 1e6, float(a["rms_rel_error"]))
                for name, a in zip(("attention_fwd", "attention_bwd"), data["attention"],
                                   strict=True))
            host = data.get("eager_host") or {}
            eager_host = EagerHost(
                per_node_us=tuple(float(host.get("per_node_us", {}).get(p, 0.0))
                                  for p in HOST_PASSES),
                fixed_us=tuple(float(host.get("fixed_us", {}).get(p, 0.0))
                               for p in HOST_PASSES))
            link = None
            if data.get("link"):
                from zrt_core.profile.collectives import fit_ring

                raw = data["link"]
                link = fit_ring([(int(q["bytes"]), float(q["time_us"]) / 1e6)
                                 for q in raw["all_reduce"]], int(raw["ranks"]),
                                str(raw.get("backend", "")))
            decode = data.get("decode_attention_gb_per_s")
            capacity = data.get("capacity_gb", capacity_gb)
            if capacity is None:
                raise KeyError("capacity_gb")
            return cls(device=device, gemm=gemm, fits=fits, attention=attention,
                       memory_gb_per_s=float(data["memory_gb_per_s"]),
                       launch_overhead_us=float(data["launch_overhead_us"]),
                       vector_flops=float(data["vector_flops"]),
                       capacity_gb=float(capacity), date=str(data["date"]),
                       attention_dtype=str(data.get("attention_dtype", "fp32")),
                       eager_host=eager_host, link=link,
                       alignment_points=tuple(data.get("alignment_points") or ()),
                       grouped_points=tuple(data.get("grouped_points") or ()),
                       decode_attention_bytes_per_s=None if not decode
                       else float(decode) * 1e9)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"not a saved calibration: {type(exc).__name__} {exc}",
                            "give the JSON that zrt calibrate --json printed") from None


def calibrate(device: Device, *, dtypes: Sequence[str] = DEFAULT_DTYPES,
              sizes: Sequence[int] = DEFAULT_SIZES, mem_mb: float = 64.0, repeats: int = 5,
              min_time_s: float = 0.02, ranks: int = 1,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Time the GEMM grid, the copy, the launch and the vector op on ``device``.

    :param sizes: GEMM dimensions; each (m, n, k) with m = n from ``sizes`` and k from
        ``sizes`` (and the reverse) is timed, so the K-loop and the fixed cost separate.
    :param ranks: time all-reduce over this many ranks (GPUs; CPU processes) for the pack's
        link; 1: none.
    :param progress: told each stage's name and the seconds since the start as it ends
        (a GPU's calibration takes minutes).
    :raises DeviceError: a dtype the device lacks; more ranks than GPUs.
    """
    import torch

    t0 = time.perf_counter()

    def done(stage: str) -> None:
        if progress is not None:
            progress(f"{stage} ({time.perf_counter() - t0:.0f} s)")

    if "fp32" not in dtypes:
        dtypes = ("fp32", *dtypes)
    for dtype in dtypes:
        device.check_dtype(dtype)
    if device.kind == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    dev = device.torch_device
    big = max(sizes)
    # the grid, and the weight-stream probes: a few rows over each smaller square weight
    # (the grid's own skinny rows cover the largest), timed in turn with the grid
    shapes = sorted({(s, s, k) for s in sizes for k in sizes}
                    | {(m, big, big) for m in SKINNY_ROWS if m < big}
                    | {(m, s, s) for m in STREAM_PROBE_ROWS for s in sizes if m < s < big})
    points = []
    for dtype in dtypes:
        times = _time_gemms(device, dtype, shapes, repeats, min_time_s, mem_mb)
        points.extend(GemmPoint(dtype, m, n, k, t)
                      for (m, n, k), t in zip(shapes, times, strict=True))
        done(f"{dtype} GEMMs")
    fits = tuple(fit_gemm(dtype, grid_points(points, dtype)) for dtype in dtypes)

    numel = int(mem_mb * 1e6 / 4)
    src = torch.ones(numel, device=dev)
    dst = torch.empty_like(src)
    copy_s = time_call(device, lambda: dst.copy_(src), repeats=repeats,
                       min_time_s=min_time_s)[0]
    memory = 2 * numel * 4 / copy_s / 1e9
    done("copy")

    launch_s = _launch_s(device, repeats, min_time_s)
    done("launch")

    attention_dtype = "bf16" if device.kind == "cuda" and "bf16" in dtypes else "fp32"
    attention = _attention_fits(device, sizes, repeats, min_time_s, attention_dtype)
    decode_attention = _decode_attention_rate(device, attention_dtype, repeats, min_time_s,
                                              mem_mb)
    done("attention")
    vector = _vector_flops(device, launch_s, repeats, min_time_s)
    done("pointwise ops")
    # its steps take a millisecond or two: 50 at least, the best of them (a busy machine)
    eager_host = eager_host_probe(device, max(repeats, 50))
    done("eager host")
    align_dtype = attention_dtype if attention_dtype in dtypes else "fp32"
    alignment_points = _alignment_points(device, align_dtype, max(sizes), repeats, min_time_s)
    done("unaligned GEMMs")
    grouped_points = _grouped_points(device, align_dtype, max(sizes), repeats, min_time_s)
    done("grouped GEMMs")
    link = None
    if ranks > 1:
        from zrt_core.profile.collectives import measure_link

        link = measure_link(device.kind, ranks, repeats=repeats)
        done("all-reduce")
    return Calibration(device=device, gemm=points, fits=fits, memory_gb_per_s=memory,
                       launch_overhead_us=launch_s * 1e6, attention=attention,
                       vector_flops=vector, attention_dtype=attention_dtype,
                       eager_host=eager_host, link=link,
                       alignment_points=alignment_points, grouped_points=grouped_points,
                       decode_attention_bytes_per_s=decode_attention,
                       capacity_gb=_capacity_gb(device),
                       date=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"))


def _launch_s(device: Device, repeats: int, min_time_s: float) -> float:
    """Seconds a kernel costs beyond its work: a one-element ``add``.

    On a CPU that is the call (dispatch and all), timed back to back. On a GPU a timed loop
    of adds measures the host instead (it issues one every ~12 µs on an H100 machine, while
    the GPU runs one in a few): so :func:`time_call` queues the adds while the GPU sleeps,
    and CUDA events around them time what the device alone spends per kernel of an eager
    stream. The host's
    own cost per op is the pack's ``eager_host_*`` (:func:`_eager_host`); before this, both
    carried the host and ``zrt diff``'s ops of a decode step on an H100 came out 1.25× of
    the profiler's (docs/profile.md).
    """
    import torch

    one = torch.ones(1, device=device.torch_device)
    return time_call(device, lambda: torch.add(one, one), repeats=repeats,
                     min_time_s=min_time_s)[0]


def _gemm_call(device: Device, dtype: str, m: int, n: int, k: int, mem_mb: float
               ) -> Callable[[], Any]:
    """One GEMM of the grid, ready to time: in F.linear's layout (``x @ W.t()``, W
    ``[n, k]``, as a model's GEMMs and ``zrt profile``'s run), the weight cycled through
    ``mem_mb`` of copies (beyond the caches); fp8 by ``torch._scaled_mm``."""
    import torch

    dev = device.torch_device
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
        scale = torch.ones((), device=dev)
        return lambda: torch._scaled_mm(a, b, scale, scale, out_dtype=torch.bfloat16)
    torch_type = getattr(torch, TORCH_DTYPES[dtype])
    x = torch.randn(m, k, device=dev, dtype=torch_type)
    copies = max(1, math.ceil(mem_mb * 1e6 / (k * n * torch_type.itemsize)))
    weights = [torch.randn(n, k, device=dev, dtype=torch_type) for _ in range(copies)]
    turn = iter(range(1 << 62))
    return lambda: torch.mm(x, weights[next(turn) % copies].t())


def _time_gemms(device: Device, dtype: str, shapes: Sequence[tuple[int, int, int]],
                repeats: int, min_time_s: float, mem_mb: float) -> list[float]:
    """Seconds per GEMM of each shape in ``dtype``: the best of ``repeats`` samples, taken
    in turn over the shapes (:func:`~zrt_core.profile.device.best_interleaved`)."""
    import torch

    if dtype == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        calls = [_gemm_call(device, dtype, m, n, k, mem_mb) for m, n, k in shapes]
        return best_interleaved(device, calls, repeats=repeats, min_time_s=min_time_s)
    finally:
        if dtype == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = False


#: the three GEMMs of an output layer's training step: forward ``x Wᵀ``, input gradient
#: ``dY W``, weight gradient ``dYᵀ X`` (``benchmarks/gpu_alignment.py``'s)
ALIGNMENT_GEMMS = ("forward x@W^T", "input grad dY@W", "weight grad dY^T@X")


def _alignment_points(device: Device, dtype: str, size: int, repeats: int,
                      min_time_s: float) -> list[dict[str, Any]]:
    """The output layer's three GEMMs (:data:`ALIGNMENT_GEMMS`; ``size`` tokens, hidden
    ``size / 2``, a "vocabulary" of ``4 × size``) in ``dtype`` with the vocabulary's rows
    aligned to 16 bytes, and made 1 and 2 elements longer (rows of one and two elements'
    bytes: 2 and 4 in a 16-bit type, 4 and 8 in fp32): each a row as
    :func:`fit_alignment` reads it."""
    import torch

    dev = device.torch_device
    torch_type = getattr(torch, TORCH_DTYPES[dtype])
    size_bytes = torch_type.itemsize
    tokens, hidden = size, max(16, size // 2)
    base = 4 * size
    x = torch.randn(tokens, hidden, device=dev, dtype=torch_type)
    points = []
    for vocab in (base, base + 1, base + 2):
        w = torch.randn(vocab, hidden, device=dev, dtype=torch_type)
        dy = torch.randn(tokens, vocab, device=dev, dtype=torch_type)
        row = vocab * size_bytes
        calls = (lambda w=w: torch.nn.functional.linear(x, w), lambda dy=dy, w=w: dy @ w,
                 lambda dy=dy: dy.t() @ x)
        for name, call in zip(ALIGNMENT_GEMMS, calls, strict=True):
            seconds = time_call(device, call, repeats=repeats, min_time_s=min_time_s)[0]
            points.append({"gemm": name, "tokens": tokens, "hidden": hidden, "vocab": vocab,
                           "dtype": dtype, "row_alignment_bytes": min(16, row & -row),
                           "tflops": 2 * tokens * hidden * vocab / seconds / 1e12})
    return points


def fit_alignment(points: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The pack's ``matmul_unaligned_8b`` and ``matmul_unaligned_2b`` from timed GEMMs
    (``gemm``, ``tokens``, ``hidden``, ``row_alignment_bytes``, ``tflops``): each unaligned
    GEMM's rate over the geometric mean of the aligned (16-byte) rates of the same GEMM and
    shape; the geometric mean of those ratios per class (rows aligned to 4 or 8 bytes; to
    2 or less), capped at 1. A class with no timing is left out (the pack's default, 1)."""
    aligned: dict[tuple[Any, ...], list[float]] = {}
    for row in points:
        if row.get("row_alignment_bytes") == 16:
            key = (row["gemm"], row["tokens"], row["hidden"])
            aligned.setdefault(key, []).append(math.log(row["tflops"]))
    logs: dict[str, list[float]] = {"matmul_unaligned_8b": [], "matmul_unaligned_2b": []}
    for row in points:
        align = row.get("row_alignment_bytes")
        ref = aligned.get((row.get("gemm"), row.get("tokens"), row.get("hidden")))
        if align is None or align >= 16 or not ref:
            continue
        key = "matmul_unaligned_8b" if align >= 4 else "matmul_unaligned_2b"
        logs[key].append(math.log(row["tflops"]) - sum(ref) / len(ref))
    return {key: min(1.0, round(math.exp(sum(v) / len(v)), 3))
            for key, v in logs.items() if v}


#: groups of the grouped-GEMM probe, and its rows per group as fractions of the largest size
GROUPED_PROBE_GROUPS = 8
GROUPED_PROBE_ROWS = (1 / 32, 1 / 16, 1 / 8)


def _grouped_points(device: Device, dtype: str, size: int, repeats: int,
                    min_time_s: float) -> list[dict[str, Any]]:
    """A training step's grouped GEMM (forward and backward of ``torch._grouped_mm``, as
    transformers' experts run it: the weight ``[G, N, K]`` transposed) against the dense
    GEMM of the same FLOPs, over :data:`GROUPED_PROBE_GROUPS` groups of
    :data:`GROUPED_PROBE_ROWS` × ``size`` rows each, ``k = n = size / 2``: each a row as
    :func:`fit_group_rows` reads it. No points where this torch has no ``_grouped_mm``
    for the device and dtype (the pack then leaves the overhead at 0)."""
    import torch

    dev = device.torch_device
    torch_type = getattr(torch, TORCH_DTYPES[dtype])
    groups, k = GROUPED_PROBE_GROUPS, max(16, size // 2)
    points = []
    for share in GROUPED_PROBE_ROWS:
        rows = max(8, round(size * share))
        m = groups * rows
        x = torch.randn(m, k, device=dev, dtype=torch_type, requires_grad=True)
        w = torch.randn(groups, k, k, device=dev, dtype=torch_type).transpose(-2, -1)
        w = w.detach().requires_grad_(True)
        dense = torch.randn(k, k, device=dev, dtype=torch_type).t().detach()
        dense.requires_grad_(True)
        offs = torch.arange(rows, m + 1, rows, device=dev, dtype=torch.int32)
        grad = torch.randn(m, k, device=dev, dtype=torch_type)

        def grouped(x: Any = x, w: Any = w, offs: Any = offs, grad: Any = grad) -> None:
            torch._grouped_mm(x, w, offs=offs).backward(grad)

        def plain(x: Any = x, dense: Any = dense, grad: Any = grad) -> None:
            (x @ dense).backward(grad)

        try:
            grouped_s = time_call(device, grouped, repeats=repeats, min_time_s=min_time_s)[0]
        except (RuntimeError, NotImplementedError, AttributeError):
            # AttributeError: a torch without _grouped_mm; the others: no kernel for this
            # device, dtype or layout
            return []
        dense_s = time_call(device, plain, repeats=repeats, min_time_s=min_time_s)[0]
        points.append({"groups": groups, "rows": rows, "k": k, "n": k, "dtype": dtype,
                       "grouped_us": grouped_s * 1e6, "dense_us": dense_s * 1e6})
    return points


def fit_group_rows(points: Sequence[Mapping[str, Any]]) -> int | None:
    """``matmul_group_rows_overhead`` from timed grouped and dense GEMMs (``rows``,
    ``grouped_us``, ``dense_us``): a grouped GEMM of ``m`` rows per group runs at
    ``m / (m + m0)`` of the dense rate, so each point gives ``m0 = m · (grouped / dense −
    1)``; the median of them (0 where the grouped runs as fast), None without points."""
    if not points:
        return None
    m0 = sorted(max(0.0, p["rows"] * (p["grouped_us"] / p["dense_us"] - 1)) for p in points)
    mid = len(m0) // 2
    value = m0[mid] if len(m0) % 2 else (m0[mid - 1] + m0[mid]) / 2
    return round(value)


def _vector_flops(device: Device, launch_s: float, repeats: int, min_time_s: float
                  ) -> float:
    """Geometric mean over :data:`VECTOR_OPS` of elements per second (launch taken off) on
    an fp32 tensor in the caches: 32k elements on a CPU (128 kB: a core's L2); 4M on a GPU
    (16 MB in and 16 MB out: within an H100's 50 MB L2), where 32k elements take less time
    than the launch and left nothing to measure."""
    import torch
    import torch.nn.functional as F

    numel = 4 * 1024 * 1024 if device.kind == "cuda" else 32 * 1024
    x = torch.rand(numel, device=device.torch_device) + 0.5
    ops = {"mul": lambda: x * x, "add": lambda: x + x, "neg": lambda: -x,
           "rsqrt": lambda: torch.rsqrt(x), "silu": lambda: F.silu(x),
           "gelu": lambda: F.gelu(x), "exp": lambda: torch.exp(x), "pow2": lambda: x.pow(2)}
    logs = []
    for name in VECTOR_OPS:
        t = time_call(device, ops[name], repeats=repeats, min_time_s=min_time_s)[0]
        logs.append(math.log(x.numel() / max(t - launch_s, 0.05 * t)))
    return math.exp(sum(logs) / len(logs))


def _attention_fits(device: Device, sizes: Sequence[int], repeats: int, min_time_s: float,
                    dtype: str = "fp32") -> tuple[GemmFit, GemmFit]:
    """Causal SDPA forward and backward in ``dtype`` fitted like a GEMM, with the visible
    keys per query in the place of k (FLOPs as zrt counts them: ``AttentionDims``)."""
    import torch
    import torch.nn.functional as F

    from zrt_core.cost.opdims import AttentionDims

    dev = device.torch_device
    torch_type = getattr(torch, TORCH_DTYPES[dtype])
    b, h, d = (2, 32, 128) if device.kind == "cuda" else (1, 4, 64)
    forward, backward = [], []
    # the GEMM sizes and twice the largest: three lengths at least for a three-number fit
    lengths = sorted({*sizes, 2 * max(sizes)})
    calls = []
    for s in lengths:
        q, k, v = (torch.randn(b, h, s, d, device=dev, dtype=torch_type, requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(b, h, s, d, device=dev, dtype=torch_type)

        def fwd(q: Any = q, k: Any = k, v: Any = v) -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def both(q: Any = q, k: Any = k, v: Any = v, grad: Any = grad) -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

        calls += [fwd, both]
    times = best_interleaved(device, calls, repeats=repeats, min_time_s=min_time_s)
    for i, s in enumerate(lengths):
        fwd_s, both_s = times[2 * i], times[2 * i + 1]
        dims = AttentionDims(b=b, h=h, h_kv=h, s_q=s, s_kv=s, d=d, causal=True)
        visible = round(dims.visible_keys)
        # a GemmPoint's flops are 2mnk: m·n·k carries the attention FLOPs over 2
        forward.append(GemmPoint(dtype, 1, dims.forward_flops // (2 * visible), visible,
                                 fwd_s))
        backward.append(GemmPoint(dtype, 1, dims.backward_flops // (2 * visible), visible,
                                  max(both_s - fwd_s, both_s * 0.05)))
    # one "row" per point: neither a row tile nor a row overhead means anything here
    return (fit_gemm("attention_fwd", forward, tiles=(1,), row_overheads=()),
            fit_gemm("attention_bwd", backward, tiles=(1,), row_overheads=()))


#: the decode-attention probe: (batch, KV heads = heads, head dim, cached tokens), one query
DECODE_PROBE = {"cpu": (4, 8, 64, 512), "cuda": (16, 8, 128, 4096)}


def _decode_attention_rate(device: Device, dtype: str, repeats: int, min_time_s: float,
                           mem_mb: float) -> float:
    """Bytes of KV cache per second that PyTorch's SDPA streams for one query per sequence
    (:data:`DECODE_PROBE`), the caches cycled through ``mem_mb`` of copies as a decode
    step's layers read theirs from memory, the launch included: the pack's
    ``attention_decode_memory`` is this over the copy's bandwidth."""
    import torch
    import torch.nn.functional as F

    b, h, d, kv = DECODE_PROBE["cuda" if device.kind == "cuda" else "cpu"]
    dev = device.torch_device
    torch_type = getattr(torch, TORCH_DTYPES[dtype])
    cache_bytes = 2 * b * h * kv * d * torch_type.itemsize
    copies = max(1, math.ceil(mem_mb * 1e6 / cache_bytes))
    caches = [(torch.randn(b, h, kv, d, device=dev, dtype=torch_type),
               torch.randn(b, h, kv, d, device=dev, dtype=torch_type)) for _ in range(copies)]
    q = torch.randn(b, h, 1, d, device=dev, dtype=torch_type)
    turn = iter(range(1 << 62))

    def step() -> None:
        k, v = caches[next(turn) % copies]
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v)

    return cache_bytes / time_call(device, step, repeats=repeats, min_time_s=min_time_s)[0]


def _capacity_gb(device: Device) -> float:
    if device.kind == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / 1e9
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 1.0
