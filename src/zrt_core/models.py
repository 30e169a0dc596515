"""Bundled model configs: HuggingFace ``config.json`` contents reachable by a short name.

The core bundles the configs in ``data/models/bundled.yaml``; plugins add theirs through
the ``zrt_model_configs`` hook. ``zrt models`` lists them with parameter counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from zrt_core._data import Fields, load_yaml
from zrt_core.errors import SpecError
from zrt_core.ir.graph import _frozen_mapping, _thaw

BUNDLED_FILE = Path(__file__).parent / "data" / "models" / "bundled.yaml"


@frozen
class BundledModel:
    """A named model config.

    :param key: the name users type (``llama3-70b``).
    :param hf_config: the ``config.json`` mapping (``model_type`` required).
    :param total_params_b: published total parameters, billions (for cross-checks).
    :param active_params_b: published active parameters per token (MoE), billions.
    :param source: where the config came from.
    """

    key: str
    name: str
    hf_config: Mapping[str, Any] = field(converter=_frozen_mapping)
    aliases: tuple[str, ...] = field(default=(), converter=tuple)
    total_params_b: float | None = None
    active_params_b: float | None = None
    source: str = ""

    @property
    def model_type(self) -> str:
        return str(self.hf_config["model_type"])

    def config_dict(self) -> dict[str, Any]:
        """A plain, mutable copy of the config mapping."""
        return _thaw(self.hf_config)


def load_bundled(path: str | Path = BUNDLED_FILE) -> list[BundledModel]:
    """Read a bundled-models YAML file (a list of entries)."""
    path = Path(path)
    data = load_yaml(path)
    if not isinstance(data, list):
        raise SpecError(f"{path}: expected a list of models")
    out = []
    for i, raw in enumerate(data):
        f = Fields(raw, f"{path}: [{i}]",
                   {"key", "name", "aliases", "total_params_b", "active_params_b",
                    "source", "hf_config"})
        cfg = f.mapping("hf_config")
        if "model_type" not in cfg:
            raise SpecError(f"{path}: [{i}].hf_config.model_type is required")
        out.append(BundledModel(
            key=f.str("key", required=True),
            name=f.str("name", required=True),
            hf_config=cfg,
            aliases=tuple(f.list("aliases")),
            total_params_b=f.number("total_params_b"),
            active_params_b=f.number("active_params_b"),
            source=f.str("source", "") or "",
        ))
    return out


def model_rows(host: Any) -> list[dict[str, Any]]:
    """Every registered model as ``zrt models --json`` lists it: published parameter counts
    where the entry has them, the analytic count from the config beside them."""
    rows = []
    for m in sorted(host.models, key=lambda m: m.key):
        computed_total, computed_active = _computed(m.config_dict())
        rows.append({
            "key": m.key, "name": m.name, "model_type": m.model_type,
            "aliases": list(m.aliases),
            "total_params_b": m.total_params_b, "active_params_b": m.active_params_b,
            "computed_total_params_b": computed_total,
            "computed_active_params_b": computed_active,
            "source": m.source,
            "distribution": host.models.distribution_of(m.key),
        })
    return rows


def _computed(config: Mapping[str, Any]) -> tuple[float | None, float | None]:
    from zrt_core.analytic.flops import param_counts
    from zrt_core.errors import ZrtError

    try:
        counts = param_counts(config)
    except ZrtError:
        return None, None
    return round(counts.total / 1e9, 3), round(counts.active / 1e9, 3)
