"""Print a price-coverage summary (zrt_core.cost.coverage) as a table."""

from __future__ import annotations

from typing import Any

from zrt_core.cli._output import table


def print_coverage(con: Any, cov: dict[str, Any],
                   table_dtypes: frozenset[str] | None = None) -> None:
    """The coverage summary and its biggest misses; with the dtypes the ``--tables`` rows
    hold, a line when no op was priced from them because the estimate's dtypes are others
    (a float32 profile beside a bf16 estimate)."""
    con.print("priced from: " + ", ".join(
        f"{source} {cov['ops'][source]:.0%} of ops / {cov['time'][source]:.0%} of time"
        for source in cov["ops"]))
    hint = dtype_hint(cov, table_dtypes)
    if hint:
        con.print(hint)
    if cov["misses"]:
        con.print(table("biggest misses (roofline-priced; profile these next)",
                        ("op", "dtype", "shapes", "calls", "share of time"),
                        [(m["op"], m["dtype"], " ".join("x".join(map(str, s))
                                                        for s in m["shapes"]),
                          m["calls"], f"{m['share']:.1%}") for m in cov["misses"]]))


def dtype_hint(cov: dict[str, Any], table_dtypes: frozenset[str] | None) -> str | None:
    """One line when the tables priced under half the time and none of the missed ops'
    floating dtypes is one the tables hold (a float32 profile beside a bf16 estimate);
    else None."""
    if not table_dtypes or cov["time"].get("measured", 0) + cov["time"].get(
            "interpolated", 0) >= 0.5:
        return None
    missed = sorted({m["dtype"] for m in cov["misses"]
                     if str(m["dtype"]).startswith(("float", "bfloat"))})
    if not missed or set(missed) & table_dtypes:
        return None
    return (f"the tables' rows are {', '.join(sorted(table_dtypes))}; this estimate's "
            f"missed ops are {', '.join(missed)} (profile with --dtype {missed[0]}, or run "
            "in the tables' precision)")
