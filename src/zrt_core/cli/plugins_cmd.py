"""``zrt plugins``: installed plugins, their versions, hooks and contributions."""

from __future__ import annotations

from zrt_core.cli._output import add_json_flag, console, print_json, table


def register(sub) -> None:
    p = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    infos = host.plugin_infos()
    if args.json:
        print_json({"plugins": [i.to_json() for i in infos]})
        return 0
    rows = []
    for info in infos:
        contributed = "; ".join(
            f"{hook.removeprefix('zrt_')}: {len(names)}"
            + (f" ({', '.join(names[:4])}{', …' if len(names) > 4 else ''})" if names else "")
            for hook, names in info.contributions.items()
        )
        hooks = ", ".join(h.removeprefix("zrt_") for h in info.hooks) or "—"
        rows.append((info.name, info.distribution, info.version, hooks, contributed or "—"))
    console().print(table("zrt plugins",
                          ("plugin", "distribution", "version", "hooks", "contributes"), rows))
    return 0
