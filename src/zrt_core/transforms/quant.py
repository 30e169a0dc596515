"""Quantisation: narrow the weights (and for W8A8/W4A4 the GEMM activations) and the KV
cache of a captured graph, and re-price what reads or writes them.

Schemes (``InferSpec.quant``), as serving engines run them:

``int8`` / ``int4``  weight-only (W8A16 / W4A16: AWQ, GPTQ, Marlin kernels): weights stored
    narrow, dequantised in registers, the GEMM runs at the activation (bf16) rate — the
    cost model prices a GEMM at its wider operand. int4 carries one fp16 scale per group
    of 128 weights; int8 per-channel scales are negligible.
``fp8``  W8A8 (e4m3, per-tensor scales, as ModelOpt FP8 checkpoints): weights fp8, and
    each quantised GEMM's input activation written fp8 by its producer (TensorRT-LLM and
    vLLM fuse the quantisation into the preceding norm / activation / attention kernel);
    where that producer has other readers, a separate quantise kernel is inserted.
``fp4``  W4A4 NVFP4 (e2m1 values, one fp8 scale per block of 16): weights and GEMM inputs
    4-bit. Hardware without fp4 units runs the GEMM at the fp8 rate (then bf16), as
    :meth:`zrt_core.hardware.ComputeSpec.peak_tflops` falls back.

Quantised: every GEMM with a weight operand, except modules matched by ``exclude``
(default: the LM head, which ModelOpt keeps in bf16) and MoE routers. ``kv_dtype`` narrows
the KV cache (the tensors attention reads as keys and values, the cache carried into
decode, and the cache writes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from zrt_core.errors import SpecError
from zrt_core.ir.graph import DTYPE_BYTES, Category, OpGraph, OpNode, TensorMeta
from zrt_core.transforms.parallel import (
    op_base,
    replace_graph,
    replace_node,
    reprice,
    with_shape,
)

if TYPE_CHECKING:
    from zrt_core.formulas.registry import FormulaRegistry
    from zrt_core.transforms.base import TransformContext

#: scheme -> (weight dtype, GEMM activation dtype or None for weight-only)
SCHEMES: Mapping[str, tuple[str, str | None]] = {
    "int8": ("int8", None),
    "int4": ("int4", None),
    "fp8": ("float8_e4m3fn", "float8_e4m3fn"),
    "fp4": ("nvfp4", "nvfp4"),
}
#: Bytes of scale metadata per quantised element: int4 one fp16 per group of 128,
#: nvfp4 one e4m3 per block of 16, mxfp4 one e8m0 per 32. Per-tensor / per-channel scales
#: (fp8, int8) are negligible.
SCALE_BYTES_PER_ELEMENT: Mapping[str, float] = {"int4": 2 / 128, "nvfp4": 1 / 16,
                                                "mxfp4": 1 / 32}
#: Spellings of KV-cache dtypes users write, mapped to graph dtype names.
KV_DTYPES: Mapping[str, str] = {"fp8": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
                                "float8_e5m2": "float8_e5m2", "int8": "int8",
                                "bf16": "bfloat16", "bfloat16": "bfloat16",
                                "fp16": "float16", "float16": "float16", "nvfp4": "nvfp4",
                                "fp4": "nvfp4"}
DEFAULT_EXCLUDE = ("lm_head",)
_ROUTER_CLASS = re.compile(r"(Router|TopK|Gate)$")
_ROUTER_PATH = re.compile(r"\.(gate|router)$")
_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_grouped_mm",
                       "grouped_mm_fallback", "_scaled_mm", "_scaled_grouped_mm"})


def is_router(node: OpNode) -> bool:
    """A MoE router's node (by its module's class or path): engines and Megatron run the
    router's GEMM in the model's dtype (ModelOpt leaves it unquantized; Megatron-Core's
    ``TopKRouter`` is a plain ``F.linear``, not a TransformerEngine module)."""
    return bool(_ROUTER_CLASS.search(node.module_class or "")
                or _ROUTER_PATH.search(node.module_path or ""))


def kv_dtype_name(value: str | None) -> str | None:
    """A KV-cache dtype as the graph names it (``"fp8"`` → ``"float8_e4m3fn"``)."""
    if value is None:
        return None
    try:
        return KV_DTYPES[value.lower()]
    except KeyError:
        raise SpecError(f"unknown KV-cache dtype {value!r}",
                        f"use one of {', '.join(sorted(KV_DTYPES))}") from None


def scale_bytes(dtype: str, numel: int) -> int:
    """Bytes of block scales that travel with ``numel`` quantised elements."""
    return int(numel * SCALE_BYTES_PER_ELEMENT.get(dtype, 0.0))


def _param_of_operand(node: OpNode) -> TensorMeta | None:
    for t in node.inputs:
        if t.param is not None and len(t.shape) >= 2:
            return t
    return None


class Quantize:
    """The quantisation transform (see the module docstring).

    :param scheme: ``none``, ``int8``, ``int4``, ``fp8`` or ``fp4``.
    :param kv_dtype: the KV-cache dtype (``fp8``, ``bf16``...); None keeps the captured one.
    :param exclude: module-path patterns (regular expressions, matched anywhere) whose GEMMs
        stay unquantised.
    """

    name = "quant"

    def __init__(self, scheme: str = "none", *, kv_dtype: str | None = None,
                 exclude: Iterable[str] = DEFAULT_EXCLUDE) -> None:
        if scheme not in ("none", *SCHEMES):
            raise SpecError(f"unknown quantisation {scheme!r}",
                            f"use one of none, {', '.join(SCHEMES)}")
        self.scheme = scheme
        self.kv_dtype = kv_dtype_name(kv_dtype)
        self.exclude = tuple(exclude)
        self._exclude_rx = [re.compile(p) for p in self.exclude]

    def apply(self, graph: OpGraph, ctx: TransformContext | None) -> OpGraph:
        registry = ctx.host.formulas if ctx is not None and ctx.host is not None else None
        return quantize_graph(graph, self, registry)

    def quantised(self, node: OpNode) -> bool:
        """Whether a GEMM node's weights are quantised under this transform."""
        if self.scheme == "none" or node.category != Category.MATMUL:
            return False
        if op_base(node.op) not in _GEMM_OPS:
            return False
        if _param_of_operand(node) is None:
            return False
        path = node.module_path
        if any(rx.search(path) for rx in self._exclude_rx):
            return False
        weight = _param_of_operand(node)
        if weight is not None and any(rx.search(weight.param or "") for rx in self._exclude_rx):
            return False
        return not is_router(node)


