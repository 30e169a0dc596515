"""Shared output helpers: rich tables for people, JSON for machines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from zrt_core.errors import ZrtError

#: Width of tables written to a pipe or a file: the tables' own width (no wrapping at 80
#: columns, rich's default when stdout is not a terminal), up to this many columns.
PIPE_WIDTH = 1000
#: ``--width N`` from the command line (None: the terminal's width, or PIPE_WIDTH).
_width: int | None = None


def set_width(width: int | None) -> None:
    global _width
    _width = width


def console_width() -> int | None:
    """``--width``, else ``COLUMNS``, else None (rich asks the terminal) on a terminal and
    :data:`PIPE_WIDTH` elsewhere, so a table piped to a file or ``less`` is not squeezed."""
    import os

    if _width is not None:
        return _width
    if os.environ.get("COLUMNS", "").strip().isdigit():
        return int(os.environ["COLUMNS"])
    return None if sys.stdout.isatty() else PIPE_WIDTH


def console():
    """A rich console that prints text literally: no highlighting, no markup (an install
    hint such as ``zrt-core[onnx]`` keeps its brackets), no wrapping of long lines."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False, markup=False, width=console_width())


def add_width_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--width", type=positive_int("--width"), default=None, metavar="N",
                        help="table width in columns (default: the terminal's; the tables' "
                        "own width when stdout is not a terminal)")


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
    for r in rows:  # a rich Text keeps its style; anything else prints as its str()
        t.add_row(*("" if v is None else v if hasattr(v, "stylize") else str(v) for v in r))
    return t


def styled(text: str, style: str):
    """``text`` printed literally in ``style`` (the console parses no markup)."""
    from rich.text import Text

    return Text(text, style=style)


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
