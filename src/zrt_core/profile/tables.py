"""User measured tables (``--tables DIR``): every ``*.csv`` in a directory, validated, put in
front of the hardware's own backends so they price first (exact hit or interpolation)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from zrt_core.errors import SpecError


def load_table_rows(directory: str | Path, hardware_id: str) -> list[Any]:
    """The rows of every CSV in ``directory`` that measure ``hardware_id``.

    :raises SpecError: no directory, no CSV, a malformed table (missing columns, negative
        times: named by file and line), or no row for ``hardware_id``.
    """
    from zrt_core.cost.measured import load_csv

    directory = Path(directory)
    if not directory.is_dir():
        raise SpecError(f"--tables {directory}: not a directory",
                        "give the directory zrt profile wrote its CSV tables to")
    files = sorted(directory.glob("*.csv"))
    if not files:
        raise SpecError(f"--tables {directory}: no *.csv tables",
                        "write them with zrt profile --out DIR")
    rows: list[Any] = []
    seen: set[str] = set()
    for f in files:
        load_csv(f, table=f.name)  # every table is checked, whatever it measures
        ids = _hardware_ids(f)
        seen |= ids
        if hardware_id in ids:
            rows.extend(load_csv(f, hardware_id=hardware_id, table=f.name))
    if not rows:
        raise SpecError(f"--tables {directory}: no row for hardware {hardware_id!r} "
                        f"(the tables measure {', '.join(sorted(seen)) or 'nothing'})",
                        "profile on this hardware, or pass the pack the tables were "
                        "measured with (--hw FILE.yaml)")
    return rows


def _hardware_ids(path: Path) -> set[str]:
    """The hardware ids a (validated) table's rows name."""
    import csv

    with open(path, encoding="utf-8", newline="") as fh:
        lines = [line for line in fh if line.strip() and not line.lstrip().startswith("#")]
    return {row["hardware_id"].strip() for row in csv.DictReader(lines)}


def backends_with_tables(hardware: Any, host: Any, directory: str | Path | None
                         ) -> list[Any] | None:
    """The hardware's backends with a :class:`MeasuredBackend` over the user's tables first;
    None (the host's own backends) without ``directory``."""
    if directory is None:
        return None
    from zrt_core.cost.measured import MeasuredBackend
    from zrt_core.cost.pricing import build_backends

    rows = load_table_rows(directory, hardware.id)
    return [MeasuredBackend(hardware, rows), *build_backends(hardware, host)]


def register_tables(host: Any, directory: str | Path, hardware: Any) -> None:
    """Put the CSVs of ``directory`` that measure ``hardware`` into ``host`` as measured
    tables (plugin ``user-tables``), so every estimate prices from them first.

    :raises SpecError: as :func:`load_table_rows`.
    """
    from zrt_core import hookimpl
    from zrt_core.cost.measured import MeasuredTable

    load_table_rows(directory, hardware.id)
    tables = [MeasuredTable(name=f"user/{f.name}", hardware_id=hardware.id, path=str(f),
                            description=f"--tables {directory}")
              for f in sorted(Path(directory).glob("*.csv"))
              if hardware.id in _hardware_ids(f)]
    @hookimpl
    def zrt_measured_tables() -> list[Any]:
        return list(tables)

    host.register(SimpleNamespace(zrt_measured_tables=zrt_measured_tables), "user-tables",
                  distribution="--tables")
