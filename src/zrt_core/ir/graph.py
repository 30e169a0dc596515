"""The operator-graph IR: every front-end produces it, every transform and backend reads it.

An :class:`OpGraph` holds the operators of one phase of one model. Repeated decoder layers
appear once per kind (a :class:`LayerTemplate` carries the indices that kind stands for),
so whole-model totals multiply each layer node by its template's count. The IR imports no
torch: listing, costing and reporting a saved graph stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.errors import SpecError

if TYPE_CHECKING:
    import networkx as nx

SCHEMA = "zrt.opgraph"
SCHEMA_VERSION = 1


class Phase:
    """Phase names; plain strings so graphs serialise as they print."""

    PREFILL = "prefill"
    DECODE = "decode"
    TRAIN_FORWARD = "train_forward"
    TRAIN_BACKWARD = "train_backward"
    OPTIMIZER = "optimizer"

    ALL = (PREFILL, DECODE, TRAIN_FORWARD, TRAIN_BACKWARD, OPTIMIZER)
    CAPTURED = (PREFILL, DECODE, TRAIN_FORWARD, TRAIN_BACKWARD)


class Category:
    """Operator categories. A fused op takes the category of what it computes."""

    MATMUL = "matmul"
    ATTENTION = "attention"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    SOFTMAX = "softmax"
    EMBEDDING = "embedding"
    MOE_ROUTER = "moe_router"
    MOE_DISPATCH = "moe_dispatch"
    MOE_COMBINE = "moe_combine"
    SSM = "ssm"
    LOSS = "loss"
    COPY = "copy"
    VIEW = "view"
    CREATION = "creation"
    COLLECTIVE = "collective"
    OPTIMIZER = "optimizer"
    OTHER = "other"

    ALL = (
        MATMUL, ATTENTION, NORM, ELEMENTWISE, REDUCTION, SOFTMAX, EMBEDDING, MOE_ROUTER,
        MOE_DISPATCH, MOE_COMBINE, SSM, LOSS, COPY, VIEW, CREATION, COLLECTIVE, OPTIMIZER,
        OTHER,
    )


DTYPE_BYTES: Mapping[str, float] = MappingProxyType(
    {
        "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
        "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
        "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
        # Sub-byte formats that zrt's quantisation transform writes (two values per byte).
        "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5,
        "mxfp8": 1, "fp8": 1,
        "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
        "complex64": 8, "complex128": 16, "uint16": 2, "uint32": 4, "uint64": 8,
    }
)


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``"bfloat16"`` → 2); an unknown name is an error."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise SpecError(
            f"unknown dtype {dtype!r}", f"use one of {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


_SCALARS = (str, int, float, bool, type(None))


def _freeze(value: Any) -> Any:
    """Lists become tuples and dicts become read-only, recursively: JSON in, value out."""
    if type(value) in _SCALARS:  # most values: nothing to freeze (the common case first)
        return value
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_thaw(v) for v in value]
    return value


def _frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _freeze(dict(value or {}))


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@frozen
class TensorMeta:
    """Shape, dtype and identity of one tensor an operator reads or writes.

    ``tensor_id`` links producer and consumer inside one graph (None for tensors that no
    other node can see, such as Python scalars promoted to tensors). ``param`` is the
    parameter's qualified name when the tensor is a model weight.
    """

    shape: tuple[int, ...] = field(converter=_int_tuple)
    dtype: str
    is_view: bool = False
    tensor_id: int | None = None
    param: str | None = None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return int(self.numel * dtype_bytes(self.dtype))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.is_view:
            out["view"] = True
        if self.tensor_id is not None:
            out["id"] = self.tensor_id
        if self.param is not None:
            out["param"] = self.param
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorMeta:
        return cls(
            shape=data["shape"],
            dtype=data["dtype"],
            is_view=bool(data.get("view", False)),
            tensor_id=data.get("id"),
            param=data.get("param"),
        )


def _tensor_tuple(value: Iterable[TensorMeta]) -> tuple[TensorMeta, ...]:
    return tuple(value)


def _node_tuple(value: Iterable[OpNode]) -> tuple[OpNode, ...]:
    return tuple(value)


@frozen
class OpNode:
    """One operator: an aten op, a fused kernel, a collective or an optimizer step.

    ``flops`` and ``bytes_read``/``bytes_written`` are for one execution of the node on one
    device; a node inside a layer template runs once per layer the template stands for
    (see :meth:`OpGraph.multiplicity`). ``formula`` names the registered formula that gave
    the counts; None means no formula was registered and the counts are zero — listed in
    :attr:`OpGraph.missing_formulas`, never guessed. ``fused_from`` holds the nodes a
    fused op replaced.
    """

    id: int
    op: str
    category: str
    phase: str
    inputs: tuple[TensorMeta, ...] = field(default=(), converter=_tensor_tuple)
    outputs: tuple[TensorMeta, ...] = field(default=(), converter=_tensor_tuple)
    module_path: str = ""
    module_class: str = ""
    layer_index: int | None = None
    layer_kind: str | None = None
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    formula: str | None = None
    zero_cost: bool = False
    attrs: Mapping[str, Any] = field(factory=dict, converter=_frozen_mapping)
    fused_from: tuple[OpNode, ...] = field(default=(), converter=_node_tuple)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def members(self) -> tuple[OpNode, ...]:
        """The ops a fused node replaced, recursively (the node itself when unfused)."""
        if not self.fused_from:
            return (self,)
        return tuple(m for f in self.fused_from for m in f.members)

    def with_tensors(self, change: Callable[[TensorMeta], TensorMeta]) -> OpNode:
        """This node, and the ops it fused, with ``change`` applied to every input and
        output tensor (renamed ids, another dtype)."""
        return evolve(self, inputs=tuple(change(t) for t in self.inputs),
                      outputs=tuple(change(t) for t in self.outputs),
                      fused_from=tuple(m.with_tensors(change) for m in self.fused_from))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "op": self.op,
            "category": self.category,
            "phase": self.phase,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "module_path": self.module_path,
            "module_class": self.module_class,
            "layer_index": self.layer_index,
            "layer_kind": self.layer_kind,
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "formula": self.formula,
            "zero_cost": self.zero_cost,
        }
        if self.attrs:
            out["attrs"] = _thaw(self.attrs)
        if self.fused_from:
            out["fused_from"] = [n.to_json() for n in self.fused_from]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpNode:
        return cls(
            id=data["id"],
            op=data["op"],
            category=data["category"],
            phase=data["phase"],
            inputs=[TensorMeta.from_json(t) for t in data.get("inputs", ())],
            outputs=[TensorMeta.from_json(t) for t in data.get("outputs", ())],
            module_path=data.get("module_path", ""),
            module_class=data.get("module_class", ""),
            layer_index=data.get("layer_index"),
            layer_kind=data.get("layer_kind"),
            flops=data.get("flops", 0),
            bytes_read=data.get("bytes_read", 0),
            bytes_written=data.get("bytes_written", 0),
            formula=data.get("formula"),
            zero_cost=data.get("zero_cost", False),
            attrs=data.get("attrs", {}),
            fused_from=[OpNode.from_json(n) for n in data.get("fused_from", ())],
        )


@frozen
class LayerTemplate:
    """One captured decoder layer standing for every layer of its kind.

    :param kind: a readable kind name (``"dense"``, ``"moe"``, ``"sliding_attention"``...).
    :param representative: the layer index whose ops were captured.
    :param indices: every layer index this template stands for, representative included.
    """

    kind: str
    representative: int
    indices: tuple[int, ...] = field(converter=_int_tuple)

    def __attrs_post_init__(self) -> None:
        if self.representative not in self.indices:
            raise SpecError(
                f"layer template {self.kind!r}: representative {self.representative} "
                f"is not among its indices {self.indices}"
            )

    @property
    def count(self) -> int:
        return len(self.indices)

    def count_in(self, layers: range | Sequence[int]) -> int:
        """How many layers of this kind fall in ``layers`` (a pipeline stage, say)."""
        wanted = set(layers)
        return sum(1 for i in self.indices if i in wanted)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "representative": self.representative,
                "indices": list(self.indices)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayerTemplate:
        return cls(kind=data["kind"], representative=data["representative"],
                   indices=data["indices"])


@frozen
class GraphTotals:
    """Whole-model counts of one graph: every layer, not only the captured templates."""

    ops: int
    flops: int
    bytes: int

    def __add__(self, other: GraphTotals) -> GraphTotals:
        return GraphTotals(self.ops + other.ops, self.flops + other.flops,
                           self.bytes + other.bytes)


def _template_map(value: Mapping[int, LayerTemplate] | Iterable[LayerTemplate]
                  ) -> Mapping[int, LayerTemplate]:
    if isinstance(value, Mapping):
        items = value.values()
    else:
        items = value
    return MappingProxyType({t.representative: t for t in items})


def _edge_tuple(value: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in value)


@frozen
class OpGraph:
    """The operators of one phase of one model, with dataflow edges.

    :param phase: one of :class:`Phase`.
    :param nodes: operators in execution order.
    :param edges: ``(producer id, consumer id)`` pairs, one per tensor dependency.
    :param templates: layer templates keyed by representative layer index. A node whose
        ``layer_index`` is a representative runs ``template.count`` times in the model;
        every other node runs once.
    :param meta: what produced the graph (model, batch, sequence, library versions...).
    """

    phase: str
    nodes: tuple[OpNode, ...] = field(converter=_node_tuple)
    edges: tuple[tuple[int, int], ...] = field(default=(), converter=_edge_tuple)
    templates: Mapping[int, LayerTemplate] = field(factory=dict, converter=_template_map)
    meta: Mapping[str, Any] = field(factory=dict, converter=_frozen_mapping)

    def multiplicity(self, node: OpNode) -> int:
        """How many times ``node`` runs in the whole model."""
        if node.layer_index is None:
            return 1
        template = self.templates.get(node.layer_index)
        return template.count if template is not None else 1

    def totals(self, *, include_zero_cost: bool = True) -> GraphTotals:
        ops = flops = nbytes = 0
        for node in self.nodes:
            if node.zero_cost and not include_zero_cost:
                continue
            m = self.multiplicity(node)
            ops += m
            flops += m * node.flops
            nbytes += m * node.bytes
        return GraphTotals(ops, flops, nbytes)

    @property
    def missing_formulas(self) -> tuple[str, ...]:
        """Ops that cost something but have no registered formula, sorted and unique."""
        return tuple(sorted({n.op for n in self.nodes if n.formula is None and not n.zero_cost}))

    def by_id(self) -> dict[int, OpNode]:
        return {n.id: n for n in self.nodes}

    def iter_layer(self, layer_index: int | None) -> Iterator[OpNode]:
        return (n for n in self.nodes if n.layer_index == layer_index)

    def with_nodes(self, nodes: Iterable[OpNode], edges: Iterable[Sequence[int]] | None = None
                   ) -> OpGraph:
        """A copy with other nodes (and edges, which default to those among kept nodes)."""
        nodes = tuple(nodes)
        if edges is None:
            keep = {n.id for n in nodes}
            edges = [(a, b) for a, b in self.edges if a in keep and b in keep]
        return evolve(self, nodes=nodes, edges=edges)

    def to_networkx(self) -> nx.DiGraph:
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.id, node=n)
        g.add_edges_from(self.edges)
        return g

    # -- serialisation ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "phase": self.phase,
            "meta": _thaw(self.meta),
            "templates": [t.to_json() for t in self.templates.values()],
            "nodes": [n.to_json() for n in self.nodes],
            "edges": [list(e) for e in self.edges],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpGraph:
        if data.get("schema") != SCHEMA:
            raise SpecError(f"not a zrt graph: schema is {data.get('schema')!r}",
                            f"expected {SCHEMA!r}")
        if data.get("version") != SCHEMA_VERSION:
            raise SpecError(
                f"graph schema version {data.get('version')!r} is not supported",
                f"this zrt reads version {SCHEMA_VERSION}; re-capture the model",
            )
        return cls(
            phase=data["phase"],
            nodes=[OpNode.from_json(n) for n in data["nodes"]],
            edges=data.get("edges", ()),
            templates=[LayerTemplate.from_json(t) for t in data.get("templates", ())],
            meta=data.get("meta", {}),
        )

    @classmethod
    def loads(cls, text: str) -> OpGraph:
        return cls.from_json(json.loads(text))
