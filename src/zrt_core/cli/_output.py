"""Shared output helpers: rich tables for people, JSON for machines."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any


def console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=_default) + "\n")


def _default(value: Any) -> Any:
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "items"):
        return dict(value.items())
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
          justify: Sequence[str] | None = None):
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify=(justify[i] if justify else "left"))  # type: ignore[arg-type]
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def add_json_flag(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
