"""Files of ``--out DIR``: ``results.csv`` (every estimated layout, every field),
``results.xlsx`` (all results and a best-per-hardware sheet, styled headers) and
``search.html`` (self-contained: the Pareto scatter, the best layouts, comparison bars)."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Columns first in every table, in this order; the other fields follow alphabetically.
LEAD = ("strategy", "hardware", "gpus", "tp", "pp", "vp", "cp", "ep", "etp", "dp", "micro_batch",
        "recompute", "sharding", "pp_schedule", "precision", "quant", "batch", "fits",
        "meets_targets", "step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_gib",
        "ttft_ms", "tpot_ms", "output_tokens_per_s_per_gpu", "tokens_per_s_per_user")


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = {k for r in rows for k in r}
    return [k for k in LEAD if k in keys] + sorted(keys - set(LEAD))


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str)
    return value


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    cols = columns(rows)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow(["" if r.get(c) is None else _cell(r.get(c)) for c in cols])
    return path


def write_xlsx(sheets: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> Path:
    """One sheet per entry, bold white-on-blue frozen headers, columns sized to fit."""
    from openpyxl import Workbook
    from openpyxl.styles import Font, PatternFill
    from openpyxl.utils import get_column_letter

    wb = Workbook()
    wb.remove(wb.active)
    head_font = Font(bold=True, color="FFFFFF")
    head_fill = PatternFill("solid", fgColor="1F4E79")
    for name, rows in sheets.items():
        ws = wb.create_sheet(name[:31])
        cols = columns(rows)
        ws.append(cols)
        for cell in ws[1]:
            cell.font, cell.fill = head_font, head_fill
        for r in rows:
            ws.append([_cell(r.get(c)) for c in cols])
        ws.freeze_panes = "A2"
        for i, c in enumerate(cols, start=1):
            ws.column_dimensions[get_column_letter(i)].width = max(8, min(40, len(c) + 2))
    wb.save(path)
    return path


def write_search_outputs(result: Any, out: str | Path) -> list[Path]:
    """``results.csv``, ``results.xlsx`` and ``search.html`` of one search."""
    from zrt_core.search.compare import describe_layout

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    rows = [{"hardware": result.hardware, **r} for r in result.rows]
    best = [rows[i] for i in result.ranking[:1]]
    files = [write_csv(rows, directory / "results.csv"),
             write_xlsx({"results": rows, "best_per_hardware": best},
                        directory / "results.xlsx")]
    train = result.mode == "train"
    top = [rows[i] for i in result.ranking[:result.top_k]]
    files.append(_write_html(
        directory / "search.html", f"zrt search: {result.model} on {result.hardware}",
        rows, [rows[i] for i in result.pareto], top, train,
        {describe_layout(r, train): r for r in top}, result.rejected))
    return files


def write_compare_outputs(result: Any, out: str | Path) -> list[Path]:
    """``results.csv`` (every layout of every hardware), ``results.xlsx`` (the same and the
    best per hardware) and ``search.html`` (throughput bars and the fronts)."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    train = result.mode == "train"
    rows = [{"hardware": hw, **r} for hw, s in result.searches.items() for r in s.rows]
    best = list(result.results)
    files = [write_csv(rows, directory / "results.csv"),
             write_xlsx({"results": rows, "best_per_hardware": best},
                        directory / "results.xlsx")]
    pareto = [{"hardware": hw, **s.rows[i]} for hw, s in result.searches.items()
              for i in s.pareto]
    files.append(_write_html(
        directory / "search.html", f"zrt compare: {result.model}", rows, pareto,
        [r for r in best if "error" not in r], train,
        {r["hardware"]: r for r in best if "error" not in r}, {}))
    return files


def _write_html(path: Path, title: str, rows: Sequence[Mapping[str, Any]],
                pareto: Sequence[Mapping[str, Any]], best: Sequence[Mapping[str, Any]],
                train: bool, bars: Mapping[str, Mapping[str, Any]],
                rejected: Mapping[str, int]) -> Path:
    from zrt_core.reports.html import Section, bar_figure, page, table_html

    x, y = (("memory_gib", "tokens_per_s_per_gpu") if train
            else ("tokens_per_s_per_user", "output_tokens_per_s_per_gpu"))
    sections = [Section("Pareto front", _scatter(rows, pareto, x, y))]
    cols = columns(best)
    sections.append(Section("Best layouts", table_html(cols, [[_cell(r.get(c)) for c in cols]
                                                              for r in best])))
    if bars:
        sections.append(Section("Throughput", bar_figure(
            {k: float(v.get(y) or 0.0) for k, v in bars.items()},
            unit=y.replace("_", " "), title="best layouts")))
    if rejected:
        sections.append(Section("Removed", table_html(("rule", "layouts"),
                                                      sorted(rejected.items()))))
    path.write_text(page(title, sections, f"{len(rows):,} layouts estimated"),
                    encoding="utf-8")
    return path


def _scatter(rows: Sequence[Mapping[str, Any]], pareto: Sequence[Mapping[str, Any]],
             x: str, y: str) -> str:
    from zrt_core.reports.html import _pyplot, figure_svg

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = [(r[x], r[y]) for r in rows if r.get(x) is not None and r.get(y) is not None
           and r.get("fits")]
    if pts:
        ax.scatter(*zip(*pts, strict=True), s=8, alpha=0.35, color="#7f7f7f",
                   label="layouts that fit")
    front = sorted((r[x], r[y]) for r in pareto if r.get(x) is not None)
    if front:
        ax.plot(*zip(*front, strict=True), "o-", color="#d62728", ms=4, label="Pareto front")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_svg(fig)


def write_strategy_outputs(rows: Sequence[Mapping[str, Any]], out: str | Path,
                           title: str) -> list[Path]:
    """``results.csv``, ``results.xlsx`` and ``search.html`` (time, memory and throughput
    bars) of :func:`zrt_core.search.strategies.compare_strategies`."""
    from zrt_core.reports.html import Section, bar_figure, page, table_html

    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    files = [write_csv(rows, directory / "results.csv"),
             write_xlsx({"strategies": rows}, directory / "results.xlsx")]
    ok = [r for r in rows if "error" not in r]
    sections = [Section(what, bar_figure({r["strategy"]: float(r[key] or 0.0) for r in ok},
                                         unit=unit, title=what))
                for what, key, unit in (("Step time", "step_time_s", "s"),
                                        ("Memory per device", "memory_gib", "GiB"),
                                        ("Throughput", "tokens_per_s_per_gpu",
                                         "tokens/s per GPU")) if ok]
    cols = columns(rows)
    sections.append(Section("Layouts", table_html(cols, [[_cell(r.get(c)) for c in cols]
                                                         for r in rows])))
    path = directory / "search.html"
    path.write_text(page(title, sections), encoding="utf-8")
    files.append(path)
    return files
