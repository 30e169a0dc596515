"""Shared output helpers: rich tables for people, JSON for machines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from zrt_core.errors import ZrtError


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


def positive_int(what: str) -> Callable[[str], int]:
    """An argparse type: a positive integer, or a one-line usage error naming ``what``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a positive integer, "
                                             f"got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} must be a positive integer, got {value}")
        return value

    return parse


def out_dir(out: str | Path) -> Path:
    """Create ``--out DIR`` (and parents); an unwritable place is a one-line error."""
    directory = Path(out)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ZrtError(f"cannot create {directory}: {exc.strerror or exc}",
                       "choose a writable --out directory") from None
    return directory
