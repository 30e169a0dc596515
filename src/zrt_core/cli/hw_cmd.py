"""``zrt hw list`` and ``zrt hw show ID``."""

from __future__ import annotations

import sys

from zrt_core.cli._output import add_json_flag, console, print_json, table


def register(sub) -> None:
    p = sub.add_parser("hw", help="list and show hardware specs")
    hw_sub = p.add_subparsers(dest="hw_command", metavar="SUBCOMMAND", required=True)
    lst = hw_sub.add_parser("list", help="every installed hardware id")
    add_json_flag(lst)
    lst.set_defaults(func=run_list)
    show = hw_sub.add_parser("show", help="one spec in full")
    show.add_argument("id", help="hardware id or alias (h100, gb200, 910c, ...)")
    add_json_flag(show)
    show.set_defaults(func=run_show)


def run_list(args) -> int:
    from zrt_core.hardware import spec_summary
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    specs = sorted(host.hardware, key=lambda s: (s.vendor, s.id))
    if args.json:
        print_json({"hardware": [
            {**spec_summary(s), "distribution": host.hardware.distribution_of(s.id)}
            for s in specs
        ]})
        return 0
    if not specs:
        sys.stdout.write("no hardware installed: install a hardware pack, e.g. "
                         "`pip install -e plugins/zrt_nvidia` (see README.md)\n")
        return 0
    rows = [
        (s.id, s.name, f"{s.compute.bf16_tflops:g}", _opt(s.compute.fp8_tflops),
         _opt(s.compute.fp4_tflops), f"{s.memory.capacity_gb:g}",
         f"{s.memory.bandwidth_gb_per_s / 1000:g}",
         f"{s.scale_up_tier.name} ×{s.scale_up_devices}", ", ".join(s.aliases))
        for s in specs
    ]
    console().print(table(
        "hardware (dense peak)",
        ("id", "name", "bf16 TF", "fp8 TF", "fp4 TF", "HBM GB", "HBM TB/s", "scale-up",
         "aliases"),
        rows, justify=("left", "left", "right", "right", "right", "right", "right", "left",
                       "left"),
    ))
    return 0


def _opt(value: float | None) -> str:
    return "—" if not value else f"{value:g}"


def _unit(value: float | None, unit: str) -> str:
    return "—" if not value else f"{value:g} {unit}"


def run_show(args) -> int:
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    spec = host.hardware_spec(args.id)
    # a pack file given by path belongs to no distribution
    dist = (f"file {spec.source_file}" if spec.source_file == args.id
            else host.hardware.distribution_of(spec.id))
    if args.json:
        print_json({**spec.to_json(), "distribution": dist})
        return 0
    c = spec.compute
    rows = [
        ("name", spec.name), ("vendor", spec.vendor),
        ("distribution", dist),
        ("aliases", ", ".join(spec.aliases) or "—"),
    ]
    for key in ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4"):
        rows.append((f"{key} dense", _unit(c.get(key), "TFLOP/s")))
    rows.append(("int8 dense", _unit(c.int8_tops, "TOP/s")))
    rows.append(("softmax exp (SFU)", _unit(c.exp_tera_per_s, "T exp/s")))
    rows.append(("HBM", f"{spec.memory.capacity_gb:g} GB at "
                        f"{spec.memory.bandwidth_gb_per_s:g} GB/s"))
    for cache in spec.memory.caches:
        bw = f" at {cache.bandwidth_gb_per_s:g} GB/s" if cache.bandwidth_gb_per_s else ""
        rows.append((f"cache {cache.name}", f"{cache.capacity_mb:g} MB{bw}"))
    for i, tier in enumerate(spec.interconnect):
        domain = f"{tier.devices} devices" if tier.devices else "unbounded"
        rows.append((f"tier {i}: {tier.name}",
                     f"{tier.bandwidth_gb_per_s:g} GB/s per device per direction, "
                     f"{tier.latency_us:g} µs, {domain}, efficiency {tier.efficiency:g}"))
    e = spec.efficiency
    rows.append(("efficiency", f"matmul {e.matmul:g}, fp8 {_opt(e.matmul_fp8)}, "
                               f"fp4 {_opt(e.matmul_fp4)}, attention {e.attention:g}, "
                               f"memory {e.memory:g}, launch {e.launch_overhead_us:g} µs"))
    rows.append(("power", _unit(spec.power_w, "W")))
    if spec.compute.power_limited_clock != 1.0:
        rows.append(("training clock", f"{spec.compute.power_limited_clock:g} × the peaks' "
                                       "(power-limited; docs/cost-model.md)"))
    rows.append(("price", "—" if spec.price_per_device_hour_usd is None
                 else f"${spec.price_per_device_hour_usd:g} per device-hour"))
    rows.append(("checkpoint write", _unit(spec.checkpoint_write_gb_per_s, "GB/s per device")))
    rows.append(("source", spec.source or "—"))
    rows.append(("file", spec.source_file or "—"))
    console().print(table(spec.id, ("field", "value"), rows))
    return 0
