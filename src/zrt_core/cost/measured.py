"""Measured kernel-time tables shipped by hardware plugins (CSV package data), and the cost
backend that prices nodes from them: exactly, or interpolated between neighbouring rows.

CSV format (UTF-8, one header line, columns in any order, ``#`` lines are comments)::

    hardware_id,op,dtype,b,m,n,k,h,h_kv,s_q,s_kv,d,causal,flops,bytes,time_us,source
    nvidia_h100_sxm,gemm,bfloat16,1,4096,4096,4096,,,,,,,,,175.5,"OpenXLA ..."

``hardware_id``, ``op``, ``dtype``, ``time_us`` and ``source`` are required; every other
column is optional in the header, and a cell may be blank where the op does not use it.
``op`` is an op class or an exact graph op name:

=================  ===========================================  ============================
op                 key (must be set)                            FLOPs / bytes when blank
=================  ===========================================  ============================
``gemm``           b (default 1), m, n, k                       2bmnk; b(mk+kn)·e + bmn·o
``grouped_gemm``   b = groups, m = rows per group, n, k         as gemm
``attention_fwd``  b, h, h_kv (default h), s_q, s_kv, d, causal  4·b·h·pairs·d; Q,K,V,O once
``attention_bwd``  as attention_fwd                             2.5 × forward; Q,K,V,O,dO,
                                                                dQ,dK,dV once
any graph op name  flops, bytes (bytes required)                given
=================  ===========================================  ============================

``e`` is the bytes per element of ``dtype`` and ``o`` of the output (2 — bf16 — for 8- and
4-bit inputs, else ``e``); ``pairs`` are the (query, key) pairs a causal mask keeps.
``dtype`` is the dtype the kernel computes in (a GEMM's wider operand, attention's query).

Lookup of a node (see :class:`MeasuredBackend`): a row with the node's op class, dtype and
key is an exact hit (``measured``). Otherwise the rows of the same op class and dtype (and,
for attention, head dim and mask) are searched in (ln FLOPs, ln bytes) space: the nearest
up to :data:`NEIGHBOURS` rows each give the fraction of the peak roofline they achieved,
``max(F/peak, B/HBM) / time``; the node's time is its own peak roofline over the
inverse-distance weighted geometric mean of those fractions (``interpolated``). A node
whose nearest row is farther than :data:`MAX_DISTANCE` (a factor of 4 in FLOPs or bytes) is
left to the next backend: the table does not extrapolate. Nor does it for a GEMM whose m, n
or k lies outside the range the table's rows of its class and dtype measured (m and n
within the rows' m and n values together: a GEMM and its transpose are one kernel): near in
(ln FLOPs, ln bytes) is not near in shape (a 32-row decode GEMM has the FLOPs and bytes of
a batched 256-row one, but fills a quarter of each 128-row tile and streams its weights at
a bandwidth the compute-bound rows never show), and borrowing the rows' achieved fraction
there made a batch-64 decode step faster than batch 32's. The roofline, whose tile model
was fitted to the same rows, prices such a node.
"""

from __future__ import annotations

import csv
import heapq
import math
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.cost.backend import NodeCost, PriceSource
from zrt_core.cost.opdims import (
    AttentionDims,
    attention_dims,
    gemm_compute_dtype,
    gemm_dims,
    gemm_operand_dtypes,
    is_backward,
)
from zrt_core.errors import SpecError
from zrt_core.hardware import _DTYPE_TO_COMPUTE
from zrt_core.ir.graph import DTYPE_BYTES, Category, OpNode

if TYPE_CHECKING:
    from zrt_core.hardware import HardwareSpec
    from zrt_core.plugins import PluginHost

NAME = "measured"
PRIORITY = 100
#: Farthest nearest neighbour (in ln FLOPs, ln bytes) that still interpolates: ln 4.
MAX_DISTANCE = math.log(4.0)
#: Rows that vote in an interpolation.
NEIGHBOURS = 3

REQUIRED = ("hardware_id", "op", "dtype", "time_us", "source")
SHAPE_FIELDS = ("b", "m", "n", "k", "h", "h_kv", "s_q", "s_kv", "d")
COLUMNS = frozenset((*REQUIRED, *SHAPE_FIELDS, "causal", "flops", "bytes", "notes"))
GEMM_CLASSES = ("gemm", "grouped_gemm")
ATTENTION_CLASSES = ("attention_fwd", "attention_bwd")
_NEEDS = {"gemm": ("m", "n", "k"), "grouped_gemm": ("b", "m", "n", "k"),
          "attention_fwd": ("b", "h", "s_q", "s_kv", "d"),
          "attention_bwd": ("b", "h", "s_q", "s_kv", "d")}