def quantize_graph(graph: OpGraph, q: Quantize, registry: FormulaRegistry | None) -> OpGraph:
    """Apply ``q`` to ``graph`` (the work of :meth:`Quantize.apply`)."""
    if q.scheme == "none" and q.kv_dtype is None:
        return graph
    weight_dtype, act_dtype = SCHEMES.get(q.scheme, (None, None))
    params: set[str] = set()
    gemms: set[int] = set()
    for n in graph.nodes:
        if q.quantised(n):
            gemms.add(n.id)
            w = _param_of_operand(n)
            if w is not None and w.param is not None:
                params.add(w.param)

    producer: dict[int, OpNode] = {}
    consumers: dict[int, list[OpNode]] = {}
    for n in graph.nodes:
        for t in n.outputs:
            if t.tensor_id is not None:
                producer[t.tensor_id] = n
        for t in n.inputs:
            if t.tensor_id is not None:
                consumers.setdefault(t.tensor_id, []).append(n)

    retype: dict[int, str] = {}  # tensor id -> new dtype
    quantize_before: dict[int, set[int]] = {}  # gemm id -> activation tensor ids to quantise
    if act_dtype is not None:
        for n in graph.nodes:
            if n.id not in gemms:
                continue
            for t in n.inputs:
                if t.param is not None or t.tensor_id is None or len(t.shape) < 2 or \
                        not t.dtype.startswith(("bfloat", "float16", "float32")):
                    continue
                chain = _view_chain(t.tensor_id, producer)
                root = chain[-1]
                if _only_feeds_gemms(root, consumers, gemms):
                    for tid in chain:
                        retype[tid] = act_dtype
                else:
                    quantize_before.setdefault(n.id, set()).add(t.tensor_id)

    kv = q.kv_dtype
    if kv is not None:
        # the cache itself: what a cache update (a cat onto the cache carried from an
        # earlier phase, or onto the empty cache of prefill) holds, whatever reads it next
        # (attention, or MLA's latent projections)
        for n in graph.nodes:
            if op_base(n.op) != "cat" or not n.outputs:
                continue
            carried = [t for t in n.inputs if t.tensor_id is not None and t.numel > 0
                       and t.tensor_id not in producer and t.param is None]
            empty = any(t.numel == 0 for t in n.inputs)
            if carried or empty:
                for t in (*carried, *n.outputs):
                    if t.tensor_id is not None:
                        retype[t.tensor_id] = kv
        for n in graph.nodes:
            if op_base(n.op) not in ("attention", "attention_backward"):
                continue
            first = 1 if op_base(n.op) == "attention_backward" else 0
            for t in n.inputs[first + 1:first + 3]:
                if t.tensor_id is None:
                    continue
                for tid in _view_chain(t.tensor_id, producer):
                    retype[tid] = kv
                    p = producer.get(tid)
                    if p is not None and op_base(p.op) == "cat":
                        for src in p.inputs:  # the cache carried in from an earlier phase
                            if src.tensor_id is not None and src.tensor_id not in producer \
                                    and src.numel > 0:
                                retype[src.tensor_id] = kv

    nodes: list[OpNode] = []
    next_id = max((n.id for n in graph.nodes), default=0) + 1
    next_tensor = 3_000_000_000 + next_id
    for n in graph.nodes:
        changed = False
        inputs = []
        for t in n.inputs:
            new = t
            if t.param is not None and t.param in params and weight_dtype is not None:
                new = _with_dtype(t, weight_dtype)
            elif t.tensor_id is not None and t.tensor_id in retype:
                new = _with_dtype(t, retype[t.tensor_id])
            changed |= new is not t
            inputs.append(new)
        outputs = []
        for t in n.outputs:
            new = t
            if t.param is not None and t.param in params and weight_dtype is not None:
                new = _with_dtype(t, weight_dtype)
            elif t.tensor_id is not None and t.tensor_id in retype:
                new = _with_dtype(t, retype[t.tensor_id])
            changed |= new is not t
            outputs.append(new)
        if n.id in quantize_before:
            for k, t in enumerate(inputs):
                if t.tensor_id in quantize_before[n.id]:
                    qt = TensorMeta(shape=t.shape, dtype=act_dtype or t.dtype,
                                    tensor_id=next_tensor)
                    next_tensor += 1
                    nodes.append(_quantize_node(next_id, n, t, qt))
                    next_id += 1
                    inputs[k] = qt
                    changed = True
        if not changed and n.id not in gemms:
            nodes.append(n)
            continue
        attrs: Mapping[str, Any] = n.attrs
        if n.id in gemms:
            attrs = {**n.attrs, "quant": q.scheme}
        if n.zero_cost:
            nodes.append(replace_node(n, inputs=tuple(inputs), outputs=tuple(outputs),
                                      attrs=attrs))
            continue
        flops, read, written, formula = reprice(n, tuple(inputs), tuple(outputs), attrs,
                                                registry)
        if n.id in gemms:
            # block scales of the narrow operands are read with them
            read += sum(scale_bytes(t.dtype, t.numel) for t in inputs if len(t.shape) >= 2)
        nodes.append(replace_node(n, inputs=tuple(inputs), outputs=tuple(outputs),
                                  attrs=attrs, flops=flops, bytes_read=read,
                                  bytes_written=written, formula=formula))
    edges = _edges(graph, nodes) if quantize_before else graph.edges
    meta = {**graph.meta, "quant": q.scheme}
    if kv is not None:
        meta["kv_dtype"] = kv
    return replace_graph(graph, nodes=nodes, edges=edges, meta=meta)


