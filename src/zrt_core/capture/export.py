"""Write captured graphs to a directory: graph JSON, op tables (CSV and Excel), ONNX.

For each phase ``DIR`` gets ``<phase>.graph.json`` (:meth:`OpGraph.dumps`, loadable with
:meth:`OpGraph.loads`) and ``<phase>.ops.csv`` (one row per captured op). ``ops.xlsx`` holds
a summary sheet (per phase: whole-model ops, FLOPs and bytes, missing formulas, the
analytic FLOPs and the gap to them), a per-layer sheet (per phase and layer kind) and one
full op list per phase. ``<phase>.onnx`` is a structural export for graph viewers such as
Netron (ops as nodes of the ``zrt`` domain, tensors with their shapes; it does not run),
written only when the optional ``onnx`` package is installed.

Totals count every layer: a node inside a layer template runs ``template.count`` times.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from zrt_core.errors import ZrtError
from zrt_core.ir.graph import OpGraph, OpNode, TensorMeta

#: A gap to the analytic FLOPs above this fraction is flagged in every output.
GAP_THRESHOLD = 0.10

OP_COLUMNS = (
    "id", "op", "category", "layer_index", "layer_kind", "module_path", "module_class",
    "runs", "flops", "bytes_read", "bytes_written", "formula", "zero_cost",
    "input_shapes", "output_shapes", "dtypes",
)


class ExportError(ZrtError):
    """The output directory cannot be written."""


@frozen
class PhaseSummary:
    """Whole-model counts of one captured phase, next to its analytic reference.

    :param analytic_flops: the analytic FLOPs of the phase, or None without a model.
    :param gap: ``(flops − analytic) / analytic``; None without an analytic count.
    :param capture_s: seconds the capture of this phase took, when known.
    """

    phase: str
    ops: int
    flops: int
    bytes: int
    missing_formulas: tuple[str, ...] = field(converter=tuple)
    analytic_flops: int | None = None
    capture_s: float | None = None

    @property
    def gap(self) -> float | None:
        if not self.analytic_flops:
            return None
        return (self.flops - self.analytic_flops) / self.analytic_flops

    @property
    def gap_flagged(self) -> bool:
        return self.gap is not None and abs(self.gap) > GAP_THRESHOLD

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops, "flops": self.flops, "bytes": self.bytes,
            "missing_formulas": list(self.missing_formulas),
            "analytic_flops": self.analytic_flops,
            "gap": None if self.gap is None else round(self.gap, 6),
            "gap_over_threshold": self.gap_flagged,
            "capture_s": None if self.capture_s is None else round(self.capture_s, 3),
        }


@frozen
class LayerKindRow:
    """Whole-model counts of one layer kind (or the ops outside the layers) in one phase."""

    phase: str
    kind: str
    layers: int
    ops: int
    flops: int
    bytes: int


@frozen
class ExportResult:
    """What was written, and what was skipped and why."""

    out_dir: Path
    files: tuple[Path, ...] = field(converter=tuple)
    notes: tuple[str, ...] = field(converter=tuple)


def summarize(graphs: Mapping[str, OpGraph], *,
              analytic_flops: Mapping[str, int | None] | None = None,
              capture_s: Mapping[str, float] | None = None) -> list[PhaseSummary]:
    """A :class:`PhaseSummary` per phase, in the order of ``graphs``."""
    out = []
    for phase, graph in graphs.items():
        totals = graph.totals()
        out.append(PhaseSummary(
            phase=phase, ops=totals.ops, flops=totals.flops, bytes=totals.bytes,
            missing_formulas=graph.missing_formulas,
            analytic_flops=(analytic_flops or {}).get(phase),
            capture_s=(capture_s or {}).get(phase),
        ))
    return out


def layer_kind_rows(graph: OpGraph) -> list[LayerKindRow]:
    """Counts per layer kind; ops outside decoder layers are ``(before layers)`` or
    ``(after layers)`` by their position relative to the layer ops in execution order."""
    layer_positions = [i for i, n in enumerate(graph.nodes) if n.layer_index is not None]
    first = layer_positions[0] if layer_positions else len(graph.nodes)
    layers_of: dict[str, int] = {}
    for template in graph.templates.values():
        layers_of[template.kind] = layers_of.get(template.kind, 0) + template.count
    acc: dict[str, list[int]] = {}
    for position, node in enumerate(graph.nodes):
        if node.layer_index is None:
            kind = "(before layers)" if position < first else "(after layers)"
        else:
            kind = _node_kind(graph, node)
        m = graph.multiplicity(node)
        row = acc.setdefault(kind, [0, 0, 0])
        row[0] += m
        row[1] += m * node.flops
        row[2] += m * node.bytes
    return [LayerKindRow(phase=graph.phase, kind=kind,
                         layers=layers_of.get(kind, 0) if not kind.startswith("(") else 0,
                         ops=v[0], flops=v[1], bytes=v[2])
            for kind, v in acc.items()]


def _node_kind(graph: OpGraph, node: OpNode) -> str:
    if node.layer_kind:
        return node.layer_kind
    template = graph.templates.get(node.layer_index)  # type: ignore[arg-type]
    return template.kind if template is not None else f"layer {node.layer_index}"


def op_row(graph: OpGraph, node: OpNode) -> list[Any]:
    """One op-table row, in :data:`OP_COLUMNS` order."""
    return [
        node.id, node.op, node.category, node.layer_index, node.layer_kind or "",
        node.module_path, node.module_class, graph.multiplicity(node), node.flops,
        node.bytes_read, node.bytes_written, node.formula or "", node.zero_cost,
        _shapes(node.inputs), _shapes(node.outputs),
        ";".join(sorted({t.dtype for t in (*node.inputs, *node.outputs)})),
    ]


def _shapes(tensors: Iterable[TensorMeta]) -> str:
    return ";".join("x".join(str(d) for d in t.shape) or "scalar" for t in tensors)


# -- writing ----------------------------------------------------------------------------


def export_graphs(out_dir: str | Path, graphs: Mapping[str, OpGraph], *,
                  model: str = "",
                  analytic_flops: Mapping[str, int | None] | None = None,
                  capture_s: Mapping[str, float] | None = None,
                  onnx: bool | None = None) -> ExportResult:
    """Write every file for ``graphs`` (phase → graph) into ``out_dir``.

    :param onnx: True requires ONNX export (an error without the ``onnx`` package), False
        skips it, None writes it when ``onnx`` is importable and notes the skip otherwise.
    :raises ExportError: the directory cannot be created or written.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"{out}: cannot create the output directory "
                          f"({exc.strerror or exc})", "pass a writable --out DIR") from None
    files: list[Path] = []
    notes: list[str] = []
    summaries = summarize(graphs, analytic_flops=analytic_flops, capture_s=capture_s)
    try:
        for phase, graph in graphs.items():
            path = out / f"{phase}.graph.json"
            path.write_text(graph.dumps(), encoding="utf-8")
            files.append(path)
            files.append(_write_csv(out / f"{phase}.ops.csv", graph))
        files.append(_write_workbook(out / "ops.xlsx", graphs, summaries, model))
    except OSError as exc:
        raise ExportError(f"{out}: cannot write ({exc.strerror or exc})",
                          "pass a writable --out DIR") from None
    if onnx is not False:
        module = _onnx_module()
        if module is None:
            if onnx:
                raise ExportError("ONNX export needs the onnx package",
                                  "pip install 'zrt-core[onnx]'")
            notes.append("ONNX export skipped: the onnx package is not installed "
                         "(pip install 'zrt-core[onnx]')")
        else:
            for phase, graph in graphs.items():
                path = out / f"{phase}.onnx"
                write_onnx(graph, path, model=model)
                files.append(path)
    return ExportResult(out_dir=out, files=files, notes=notes)


