"""A captured graph as a structural ONNX model for graph viewers such as Netron: ops as nodes of
the ``zrt`` domain, tensors with their shapes and dtypes. For viewing, not for running; needs
the optional ``onnx`` package (``pip install 'zrt-core[onnx]'``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta

_ONNX_DTYPES = {
    "float32": "FLOAT", "float64": "DOUBLE", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
    "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8",
    "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64", "bool": "BOOL",
    "complex64": "COMPLEX64", "complex128": "COMPLEX128",
    "float8_e4m3fn": "FLOAT8E4M3FN", "float8_e5m2": "FLOAT8E5M2",
    "float8_e4m3fnuz": "FLOAT8E4M3FNUZ", "float8_e5m2fnuz": "FLOAT8E5M2FNUZ",
}


def write_onnx(graph: OpGraph, path: str | Path, *, model: str = "") -> Path:
    """Write ``graph`` as a structural ONNX model: each op a node in the ``zrt`` domain
    (its op name as the type, category, layer and FLOPs as attributes, and for a fused
    node its rule and member count), each tensor a value with its shape and dtype. For
    viewing, not for running."""
    import onnx
    from onnx import TensorProto, helper

    def elem_type(dtype: str) -> int:
        return getattr(TensorProto, _ONNX_DTYPES.get(dtype, "UNDEFINED"))

    infos: dict[str, Any] = {}
    produced: set[str] = set()
    consumed: set[str] = set()
    nodes = []

    def name_of(t: TensorMeta, node: OpNode, slot: str) -> str:
        name = f"t{t.tensor_id}" if t.tensor_id is not None else f"n{node.id}_{slot}"
        if name not in infos:
            infos[name] = helper.make_tensor_value_info(name, elem_type(t.dtype), list(t.shape))
        return name

    for node in graph.nodes:
        inputs = [name_of(t, node, f"in{i}") for i, t in enumerate(node.inputs)]
        outputs = [name_of(t, node, f"out{i}") for i, t in enumerate(node.outputs)]
        # A tensor written twice (in-place ops) keeps one producer: later writes get a suffix.
        outputs = [o if o not in produced else f"{o}_n{node.id}" for o in outputs]
        for o, t in zip(outputs, node.outputs, strict=True):
            if o not in infos:
                infos[o] = helper.make_tensor_value_info(o, elem_type(t.dtype), list(t.shape))
        consumed.update(inputs)
        produced.update(outputs)
        attributes: dict[str, Any] = {"category": node.category, "flops": int(node.flops),
                                      "runs": graph.multiplicity(node)}
        if node.module_path:
            attributes["module_path"] = node.module_path
        if node.layer_index is not None:
            attributes["layer_index"] = int(node.layer_index)
        if node.fused_from:  # a fused node: the rule that made it and how many ops it holds
            attributes["fusion_rule"] = str(node.attrs.get("fusion_rule", ""))
            attributes["fused_ops"] = len(node.fused_from)
        nodes.append(helper.make_node(
            _op_type(node.op), inputs, outputs, name=f"{node.id}:{node.op}", domain="zrt",
            **attributes))
    graph_inputs = [infos[n] for n in infos if n in consumed and n not in produced]
    graph_outputs = [infos[n] for n in infos if n in produced and n not in consumed]
    value_info = [infos[n] for n in infos if n in produced and n in consumed]
    onnx_graph = helper.make_graph(nodes, f"{model or 'model'}:{graph.phase}", graph_inputs,
                                   graph_outputs, value_info=value_info)
    proto = helper.make_model(onnx_graph, producer_name="zrt",
                              opset_imports=[helper.make_opsetid("zrt", 1)])
    proto.doc_string = (f"zrt structural export of {model or 'a model'}, phase "
                        f"{graph.phase}: ops as nodes, not runnable")
    path = Path(path)
    onnx.save(proto, str(path))
    return path


def _op_type(op: str) -> str:
    """``aten.mm.default`` → ``aten_mm_default``: ONNX op types are identifiers."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in op)
