"""The op workbook of one captured phase (``<phase>.ops.xlsx``): the model's config, the fused and
the raw op lists, whole-model totals, totals per layer kind and which rule fused what.

Every table sheet has a styled header row, panes frozen below it (and right of the id
column on the op lists) and an autofilter over the whole table. Written with openpyxl's
write-only mode: rows stream to the file, so a full-depth capture's tens of thousands of ops
cost seconds, not minutes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from zrt_core.capture.fusion_records import FusionRecord, fused_into
from zrt_core.capture.tables import OP_COLUMNS, PhaseSummary, layer_kind_rows, op_row
from zrt_core.ir.graph import OpGraph

#: The sheets, in workbook order.
SHEETS = ("Model Config", "Fused Operators", "Raw Operator Sequence", "Summary", "By Layer",
          "Fusion Rules")

CONFIG_COLUMNS = ("section", "key", "value")
FUSED_COLUMNS = (*OP_COLUMNS, "fusion_rule", "kernel", "raw_ops", "raw_ids")
RAW_COLUMNS = (*OP_COLUMNS, "fused_into", "fusion_rule")
SUMMARY_COLUMNS = ("graph", "ops", "FLOPs", "bytes", "analytic FLOPs", "gap", "gap > 10%",
                   "missing formulas", "capture s")
BY_LAYER_COLUMNS = ("layer kind", "layers", "raw ops", "fused ops", "raw FLOPs",
                    "fused FLOPs", "raw bytes", "fused bytes")
RULE_COLUMNS = ("pack", "rule", "kernel", "fused node", "fused op", "layer", "layer kind",
                "module path", "runs", "raw ops", "raw node ids", "raw op names")

HEADER_FILL = "1F4E78"
HEADER_FONT = "FFFFFF"
#: The most characters an Excel cell holds.
CELL_MAX_CHARS = 32_767
#: Widest column the writer sets (characters); longer cells wrap in Excel's view only.
MAX_WIDTH = 60

#: Graph meta keys shown in Model Config's ``capture`` section, in this order (others
#: follow); ``fusion`` and ``transforms`` are shown in their own rows.
CAPTURE_KEYS = ("model", "model_type", "source", "batch", "seq_len", "dtype", "full_depth",
                "moe_imbalance", "num_layers", "logits_positions", "frontend",
                "transformers_version", "torch_version")


def write_phase_workbook(path: Path, raw: OpGraph, fused: OpGraph,
                         records: Sequence[FusionRecord], *, raw_summary: PhaseSummary,
                         fused_summary: PhaseSummary, platform: str | None = None,
                         config: Mapping[str, Any] | None = None) -> Path:
    """Write the six sheets of :data:`SHEETS` for one phase to ``path``.

    :param raw: the captured graph; ``fused``: the fusion pass's output for it.
    :param records: :func:`~zrt_core.capture.fusion_records.fusion_records` of the pair.
    :param platform: the fusion platform the rules were chosen for (shown in Model Config).
    :param config: the model's config mapping (Model Config's ``config`` section).
    """
    from openpyxl import Workbook

    wb = Workbook(write_only=True)
    _table(wb, "Model Config", CONFIG_COLUMNS, _config_rows(raw, fused, platform, config),
           widths=(10, 32, MAX_WIDTH), literal=True)
    by_fused = {r.fused_node: r for r in records}
    _table(wb, "Fused Operators", FUSED_COLUMNS,
           [[*op_row(fused, n), *_made_by(by_fused.get(n.id))] for n in fused.nodes],
           freeze="C2")
    into = fused_into(list(records))
    _table(wb, "Raw Operator Sequence", RAW_COLUMNS,
           [[*op_row(raw, n), *_into(into.get(n.id))] for n in raw.nodes], freeze="C2")
    _table(wb, "Summary", SUMMARY_COLUMNS,
           [_summary_row("raw", raw_summary), _summary_row("fused", fused_summary)])
    _table(wb, "By Layer", BY_LAYER_COLUMNS, _by_layer_rows(raw, fused))
    _table(wb, "Fusion Rules", RULE_COLUMNS, [_rule_row(r) for r in records], freeze="C2")
    wb.save(path)
    return path


def _table(wb: Any, title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
           freeze: str = "A2", widths: Sequence[int] | None = None,
           literal: bool = False) -> None:
    """One sheet: the styled header, then ``rows``; panes frozen at ``freeze`` and an
    autofilter over header and rows. ``literal``: strings are text even where they start
    with ``=`` (cells of the user's config)."""
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.styles import Alignment, Border, Font, PatternFill, Side
    from openpyxl.utils import get_column_letter

    rows = [list(r) for r in rows]
    ws = wb.create_sheet(title)
    ws.freeze_panes = freeze
    last = get_column_letter(len(columns))
    ws.auto_filter.ref = f"A1:{last}{len(rows) + 1}"
    for i, name in enumerate(columns):
        if widths:
            width = widths[i]
        else:  # the header or the longest of the first 200 cells, whichever is wider
            width = max([len(name) + 4, *(len(_text(r[i])) + 2 for r in rows[:200])])
        ws.column_dimensions[get_column_letter(i + 1)].width = min(MAX_WIDTH, width)
    font = Font(bold=True, color=HEADER_FONT)
    fill = PatternFill("solid", fgColor=HEADER_FILL)
    border = Border(bottom=Side(style="thin", color="000000"))
    header = []
    for name in columns:
        cell = WriteOnlyCell(ws, value=name)
        cell.font, cell.fill, cell.border = font, fill, border
        cell.alignment = Alignment(horizontal="center", vertical="center")
        header.append(cell)
    ws.append(header)
    for row in rows:
        if literal:  # user text: "=..." stays text, never a formula
            row = [_literal(ws, v) if isinstance(v, str) and v.startswith("=") else v
                   for v in row]
        ws.append(row)


def _literal(ws: Any, text: str) -> Any:
    from openpyxl.cell import WriteOnlyCell

    cell = WriteOnlyCell(ws, value=text)
    cell.data_type = "s"
    return cell


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _cell(value: Any) -> Any:
    """A config value as a cell: numbers as they are, anything else as text (JSON for
    mappings and lists), without the control characters a workbook cannot hold and cut
    to the 32,767 characters a cell holds."""
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE

    if value is None or isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, str):
        try:
            value = json.dumps(_plain(value))
        except (TypeError, ValueError):
            value = str(value)
    value = ILLEGAL_CHARACTERS_RE.sub("", value)
    return value if len(value) <= CELL_MAX_CHARS else value[:CELL_MAX_CHARS - 1] + "…"


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _config_rows(raw: OpGraph, fused: OpGraph, platform: str | None,
                 config: Mapping[str, Any] | None) -> list[list[Any]]:
    meta = dict(raw.meta)
    rows: list[list[Any]] = [["capture", "phase", raw.phase]]
    keys = [k for k in CAPTURE_KEYS if k in meta]
    keys += [k for k in meta if k not in CAPTURE_KEYS and k not in ("fusion", "transforms")]
    rows += [["capture", k, _cell(meta[k])] for k in keys]
    summary = fused.meta.get("fusion") or {}
    rows.append(["fusion", "platform", platform or ""])
    rows.append(["fusion", "packs", ", ".join(summary.get("packs", ()))])
    rows.append(["fusion", "nodes_before", len(raw.nodes)])
    rows.append(["fusion", "nodes_after", len(fused.nodes)])
    rows += [["config", str(k), _cell(v)] for k, v in (config or {}).items()]
    return rows


