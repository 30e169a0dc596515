"""User measured tables (``--tables DIR``): every ``*.csv`` in a directory, validated, put in
front of the hardware's own backends so they price first (exact hit or interpolation).
``--tables NAME`` names a table a plugin ships instead (``nvidia_h200/zrt_profile``), the
way to price from one it ships opt-in."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from zrt_core.errors import SpecError


def table_files(spec: str | Path, host: Any = None) -> list[Path]:
    """The CSVs ``--tables`` names: a directory's ``*.csv``, or the file of the table a
    plugin ships under the name ``spec``.

    :raises SpecError: neither a directory nor a shipped table's name; no CSV in it.
    """
    directory = Path(spec)
    if not directory.is_dir():
        shipped = {t.name: t for t in host.measured_tables} if host is not None else {}
        if str(spec) in shipped:
            return [Path(shipped[str(spec)].path)]
        names = ", ".join(sorted(shipped)) or "none"
        raise SpecError(f"--tables {spec}: not a directory nor a shipped table "
                        f"(shipped: {names})",
                        "give the directory zrt profile wrote its CSV tables to, or a "
                        "shipped table's name")
    files = sorted(directory.glob("*.csv"))
    if not files:
        raise SpecError(f"--tables {directory}: no *.csv tables",
                        "write them with zrt profile --out DIR")
    return files


def load_table_rows(directory: str | Path, hardware_id: str, host: Any = None) -> list[Any]:
    """The rows of every CSV ``--tables`` names (:func:`table_files`) that measure
    ``hardware_id``.

    :raises SpecError: no such directory or shipped table, no CSV, a malformed table
        (missing columns, negative times: named by file and line), or no row for
        ``hardware_id``.
    """
    from zrt_core.cost.measured import load_csv

    files = table_files(directory, host)
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

    rows = load_table_rows(directory, hardware.id, host)
    return [MeasuredBackend(hardware, rows), *build_backends(hardware, host)]


def register_tables(host: Any, directory: str | Path, hardware: Any) -> frozenset[str]:
    """Put the CSVs of ``directory`` that measure ``hardware`` into ``host`` as measured
    tables (plugin ``user-tables``), so every estimate prices from them first.

    :returns: the dtypes their rows hold (a coverage report names a run's others).
    :raises SpecError: as :func:`load_table_rows`.
    """
    from zrt_core import hookimpl
    from zrt_core.cost.measured import MeasuredTable

    rows = load_table_rows(directory, hardware.id, host)
    tables = [MeasuredTable(name=f"user/{f.name}", hardware_id=hardware.id, path=str(f),
                            description=f"--tables {directory}")
              for f in table_files(directory, host) if hardware.id in _hardware_ids(f)]
    @hookimpl
    def zrt_measured_tables() -> list[Any]:
        return list(tables)

    host.register(SimpleNamespace(zrt_measured_tables=zrt_measured_tables), "user-tables",
                  distribution="--tables")
    return frozenset(r.dtype for r in rows)