@frozen
class MeasuredTable:
    """One CSV of measured kernel times for one hardware id.

    :param name: unique table name (``nvidia_h100_sxm/gemm``).
    :param hardware_id: the hardware the times were measured on.
    :param path: the CSV file (format in this module's docstring).
    :param description: how and where it was measured.
    :param opt_in: priced from only when a run names it (``--tables NAME``): times of
        kernels as eager PyTorch runs them one by one (``zrt profile``) are right for an
        eager step and wrong for an engine that fuses and graph-replays them.
    """

    name: str
    hardware_id: str
    path: str
    description: str = ""
    opt_in: bool = False

    def load(self) -> tuple[MeasuredRow, ...]:
        """The validated rows; a malformed file raises :class:`SpecError` naming file and row."""
        p = Path(self.path)
        try:
            stat = p.stat()
        except OSError as exc:
            raise SpecError(f"measured table {self.name!r}: cannot read {self.path} "
                            f"({exc.strerror or exc})",
                            "reinstall the plugin that ships it") from None
        return _load_cached(str(p), stat.st_mtime_ns, stat.st_size, self.hardware_id, self.name)


@frozen
class MeasuredRow:
    """One measured kernel: its op class, dtype, key, FLOPs, bytes and time."""

    op: str
    dtype: str
    key: tuple[Any, ...]
    flops: float
    bytes: float
    time_s: float
    source: str
    line: int
    table: str
    shape: dict[str, Any] = field(factory=dict, eq=False)

    @property
    def group(self) -> tuple[Any, ...]:
        """Rows that may interpolate among each other share a group."""
        if self.op in ATTENTION_CLASSES:
            return (self.op, self.dtype, *self.key[5:])
        return (self.op, self.dtype)


@lru_cache(maxsize=64)
def _load_cached(path: str, _mtime: int, _size: int, hardware_id: str, table: str
                 ) -> tuple[MeasuredRow, ...]:
    return tuple(load_csv(path, hardware_id=hardware_id, table=table))


