"""``zrt profile``: micro-benchmark the distinct kernels a captured model needs — GEMMs,
grouped GEMMs, attention forward/backward and the pointwise and other ops by graph op name —
over a grid grown around them, and write them as a measured table (the CSV format of
:mod:`zrt_core.cost.measured`) whose ``source`` column is the provenance of each row.

Rows are appended and flushed one by one, and a table that already exists is read first and
its keys skipped: an interrupted run keeps what it measured and a rerun continues it.
"""

from __future__ import annotations

import csv
import datetime as _dt
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from zrt_core.errors import SpecError
from zrt_core.profile.device import Device, time_call

COLUMNS = ("hardware_id", "op", "dtype", "b", "m", "n", "k", "h", "h_kv", "s_q", "s_kv", "d",
           "causal", "flops", "bytes", "time_us", "source")
#: grid growth around a GEMM's shape: rows scaled by these factors (tokens per step vary)
GEMM_ROW_FACTORS = (0.5, 2.0)
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
#: MB of weight copies a GEMM's timed calls cycle through, one copy per call in turn: more
#: than the last-level cache of any GPU zrt ships a pack for (B200: 126 MB of L2), so each
#: call reads its weight from DRAM as each layer of a model does once per step, not from
#: the cache the previous call warmed; at most WEIGHT_COPIES copies (a weight under 4 MB
#: then cycles through less: such GEMMs are bound by their fixed cost, not by DRAM)
WEIGHT_CYCLE_MB = 256.0
WEIGHT_COPIES = 64


@frozen
class Kernel:
    """One distinct kernel to time: its table cells and how to build it."""

    op: str
    dtype: str
    cells: tuple[tuple[str, Any], ...]
    build: Callable[[Device], Callable[[], Any]]
    origin: str  # "model" (a kernel the model runs) or "grid" (grown around one)

    @property
    def ident(self) -> tuple[Any, ...]:
        return (self.op, self.dtype, self.cells)


def kernels_of(graphs: Sequence[Any], *, grid: bool = True,
               dtypes: Sequence[str] = ()) -> tuple[list[Kernel], int]:
    """The distinct kernels of ``graphs`` (and, with ``grid``, their grown variants), and the
    number of distinct nodes left out (ops whose arguments a graph does not keep)."""
    from zrt_core.cost.measured import node_key
    from zrt_core.cost.opdims import attention_dims, gemm_dims, is_backward
    from zrt_core.ir.graph import Category

    found: dict[tuple[Any, ...], Kernel] = {}
    skipped: set[tuple[Any, ...]] = set()

    def add(k: Kernel) -> None:
        found.setdefault(k.ident, k)

    for graph in graphs:
        for node in graph.nodes:
            key = node_key(node)
            if key is None:
                continue
            if node.category == Category.MATMUL:
                dims = gemm_dims(node)
                if dims is None or key.dtype not in _TORCH_DTYPES:
                    skipped.add((node.op, key.key))
                    continue
                for dtype in (key.dtype, *(d for d in dtypes if d != key.dtype)):
                    add(_gemm(key.op, dtype, dims.batch, dims.m, dims.n, dims.k, "model"
                              if dtype == key.dtype else "grid"))
                    if grid:
                        for f in GEMM_ROW_FACTORS:
                            m = max(1, round(dims.m * f))
                            add(_gemm(key.op, dtype, dims.batch, m, dims.n, dims.k, "grid"))
                        padded = _pad(dims.m, 64)
                        if padded != dims.m:
                            add(_gemm(key.op, dtype, dims.batch, padded, dims.n, dims.k,
                                      "grid"))
            elif node.category == Category.ATTENTION:
                dims = attention_dims(node)
                if (dims is None or key.dtype not in _TORCH_DTYPES or dims.window
                        or dims.chunk or dims.topk or (dims.d_v and dims.d_v != dims.d)):
                    skipped.add((node.op, key.key))
                    continue
                add(_attention(is_backward(node), key.dtype, dims, "model"))
            else:
                k = _pointwise(node, key)
                if k is None:
                    skipped.add((node.op, key.key))
                else:
                    add(k)
    return list(found.values()), len(skipped)


def _pad(x: int, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def weight_copies(weight_bytes: int) -> int:
    """How many copies of a GEMM's weight its timed calls cycle through (WEIGHT_CYCLE_MB)."""
    return max(1, min(WEIGHT_COPIES, math.ceil(WEIGHT_CYCLE_MB * 1e6 / weight_bytes)))


def _gemm(op: str, dtype: str, b: int, m: int, n: int, k: int, origin: str) -> Kernel:
    def build(device: Device) -> Callable[[], Any]:
        import torch

        t = getattr(torch, _TORCH_DTYPES[dtype])
        dev = device.torch_device
        if b == 1:
            # F.linear's layout (TN): the activations [m, k] times the weight [n, k]
            # transposed, the weight cycled (WEIGHT_CYCLE_MB)
            x, w = torch.randn(m, k, dtype=t, device=dev), torch.randn(n, k, dtype=t, device=dev)
            copies = weight_copies(n * k * w.element_size())
            turn = itertools.cycle([w, *(w.clone() for _ in range(copies - 1))])
            return lambda: torch.mm(x, next(turn).t())
        x = torch.randn(b, m, k, dtype=t, device=dev)
        w = torch.randn(b, k, n, dtype=t, device=dev)
        return lambda: torch.bmm(x, w)

    return Kernel(op, dtype, (("b", b), ("m", m), ("n", n), ("k", k)), build, origin)


def _attention(backward: bool, dtype: str, dims: Any, origin: str) -> Kernel:
    def build(device: Device) -> Callable[[], Any]:
        import torch
        import torch.nn.functional as F

        t = getattr(torch, _TORCH_DTYPES[dtype])
        dev = device.torch_device
        grad = backward
        q = torch.randn(dims.b, dims.h, dims.s_q, dims.d, dtype=t, device=dev,
                        requires_grad=grad)
        k = torch.randn(dims.b, dims.h_kv, dims.s_kv, dims.d, dtype=t, device=dev,
                        requires_grad=grad)
        v = torch.randn(dims.b, dims.h_kv, dims.s_kv, dims.d, dtype=t, device=dev,
                        requires_grad=grad)
        gqa = dims.h != dims.h_kv
        causal = dims.causal and dims.s_q > 1
        if not backward:
            def fwd() -> Any:
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=gqa)
            return fwd
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        g = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)

    cells = (("b", dims.b), ("h", dims.h), ("h_kv", dims.h_kv), ("s_q", dims.s_q),
             ("s_kv", dims.s_kv), ("d", dims.d), ("causal", int(dims.causal)))
    return Kernel("attention_bwd" if backward else "attention_fwd", dtype, cells, build,
                  origin)


