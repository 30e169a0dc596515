"""Write captured graphs to a directory: graph JSON, op tables (CSV and Excel), fusion
provenance, DOT and ONNX.

For each phase ``DIR`` gets:

- ``<phase>.graph.json``: the captured (raw) graph, :meth:`OpGraph.dumps` (read back with
  :meth:`OpGraph.loads`); ``<phase>.fused.graph.json``: the same after the fusion pass of
  the platform's rule packs;
- ``<phase>.ops.csv``: one row per raw op;
- ``<phase>.ops.xlsx``: the op workbook (:mod:`zrt_core.capture.workbook`): Model Config,
  Fused Operators, Raw Operator Sequence, Summary, By Layer and Fusion Rules;
- ``<phase>.layer-<kind>.dot``: one decoder layer per layer kind as Graphviz text, fused
  regions as clusters (:mod:`zrt_core.capture.dot`);
- ``<phase>.onnx`` and ``<phase>.fused.onnx``: structural ONNX for graph viewers
  (:mod:`zrt_core.capture.onnx_export`), only when the optional ``onnx`` package is
  installed.

and once: ``ops.xlsx`` (every phase: a summary sheet with the analytic FLOPs and the gap to
them, a per-layer sheet and one op list per phase) and ``fusion_rules.json`` (which rule
fused which raw nodes into which fused node, per phase). Without fused graphs (the library
call with ``fused=None``) the fused files, the per-phase workbooks and ``fusion_rules.json``
are skipped with a note.

Totals count every layer: a node inside a layer template runs ``template.count`` times.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from zrt_core.capture.dot import write_layer_dots
from zrt_core.capture.fusion_records import FusionRecord, fusion_records
from zrt_core.capture.onnx_export import write_onnx
from zrt_core.capture.tables import (  # noqa: F401  (the names this module always had)
    GAP_THRESHOLD,
    OP_COLUMNS,
    LayerKindRow,
    PhaseSummary,
    layer_kind_rows,
    op_row,
    summarize,
)
from zrt_core.capture.workbook import write_phase_workbook
from zrt_core.errors import ZrtError
from zrt_core.ir.graph import OpGraph

#: The name of the provenance file: every phase's fusions.
FUSION_RULES_FILE = "fusion_rules.json"


class ExportError(ZrtError):
    """The output directory cannot be written."""


@frozen
class ExportResult:
    """What was written, and what was skipped and why."""

    out_dir: Path
    files: tuple[Path, ...] = field(converter=tuple)
    notes: tuple[str, ...] = field(converter=tuple)


# -- writing ----------------------------------------------------------------------------


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create ``out_dir`` (and its parents) and check that a file can be written in it: what
    the CLI calls before it spends time capturing.

    :raises ExportError: the path is an existing file, or the directory cannot be created
        or written.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: is a file, not a directory",
                          "pass a directory (new or existing) as --out DIR")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Create and remove a file: permissions, read-only mounts and full disks all fail here.
        fd, probe = tempfile.mkstemp(prefix=".zrt-write-check-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ExportError(f"{out}: cannot create or write the output directory "
                          f"({exc.strerror or exc})", "pass a writable --out DIR") from None
    return out


def export_graphs(out_dir: str | Path, graphs: Mapping[str, OpGraph], *,
                  fused: Mapping[str, OpGraph] | None = None,
                  platform: str | None = None,
                  config: Mapping[str, Any] | None = None,
                  model: str = "",
                  analytic_flops: Mapping[str, int | None] | None = None,
                  capture_s: Mapping[str, float] | None = None,
                  onnx: bool | None = None) -> ExportResult:
    """Write every file for ``graphs`` (phase → raw graph) into ``out_dir``.

    :param fused: phase → the fusion pass's output for that phase's graph (``zrt capture``
        fuses with the rule packs of ``--platform``); None skips the fused outputs.
    :param platform: the platform the fused graphs' rules were chosen for (recorded).
    :param config: the model config, shown in each workbook's Model Config sheet.
    :param onnx: True requires ONNX export (an error without the ``onnx`` package), False
        skips it, None writes it when ``onnx`` is importable and notes the skip otherwise.
    :raises ExportError: the directory cannot be created or written.
    """
    out = prepare_out_dir(out_dir)
    files: list[Path] = []
    notes: list[str] = []
    summaries = summarize(graphs, analytic_flops=analytic_flops, capture_s=capture_s)
    fused = dict(fused) if fused is not None else None
    if fused is not None and set(fused) != set(graphs):
        raise ValueError(f"fused phases {sorted(fused)} differ from {sorted(graphs)}")
    records: dict[str, list[FusionRecord]] = {
        phase: fusion_records(graphs[phase], g) for phase, g in (fused or {}).items()}
    try:
        for phase, graph in graphs.items():
            path = out / f"{phase}.graph.json"
            path.write_text(graph.dumps(), encoding="utf-8")
            files.append(path)
            if fused is not None:
                path = out / f"{phase}.fused.graph.json"
                path.write_text(fused[phase].dumps(), encoding="utf-8")
                files.append(path)
            files.append(_write_csv(out / f"{phase}.ops.csv", graph))
        files.append(_write_workbook(out / "ops.xlsx", graphs, summaries, model))
        if fused is not None:
            # the fused graph was not captured: no capture time of its own
            fused_summaries = summarize(fused, analytic_flops=analytic_flops)
            for raw_summary, fused_summary in zip(summaries, fused_summaries, strict=True):
                phase = raw_summary.phase
                files.append(write_phase_workbook(
                    out / f"{phase}.ops.xlsx", graphs[phase], fused[phase], records[phase],
                    raw_summary=raw_summary, fused_summary=fused_summary, platform=platform,
                    config=config))
            files.append(_write_fusion_rules(out / FUSION_RULES_FILE, graphs, fused,
                                             records, platform=platform, model=model))
        else:
            notes.append("no fused graphs given: the per-phase workbooks, fused graphs and "
                         f"{FUSION_RULES_FILE} were not written")
        for phase, graph in graphs.items():
            files.extend(write_layer_dots(out, graph, records=records.get(phase, ())))
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
                files.append(write_onnx(graph, out / f"{phase}.onnx", model=model))
                if fused is not None:
                    files.append(write_onnx(fused[phase], out / f"{phase}.fused.onnx",
                                            model=model))
    return ExportResult(out_dir=out, files=files, notes=notes)


def export_capture(result: Any, out_dir: str | Path, *,
                   fused: Mapping[str, OpGraph] | None = None,
                   platform: str | None = None,
                   analytic_flops: Mapping[str, int | None] | None = None,
                   onnx: bool | None = None) -> ExportResult:
    """Write a :class:`~zrt_core.capture.api.CaptureResult` into ``out_dir``.

    Reads ``graphs``, and when present ``model``, ``config``, ``timings_s`` (seconds per
    phase) and ``flops_checks`` (the analytic FLOPs per phase, used unless
    ``analytic_flops`` is given); ``fused`` and ``platform`` as in :func:`export_graphs`.
    """
    timings = getattr(result, "timings_s", None)
    capture_s = {k: float(v) for k, v in timings.items()} if isinstance(timings, Mapping) \
        else None
    if analytic_flops is None:
        checks = getattr(result, "flops_checks", None) or {}
        analytic_flops = {phase: check.analytic for phase, check in checks.items()}
    model = getattr(result, "model", "") or ""
    config = getattr(result, "config", None)
    return export_graphs(out_dir, result.graphs, fused=fused, platform=platform,
                         config=config if isinstance(config, Mapping) else None,
                         model=str(model), analytic_flops=analytic_flops,
                         capture_s=capture_s, onnx=onnx)


def _write_fusion_rules(path: Path, graphs: Mapping[str, OpGraph],
                        fused: Mapping[str, OpGraph], records: Mapping[str, list[FusionRecord]], *, platform: str | None,
                        model: str) -> Path:
    packs: dict[str, None] = {}
    for graph in fused.values():
        packs.update(dict.fromkeys((graph.meta.get("fusion") or {}).get("packs", ())))
    data = {
        "model": model, "platform": platform, "packs": list(packs),
        "phases": {phase: {"raw_nodes": len(graphs[phase].nodes),
                           "fused_nodes": len(fused[phase].nodes),
                           "fusions": len(records[phase])} for phase in fused},
        "fusions": [r.to_json() for phase in fused for r in records[phase]],
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


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