def _made_by(record: FusionRecord | None) -> list[Any]:
    if record is None:
        return ["", "", None, ""]
    return [f"{record.pack}/{record.rule}", record.kernel, len(record.raw_nodes),
            ",".join(map(str, record.raw_nodes))]


def _into(record: FusionRecord | None) -> list[Any]:
    if record is None:
        return [None, ""]
    return [record.fused_node, f"{record.pack}/{record.rule}"]


def _summary_row(graph: str, s: PhaseSummary) -> list[Any]:
    return [graph, s.ops, s.flops, s.bytes, s.analytic_flops,
            None if s.gap is None else round(s.gap, 6), "YES" if s.gap_flagged else "",
            ", ".join(s.missing_formulas), s.capture_s]


def _by_layer_rows(raw: OpGraph, fused: OpGraph) -> list[list[Any]]:
    before = {r.kind: r for r in layer_kind_rows(raw)}
    after = {r.kind: r for r in layer_kind_rows(fused)}
    rows = []
    for kind in dict.fromkeys((*before, *after)):
        r, f = before.get(kind), after.get(kind)
        rows.append([kind, (r or f).layers,  # type: ignore[union-attr]
                     r.ops if r else 0, f.ops if f else 0, r.flops if r else 0,
                     f.flops if f else 0, r.bytes if r else 0, f.bytes if f else 0])
    return rows


def _rule_row(r: FusionRecord) -> list[Any]:
    return [r.pack, r.rule, r.kernel, r.fused_node, r.fused_op, r.layer_index,
            r.layer_kind or "", r.module_path, r.runs, len(r.raw_nodes),
            ",".join(map(str, r.raw_nodes)), ", ".join(r.raw_ops)]