def export_capture(result: Any, out_dir: str | Path, *,
                   analytic_flops: Mapping[str, int | None] | None = None,
                   onnx: bool | None = None) -> ExportResult:
    """Write a :class:`~zrt_core.capture.api.CaptureResult` into ``out_dir``.

    Reads ``graphs``, and when present ``model``, ``timings_s`` (seconds per phase) and
    ``flops_checks`` (the analytic FLOPs per phase, used unless ``analytic_flops`` is
    given); see :func:`export_graphs`.
    """
    timings = getattr(result, "timings_s", None)
    capture_s = {k: float(v) for k, v in timings.items()} if isinstance(timings, Mapping) \
        else None
    if analytic_flops is None:
        checks = getattr(result, "flops_checks", None) or {}
        analytic_flops = {phase: check.analytic for phase, check in checks.items()}
    model = getattr(result, "model", "") or ""
    return export_graphs(out_dir, result.graphs, model=str(model),
                         analytic_flops=analytic_flops, capture_s=capture_s, onnx=onnx)


def _write_csv(path: Path, graph: OpGraph) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(OP_COLUMNS)
        for node in graph.nodes:
            writer.writerow(op_row(graph, node))
    return path


SUMMARY_COLUMNS = ("phase", "ops", "FLOPs", "bytes", "analytic FLOPs", "gap",
                   "gap > 10%", "missing formulas", "capture s")