def _pointwise(node: Any, key: Any) -> Kernel | None:
    """A graph op replayed on random inputs of its shapes: only ops whose every argument is
    one of its tensor inputs (a scalar exponent or a dim list is not in the graph)."""
    import torch

    name = node.op.split(".")
    if len(name) != 3 or name[0] != "aten" or not node.inputs:
        return None
    try:
        packet = getattr(torch.ops.aten, name[1])
        overload = getattr(packet, name[2])
    except AttributeError:
        return None
    schema = overload._schema
    required = [a for a in schema.arguments if not a.kwarg_only and a.default_value is None
                and not str(a.type).endswith("?")]
    if len(required) != len(node.inputs) or not all(str(a.type) == "Tensor"
                                                     for a in required):
        return None
    if any(t.dtype not in _TORCH_DTYPES for t in node.inputs):
        return None
    shapes = [tuple(t.shape) for t in node.inputs]
    dtypes = [t.dtype for t in node.inputs]

    def build(device: Device) -> Callable[[], Any]:
        args = [torch.rand(s, dtype=getattr(torch, _TORCH_DTYPES[d]),
                           device=device.torch_device) + 0.5
                for s, d in zip(shapes, dtypes, strict=True)]
        return lambda: overload(*args)

    cells = (("flops", key.flops), ("bytes", key.bytes))
    return Kernel(node.op, key.dtype, cells, build, "model")


def _row_ident(row: dict[str, str]) -> tuple[Any, ...]:
    """The identity of a table row as :attr:`Kernel.ident` spells it."""
    if row["op"] in ("gemm", "grouped_gemm"):
        cells: tuple[tuple[str, Any], ...] = tuple(
            (c, int(row[c] or 1) if c == "b" else int(row[c])) for c in ("b", "m", "n", "k"))
    elif row["op"] in ("attention_fwd", "attention_bwd"):
        cells = tuple((c, int(row[c])) for c in ("b", "h", "h_kv", "s_q", "s_kv", "d"))
        cells += (("causal", int(row["causal"] in ("1", "true"))),)
    else:
        cells = (("flops", float(row["flops"] or 0)), ("bytes", float(row["bytes"])))
    return (row["op"], row["dtype"], cells)


def existing_rows(path: Path, hardware_id: str) -> set[tuple[Any, ...]]:
    """Identities already in ``path`` (validated first: a broken table is an error)."""
    if not path.exists():
        return set()
    from zrt_core.cost.measured import load_csv

    load_csv(path, hardware_id=hardware_id)
    with open(path, encoding="utf-8", newline="") as fh:
        lines = [line for line in fh if line.strip() and not line.lstrip().startswith("#")]
    return {_row_ident(r) for r in csv.DictReader(lines)}


def profile(kernels: Sequence[Kernel], device: Device, out: Path, hardware_id: str, *,
            repeats: int = 5, warmup: int = 2, min_time_s: float = 0.01,
            limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Time each kernel not yet in ``out`` and append its row (flushed): yields each row.

    :raises SpecError: ``out`` exists but is not a valid table for ``hardware_id``.
    """
    done = existing_rows(out, hardware_id)
    provenance = (f"zrt profile {_dt.datetime.now(_dt.UTC).strftime('%Y-%m-%d')} on "
                  f"{device.provenance()}, best of {repeats}")
    new_file = not out.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(out, "a", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        if new_file:
            writer.writeheader()
            fh.flush()
        for kernel in kernels:
            if kernel.ident in done:
                continue
            if limit is not None and count >= limit:
                break
            seconds = time_call(device, kernel.build(device), warmup=warmup, repeats=repeats,
                                min_time_s=min_time_s)[0]
            clock = device.sm_clock_mhz()
            row = {c: "" for c in COLUMNS}
            row.update({"hardware_id": hardware_id, "op": kernel.op, "dtype": kernel.dtype,
                        "time_us": f"{seconds * 1e6:.4g}",
                        "source": f"{provenance}; {kernel.origin}"
                                  + (f"; sm {clock} MHz" if clock else "")})
            for name, value in kernel.cells:
                row[name] = f"{value:.17g}" if isinstance(value, float) else str(value)
            writer.writerow(row)
            fh.flush()
            os.fsync(fh.fileno())
            done.add(kernel.ident)
            count += 1
            yield row


def check_table(path: str | Path) -> None:
    """A table given to zrt must load: missing columns, negative times... raise SpecError."""
    from zrt_core.cost.measured import load_csv

    if not Path(path).is_file():
        raise SpecError(f"table {path} not found")
    load_csv(path)
