"""``compare()``: the best layout of one model on each of several machines, throughput
normalised to the first, energy per token from the packs' board power, and cost from a
price per GPU-hour (the user's, else the pack's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrs import field, frozen

from zrt_core.errors import SpecError, ZrtError
from zrt_core.search.space import ServeSpace, TrainSpace


@frozen
class CompareResult:
    """One row per hardware (its best layout and the comparison figures) and each
    hardware's :class:`~zrt_core.search.run.SearchResult`."""

    mode: str
    model: str
    results: tuple[dict[str, Any], ...]
    searches: Mapping[str, Any] = field(factory=dict, eq=False)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "model": self.model, "results": list(self.results)}


def parse_prices(text: str | None, hardware: Sequence[str]) -> dict[str, float]:
    """``h100=2.5,b200=6`` → ``{"h100": 2.5, "b200": 6.0}``; every id must be compared."""
    if not text:
        return {}
    prices: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        try:
            price = float(value)
        except ValueError:
            raise SpecError(f"--price {part!r} is not ID=USD_PER_GPU_HOUR",
                            "write e.g. --price h100=2.5,h200=3.2") from None
        if price <= 0:
            raise SpecError(f"--price for {name} must be positive, got {price:g}",
                            "give a price per GPU-hour in USD")
        if name not in hardware:
            raise SpecError(f"--price names {name}, which is not in the comparison "
                            f"({', '.join(hardware)})", "price only hardware you compare")
        prices[name] = price
    return prices


def load_groups(path: str | Path) -> dict[str, list[str]]:
    """The reference design's ``comparison_hw_groups`` from a YAML file: a mapping of group
    name to hardware ids (the first of each group is the baseline)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}",
                        "give a readable YAML file") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}",
                        "fix the file") from None
    groups = data.get("comparison_hw_groups") if isinstance(data, dict) else None
    if not isinstance(groups, dict) or not groups or not all(
            isinstance(v, list) and v and all(isinstance(x, str) for x in v)
            for v in groups.values()):
        raise SpecError(f"{path} has no comparison_hw_groups mapping of names to lists of "
                        "hardware ids", "write comparison_hw_groups: {name: [h100, h200]}")
    return {str(k): list(v) for k, v in groups.items()}


def compare(model: Any, hardware: Sequence[str] | Mapping[str, Sequence[str]],
            space: TrainSpace | ServeSpace, *, prices: Mapping[str, float] | None = None,
            host: Any = None, progress: Callable[[str], None] | None = None,
            **search_options: Any) -> CompareResult:
    """Search ``space`` on each hardware (a list, or groups: name → ids) and compare the
    winners. Throughput is tokens/s per GPU (training) or output tokens/s per GPU (serving),
    normalised to the first hardware of its group.

    :raises SpecError: an unknown hardware id (checked before any search runs).
    """
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.run import search

    host = host or get_plugin_manager()
    groups = dict(hardware) if isinstance(hardware, Mapping) else {"": list(hardware)}
    specs = {}
    for ids in groups.values():
        for hw_id in ids:
            if hw_id not in specs:
                specs[hw_id] = host.hardware_spec(hw_id)  # unknown: one line, exit 2
    prices = dict(prices or {})
    train = isinstance(space, TrainSpace)
    key = "tokens_per_s_per_gpu" if train else "output_tokens_per_s_per_gpu"
    rows: list[dict[str, Any]] = []
    searches: dict[str, Any] = {}
    for group, ids in groups.items():
        base = None
        for hw_id in ids:
            if progress:
                progress(hw_id)
            spec = specs[hw_id]
            row: dict[str, Any] = {"group": group or None, "hardware": spec.id,
                                   "hardware_name": spec.name}
            try:
                result = searches.get(hw_id) or search(model, spec, space, host=host,
                                                       full_report=False, **search_options)
            except ZrtError as exc:
                row["error"] = str(exc)
                rows.append(row)
                continue
            searches[hw_id] = result
            best = result.winner
            row.update({"evaluated": result.evaluated, "layout": _layout(best, train),
                        **best})
            per_gpu = best[key]
            if base is None:
                base = per_gpu
            row["normalised_throughput"] = per_gpu / base if base else None
            # energy: every GPU at its board power for the time it takes to make a token
            row["joules_per_token"] = (spec.power_w / per_gpu if spec.power_w and per_gpu
                                       else None)
            price = prices.get(hw_id, spec.price_per_device_hour_usd)
            row["price_per_gpu_hour_usd"] = price
            row["usd_per_million_tokens"] = (price / 3600.0 / per_gpu * 1e6
                                             if price and per_gpu else None)
            if train and price:
                row["usd_per_step"] = best["step_time_s"] * best["gpus"] * price / 3600.0
            rows.append(row)
    model_name = next((s.model for s in searches.values()), str(model))
    return CompareResult(mode="train" if train else "infer", model=model_name,
                         results=tuple(rows), searches=searches)


def _layout(row: Mapping[str, Any], train: bool) -> str:
    if train:
        return (f"tp{row['tp']} pp{row['pp']} vp{row['vp']} cp{row['cp']} ep{row['ep']} "
                f"dp{row['dp']} mb{row['micro_batch']} {row['recompute']} {row['sharding']} "
                f"{row['pp_schedule']} {row['precision']}")
    return f"tp{row['tp']} ep{row['ep']} dp{row['dp']} {row['quant']} batch {row['batch']}"


describe_layout = _layout
