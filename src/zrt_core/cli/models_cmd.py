"""``zrt models``: the bundled model configs."""

from __future__ import annotations

from zrt_core.cli._output import add_json_flag, console, print_json, table


def register(sub) -> None:
    p = sub.add_parser("models", help="list bundled model configs with parameter counts")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    models = sorted(host.models, key=lambda m: m.key)
    rows = [
        {
            "key": m.key, "name": m.name, "model_type": m.model_type,
            "total_params_b": m.total_params_b, "active_params_b": m.active_params_b,
            "distribution": host.models.distribution_of(m.key),
        }
        for m in models
    ]
    if args.json:
        print_json({"models": rows})
        return 0
    console().print(table(
        "bundled models", ("key", "model_type", "params (B)", "active (B)", "name"),
        [(r["key"], r["model_type"], _b(r["total_params_b"]), _b(r["active_params_b"]),
          r["name"]) for r in rows],
        justify=("left", "left", "right", "right", "left"),
    ))
    return 0


def _b(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"