LAYER_COLUMNS = ("phase", "layer kind", "layers", "ops", "FLOPs", "bytes")


def _write_workbook(path: Path, graphs: Mapping[str, OpGraph],
                    summaries: list[PhaseSummary], model: str) -> Path:
    from openpyxl import Workbook

    wb = Workbook(write_only=True)
    ws = wb.create_sheet("summary")
    if model:
        ws.append(["model", model])
    meta = next(iter(graphs.values())).meta if graphs else {}
    for key in ("batch", "seq_len", "dtype", "transformers_version", "torch_version"):
        if key in meta:
            ws.append([key, meta[key]])
    ws.append([])
    ws.append(list(SUMMARY_COLUMNS))
    for s in summaries:
        ws.append([s.phase, s.ops, s.flops, s.bytes, s.analytic_flops,
                   None if s.gap is None else round(s.gap, 6),
                   "YES" if s.gap_flagged else "", ", ".join(s.missing_formulas),
                   s.capture_s])
    layers = wb.create_sheet("per_layer")
    layers.append(list(LAYER_COLUMNS))
    for graph in graphs.values():
        for r in layer_kind_rows(graph):
            layers.append([r.phase, r.kind, r.layers, r.ops, r.flops, r.bytes])
    for phase, graph in graphs.items():
        sheet = wb.create_sheet(f"ops_{phase}"[:31])
        sheet.append(list(OP_COLUMNS))
        for node in graph.nodes:
            sheet.append(op_row(graph, node))
    wb.save(path)
    return path


# -- ONNX -------------------------------------------------------------------------------


def _onnx_module() -> Any:
    try:
        import onnx
    except ImportError:
        return None
    return onnx


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
    (its op name as the type, category, layer and FLOPs as attributes), each tensor a
    value with its shape and dtype. For viewing, not for running."""
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


def capture_json(result: Any, summaries: Any, exported: Any, timings: dict[str, float]
                 ) -> dict[str, Any]:
    """What ``zrt capture --json`` prints (and a server capture job answers)."""
    out = {
        "model": result.model,
        "model_type": result.model_type,
        "source": result.source,
        "batch": result.options.batch,
        "seq_len": result.options.seq_len,
        "dtype": result.options.dtype,
        "full_depth": result.options.full_depth,
        "params": {"total": result.params.total, "active": result.params.active},
        "analytic_params": analytic_params(result.config),
        "build_s": round(timings.get("build", 0.0), 3),
        "phases": {s.phase: s.to_json() for s in summaries},
        "warnings": list(result.warnings),
    }
    if exported is not None:
        out["out"] = {"dir": str(exported.out_dir),
                      "files": [str(p) for p in exported.files],
                      "notes": list(exported.notes)}
    return out


def analytic_params(config: Any) -> dict[str, Any] | None:
    """The analytic parameter counts of the captured config (None for families the
    analytic model does not describe)."""
    from zrt_core.analytic.flops import param_counts
    from zrt_core.errors import ZrtError

    try:
        return param_counts(dict(config)).to_json()
    except ZrtError:
        return None