def load_csv(path: str | os.PathLike[str], *, hardware_id: str | None = None,
             table: str = "") -> list[MeasuredRow]:
    """Read and validate a measured-table CSV.

    :param hardware_id: when given, every row must name it.
    :raises SpecError: an unknown or missing column, a bad value, a duplicate key; the
        message names the file and the line.
    """
    name = os.fspath(path)
    where = Path(name).name
    try:
        with open(name, encoding="utf-8", newline="") as fh:
            lines = [(i, line) for i, line in enumerate(fh, start=1)
                     if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise SpecError(f"{name}: cannot read ({exc.strerror or exc})") from None
    if not lines:
        raise SpecError(f"{where}: empty measured table", "the first line is the header")
    reader = csv.reader([line for _, line in lines])
    header = [h.strip() for h in next(reader)]
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise SpecError(f"{where}: line {lines[0][0]}: unknown column {unknown[0]!r}",
                        f"columns are {', '.join(sorted(COLUMNS))}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise SpecError(f"{where}: line {lines[0][0]}: missing column {missing[0]!r}",
                        f"required columns are {', '.join(REQUIRED)}")
    duplicated = {h for h in header if header.count(h) > 1}
    if duplicated:
        raise SpecError(f"{where}: line {lines[0][0]}: column {sorted(duplicated)[0]!r} "
                        "appears twice")
    rows: list[MeasuredRow] = []
    seen: dict[tuple[Any, ...], int] = {}
    for (lineno, _), cells in zip(lines[1:], reader, strict=True):
        if len(cells) != len(header):
            raise SpecError(f"{where}: line {lineno}: {len(cells)} cells for "
                            f"{len(header)} columns")
        raw = {h: c.strip() for h, c in zip(header, cells, strict=True)}
        row = _parse_row(raw, f"{where}: line {lineno}", lineno, table or where)
        if hardware_id is not None and raw["hardware_id"] != hardware_id:
            raise SpecError(f"{where}: line {lineno}: hardware_id {raw['hardware_id']!r} "
                            f"in a table for {hardware_id!r}",
                            "one table holds one hardware id")
        ident = (raw["hardware_id"], row.op, row.dtype, row.key)
        if ident in seen:
            raise SpecError(f"{where}: line {lineno}: same op, dtype and shape as line "
                            f"{seen[ident]}", "keep one measurement per shape")
        seen[ident] = lineno
        rows.append(row)
    return rows


def _parse_row(raw: dict[str, str], where: str, lineno: int, table: str) -> MeasuredRow:
    op, dtype = raw["op"], raw["dtype"]
    if not op:
        raise SpecError(f"{where}: op is empty")
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"{where}: unknown dtype {dtype!r}",
                        f"use one of {', '.join(sorted(DTYPE_BYTES))}")
    if not raw["source"]:
        raise SpecError(f"{where}: source is empty", "say where the number was published")
    time_us = _number(raw, "time_us", where, required=True)
    shape: dict[str, Any] = {}
    for name in SHAPE_FIELDS:
        value = raw.get(name, "")
        if value:
            if not value.isdigit() or int(value) <= 0:
                raise SpecError(f"{where}: {name} must be a positive integer, got {value!r}")
            shape[name] = int(value)
    causal_raw = raw.get("causal", "").lower()
    if causal_raw not in ("", "0", "1", "true", "false"):
        raise SpecError(f"{where}: causal must be 0, 1, true or false, got {raw['causal']!r}")
    causal = causal_raw in ("1", "true")
    flops = _number(raw, "flops", where)
    nbytes = _number(raw, "bytes", where)
    if op in _NEEDS:
        absent = [f for f in _NEEDS[op] if f not in shape]
        if absent:
            raise SpecError(f"{where}: op {op!r} needs {', '.join(absent)}")
    e = DTYPE_BYTES[dtype]
    if op in GEMM_CLASSES:
        b, m, n, k = shape.get("b", 1), shape["m"], shape["n"], shape["k"]
        key: tuple[Any, ...] = (b, m, n, k)
        o = 2 if e < 2 else e
        flops = flops if flops is not None else 2.0 * b * m * n * k
        nbytes = nbytes if nbytes is not None else b * (m * k + k * n) * e + b * m * n * o
        shape = {"b": b, "m": m, "n": n, "k": k}
    elif op in ATTENTION_CLASSES:
        if "causal" not in raw:
            raise SpecError(f"{where}: op {op!r} needs the causal column")
        dims = AttentionDims(b=shape["b"], h=shape["h"], h_kv=shape.get("h_kv", shape["h"]),
                             s_q=shape["s_q"], s_kv=shape["s_kv"], d=shape["d"], causal=causal)
        key = _attention_key(dims)
        backward = op == "attention_bwd"
        if flops is None:
            flops = dims.backward_flops if backward else dims.forward_flops
        if nbytes is None:
            q_side = dims.b * dims.h * dims.s_q * dims.d
            kv_side = dims.b * dims.h_kv * dims.s_kv * dims.d
            nbytes = e * (2 * q_side + 2 * kv_side) * (2 if backward else 1)
        shape = {"b": dims.b, "h": dims.h, "h_kv": dims.h_kv, "s_q": dims.s_q,
                 "s_kv": dims.s_kv, "d": dims.d, "causal": dims.causal}
    else:
        if nbytes is None:
            raise SpecError(f"{where}: op {op!r} is not an op class, so it needs bytes",
                            f"op classes are {', '.join((*GEMM_CLASSES, *ATTENTION_CLASSES))}")
        flops = flops or 0.0
        key = (flops, nbytes)
    if flops < 0 or nbytes <= 0:
        raise SpecError(f"{where}: flops must be >= 0 and bytes > 0")
    return MeasuredRow(op=op, dtype=dtype, key=key, flops=float(flops), bytes=float(nbytes),
                       time_s=time_us * 1e-6, source=raw["source"], line=lineno, table=table,
                       shape=shape)