def _with_dtype(meta: TensorMeta, dtype: str) -> TensorMeta:
    if meta.dtype == dtype:
        return meta
    out = with_shape(meta, meta.shape)
    object.__setattr__(out, "dtype", dtype)
    return out


def _view_chain(tensor_id: int, producer: Mapping[int, OpNode]) -> list[int]:
    """``tensor_id`` and the tensors it is a zero-cost view of, back to a real producer."""
    chain = [tensor_id]
    seen = 0
    while seen < 16:
        p = producer.get(chain[-1])
        if p is None or not p.zero_cost:
            break
        srcs = [t for t in p.inputs if t.tensor_id is not None and t.param is None]
        if len(srcs) != 1:
            break
        chain.append(srcs[0].tensor_id)  # type: ignore[arg-type]
        seen += 1
    return chain


def _only_feeds_gemms(tensor_id: int, consumers: Mapping[int, list[OpNode]],
                      gemms: set[int], depth: int = 0) -> bool:
    """Whether every reader of a tensor (through views) is a quantised GEMM."""
    readers = consumers.get(tensor_id, [])
    if not readers or depth > 16:
        return False
    for r in readers:
        if r.id in gemms:
            continue
        if r.zero_cost and r.category == Category.VIEW:
            outs = [t.tensor_id for t in r.outputs if t.tensor_id is not None]
            if outs and all(_only_feeds_gemms(o, consumers, gemms, depth + 1) for o in outs):
                continue
        return False
    return True


def _quantize_node(node_id: int, gemm: OpNode, source: TensorMeta, out: TensorMeta) -> OpNode:
    read = source.nbytes
    written = out.nbytes + scale_bytes(out.dtype, out.numel)
    return OpNode(id=node_id, op="zrt.quantize", category=Category.ELEMENTWISE,
                  phase=gemm.phase, inputs=(source,), outputs=(out,),
                  module_path=gemm.module_path, module_class=gemm.module_class,
                  layer_index=gemm.layer_index, layer_kind=gemm.layer_kind,
                  flops=source.numel, bytes_read=read, bytes_written=written,
                  formula="zrt.quantize", attrs={"dtype": out.dtype})


def _edges(graph: OpGraph, nodes: list[OpNode]) -> list[tuple[int, int]]:
    edges = dict.fromkeys(graph.edges)
    producer: dict[int, int] = {}
    for n in nodes:
        for t in n.inputs:
            p = producer.get(t.tensor_id) if t.tensor_id is not None else None
            if p is not None and (p, n.id) not in edges:
                edges[(p, n.id)] = None
        for t in n.outputs:
            if t.tensor_id is not None:
                producer[t.tensor_id] = n.id
    return list(edges)


def weight_bytes(meta: TensorMeta) -> int:
    """Bytes a weight occupies in memory, block scales included."""
    return meta.nbytes + scale_bytes(meta.dtype, meta.numel)


def narrow(dtype: str) -> bool:
    """Whether ``dtype`` is narrower than 16 bits (a quantised format)."""
    return DTYPE_BYTES.get(dtype, 2) < 2
