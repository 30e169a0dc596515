"""Print a price-coverage summary (zrt_core.cost.coverage) as a table."""

from __future__ import annotations

from typing import Any

from zrt_core.cli._output import table


def print_coverage(con: Any, cov: dict[str, Any]) -> None:
    con.print("priced from: " + ", ".join(
        f"{source} {cov['ops'][source]:.0%} of ops / {cov['time'][source]:.0%} of time"
        for source in cov["ops"]))
    if cov["misses"]:
        con.print(table("biggest misses (roofline-priced; profile these next)",
                        ("op", "dtype", "shapes", "calls", "share of time"),
                        [(m["op"], m["dtype"], " ".join("x".join(map(str, s))
                                                        for s in m["shapes"]),
                          m["calls"], f"{m['share']:.1%}") for m in cov["misses"]]))