def _number(raw: dict[str, str], name: str, where: str, *, required: bool = False
            ) -> float | None:
    value = raw.get(name, "")
    if not value:
        if required:
            raise SpecError(f"{where}: {name} is required")
        return None
    try:
        number = float(value)
    except ValueError:
        raise SpecError(f"{where}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (name == "time_us" and number == 0):
        raise SpecError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return number


def _attention_key(dims: AttentionDims) -> tuple[Any, ...]:
    """Shape key of an attention call; entries 5.. (head dims, mask) must match to
    interpolate. Table rows have d_v = d and no window, chunk or top-k."""
    return (dims.b, dims.h, dims.h_kv, dims.s_q, dims.s_kv, dims.d, dims.d_v or dims.d,
            dims.causal, dims.window, dims.chunk, dims.topk)


# -- the backend ------------------------------------------------------------------------


@frozen
class NodeKey:
    """How a node looks up in a table: op class, dtype, key, and its FLOPs and bytes."""

    op: str
    dtype: str
    key: tuple[Any, ...]
    flops: float
    bytes: float
    group: tuple[Any, ...]


def node_key(node: OpNode) -> NodeKey | None:
    """The table key of a node, or None for nodes tables never cover (views, collectives)."""
    if node.zero_cost or node.category in (Category.VIEW, Category.COLLECTIVE):
        return None
    nbytes = node.bytes or (sum(t.nbytes for t in node.inputs)
                            + sum(t.nbytes for t in node.outputs if not t.is_view))
    if node.category == Category.MATMUL:
        dims = gemm_dims(node)
        if dims is None:
            return None
        if len(set(gemm_operand_dtypes(node))) > 1:
            return None  # weight-only quantised: its bytes are not a table row's
        op = "grouped_gemm" if dims.grouped else "gemm"
        dtype = gemm_compute_dtype(node)
        return NodeKey(op, dtype, (dims.batch, dims.m, dims.n, dims.k),
                       float(node.flops or dims.flops), float(nbytes), (op, dtype))
    if node.category == Category.ATTENTION:
        dims = attention_dims(node)
        if dims is None:
            return None
        backward = is_backward(node)
        op = "attention_bwd" if backward else "attention_fwd"
        dtype = next((t.dtype for t in node.inputs if len(t.shape) == 4), node.inputs[0].dtype)
        flops = node.flops or (dims.backward_flops if backward else dims.forward_flops)
        key = _attention_key(dims)
        return NodeKey(op, dtype, key, float(flops), float(nbytes), (op, dtype, *key[5:]))
    tensors = node.inputs or node.outputs
    dtype = tensors[0].dtype if tensors else "float32"
    return NodeKey(node.op, dtype, (float(node.flops), float(nbytes)), float(node.flops),
                   float(nbytes), (node.op, dtype))


class MeasuredBackend:
    """Prices nodes from the measured tables of one hardware id (see the module docstring)."""

    name = NAME

    def __init__(self, hardware: HardwareSpec, rows: Iterable[MeasuredRow]) -> None:
        self.hardware = hardware
        self._exact: dict[tuple[Any, ...], MeasuredRow] = {}
        self._groups: dict[tuple[Any, ...], list[MeasuredRow]] = {}
        for row in rows:
            self._exact[(row.op, row.dtype, row.key)] = row
            self._groups.setdefault(row.group, []).append(row)
        # the m/n and k ranges each GEMM group measured: interpolation stays inside them
        # (m and n together: a GEMM and its transpose are one kernel)
        self._gemm_box: dict[tuple[Any, ...], tuple[tuple[float, float], ...]] = {
            group: ((min(min(r.key[1:3]) for r in rows), max(max(r.key[1:3]) for r in rows)),
                    (min(r.key[3] for r in rows), max(r.key[3] for r in rows)))
            for group, rows in self._groups.items() if group[0] in GEMM_CLASSES}
        self._hbm = hardware.memory.bandwidth_gb_per_s * 1e9
        self._peaks: dict[str, float] = {}
        self._prepared: dict[tuple[Any, ...], list[tuple[float, float, float, MeasuredRow]]] = {}

    @classmethod
    def for_hardware(cls, hardware: HardwareSpec, host: PluginHost) -> MeasuredBackend | None:
        """The ``CostBackendSpec`` factory: None when no table names this hardware."""
        tables = [t for t in host.measured_tables
                  if t.hardware_id == hardware.id and not t.opt_in]
        if not tables:
            return None
        rows: list[MeasuredRow] = []
        for table in tables:
            rows.extend(table.load())
        return cls(hardware, rows)

    def price(self, node: OpNode) -> NodeCost | None:
        wanted = node_key(node)
        if wanted is None:
            return None
        row = self._exact.get((wanted.op, wanted.dtype, wanted.key))
        if row is not None:
            cost = NodeCost(
                time_s=row.time_s, backend=NAME, rule=f"{row.op}_exact",
                source=PriceSource.MEASURED, bound=self._bound(wanted),
                detail={"table": row.table, "line": row.line, "source": row.source,
                        "time_us": row.time_s * 1e6, "shape": row.shape})
        else:
            cost = self.interpolate(wanted)
        return self._sustained(cost, wanted)

    def _sustained(self, cost: NodeCost | None, wanted: NodeKey) -> NodeCost | None:
        """A GEMM row is an isolated-kernel time: inside a workload it runs at
        ``efficiency.matmul_sustained`` of that rate (``matmul_sustained_16bit`` for a
        bf16/fp16 GEMM, where the pack sets one; 1: as measured)."""
        factor = self.hardware.efficiency.gemm_sustained(
            _DTYPE_TO_COMPUTE.get(wanted.dtype, ""))
        if cost is None or factor == 1.0 or "gemm" not in wanted.op:
            return cost
        return evolve(cost, time_s=cost.time_s / factor,
                      detail={**cost.detail, "sustained": factor})

    def interpolate(self, wanted: NodeKey) -> NodeCost | None:
        points = self._points(wanted.group, wanted.dtype)
        if not points or (wanted.flops <= 0 and wanted.bytes <= 0):
            return None
        box = self._gemm_box.get(wanted.group)
        if box is not None and not (box[0][0] <= min(wanted.key[1:3])
                                    and max(wanted.key[1:3]) <= box[0][1]
                                    and box[1][0] <= wanted.key[3] <= box[1][1]):
            return None  # m, n or k outside the measured range (module docstring)
        has_flops = wanted.flops > 0
        lf = math.log(wanted.flops) if has_flops else 0.0
        lb = math.log(wanted.bytes) if wanted.bytes > 0 else 0.0
        scored = [((plf - lf) ** 2 + (plb - lb) ** 2, i)
                  for i, (plf, plb, _, row) in enumerate(points)
                  if (row.flops > 0) == has_flops]
        if not scored:
            return None
        near = heapq.nsmallest(NEIGHBOURS, scored)
        if near[0][0] > MAX_DISTANCE ** 2:
            return None
        if near[0][0] == 0.0:  # same work, another shape (m and n swapped, say)
            near = near[:1]
        chosen = [(math.sqrt(d2), points[i]) for d2, i in near]
        weights = [1.0 / d if d > 0 else 1.0 for d, _ in chosen]
        total = sum(weights)
        log_fraction = sum(w * p[2] for w, (_, p) in zip(weights, chosen, strict=True)) / total
        fraction = math.exp(log_fraction)
        ideal = self._ideal(wanted.flops, wanted.bytes, self._peak(wanted.dtype))
        neighbours = [{"table": p[3].table, "line": p[3].line, "shape": p[3].shape,
                       "time_us": p[3].time_s * 1e6, "distance": d, "weight": w / total,
                       "achieved_fraction": math.exp(p[2])}
                      for w, (d, p) in zip(weights, chosen, strict=True)]
        return NodeCost(
            time_s=ideal / fraction, backend=NAME, rule=f"{wanted.op}_interpolated",
            source=PriceSource.INTERPOLATED, bound=self._bound(wanted),
            detail={"method": "inverse-distance geometric mean of achieved roofline fraction "
                              "in (ln FLOPs, ln bytes)",
                    "flops": wanted.flops, "bytes": wanted.bytes, "ideal_s": ideal,
                    "achieved_fraction": fraction, "neighbours": neighbours})

    def _points(self, group: tuple[Any, ...], dtype: str
                ) -> list[tuple[float, float, float, MeasuredRow]]:
        """(ln FLOPs, ln bytes, ln achieved fraction, row) of a group, computed once."""
        points = self._prepared.get(group)
        if points is None:
            peak = self._peak(dtype)
            points = [(math.log(r.flops) if r.flops > 0 else 0.0, math.log(r.bytes),
                       math.log(self._ideal(r.flops, r.bytes, peak) / r.time_s), r)
                      for r in self._groups.get(group, ())]
            self._prepared[group] = points
        return points

    def _peak(self, dtype: str) -> float:
        peak = self._peaks.get(dtype)
        if peak is None:
            try:
                peak = self.hardware.compute.peak_tflops(dtype) * 1e12
            except SpecError:  # integer index tensors and the like: CUDA-core rate
                peak = self.hardware.compute.fp32_tflops * 1e12
            self._peaks[dtype] = peak
        return peak

    def _ideal(self, flops: float, nbytes: float, peak: float) -> float:
        return max(flops / peak, nbytes / self._hbm)

    def _bound(self, wanted: NodeKey) -> str:
        peak = self._peak(wanted.dtype)
        return "compute" if wanted.flops / peak >= wanted.bytes / self._hbm else "memory"

