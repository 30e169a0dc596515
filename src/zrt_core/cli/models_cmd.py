"""``zrt models``: the bundled model configs, with parameter counts.

Published counts are shown where the entry has them; otherwise the analytic count from the
config (marked ``*``), so every entry has a number.
"""

from __future__ import annotations

from zrt_core.analytic.catalog import model_rows
from zrt_core.cli._output import add_json_flag, console, print_json, table


def register(sub) -> None:
    p = sub.add_parser("models", help="list bundled model configs with parameter counts")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    rows = model_rows(host)
    if args.json:
        print_json({"models": rows})
        return 0
    out = console()
    out.print(table(
        "bundled models", ("key", "model_type", "params (B)", "active (B)", "name"),
        [(r["key"], r["model_type"],
          _b(r["total_params_b"], r["computed_total_params_b"]),
          _active(r),
          r["name"]) for r in rows],
        justify=("left", "left", "right", "right", "left"),
    ))
    out.print("* computed from the config (no published figure); active is shown for "
              "mixture-of-experts models")
    return 0


def _active(row) -> str:
    """Active weights for MoE models; blank for dense ones, where it equals the total."""
    total, active = row["computed_total_params_b"], row["computed_active_params_b"]
    if row["active_params_b"] is None and active is not None and active == total:
        return ""
    return _b(row["active_params_b"], row["computed_active_params_b"])


def _b(published: float | None, computed: float | None) -> str:
    if published is not None:
        return _fmt(published)
    if computed is not None:
        return _fmt(computed) + "*"
    return "—"


def _fmt(billions: float) -> str:
    return f"{billions:.3f}" if billions < 1 else f"{billions:,.1f}"
