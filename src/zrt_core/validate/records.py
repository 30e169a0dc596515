"""Records: a validation file read strictly, each record checked before anything is predicted."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.errors import SpecError
from zrt_core.strategy import EP_DISPATCHERS
from zrt_core.validate.schema import (
    _KNOWN_KEYS,
    _MODEL_KEYS,
    _PARALLEL_KEYS,
    LAYER_METRICS,
    WORKLOADS,
    _ro,
)

if TYPE_CHECKING:
    pass


# -- records -------------------------------------------------------------------------------


@frozen
class Record:
    """One record of a validation file, as read (``raw``), with its position in the file."""

    index: int
    id: str
    workload: str
    raw: Mapping[str, Any] = field(converter=_ro)

    @property
    def hardware(self) -> str:
        return str(self.raw.get("hardware") or "")

    @property
    def num_gpus(self) -> int | None:
        n = self.raw.get("num_gpus")
        return int(n) if isinstance(n, int) and not isinstance(n, bool) else None

    @property
    def measured(self) -> dict[str, float]:
        m = self.raw.get("measured")
        if not isinstance(m, Mapping):
            return {}
        return {str(k): float(v) for k, v in m.items()
                if isinstance(v, int | float) and not isinstance(v, bool)}

    @property
    def model_type(self) -> str:
        model = self.raw.get("model")
        cfg = model.get("hf_config") if isinstance(model, Mapping) else None
        return str(cfg.get("model_type") or "") if isinstance(cfg, Mapping) else ""


def load_records(path: str | os.PathLike[str]) -> list[Record]:
    """Read a validation file: a YAML list of mappings, each with an ``id``.

    :raises SpecError: the file cannot be read or parsed, or is not a list of mappings.
    """
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{p}: cannot read the validation file ({exc.strerror})",
                        "pass a YAML file in the format of ../shared/validation/SCHEMA.md"
                        ) from None
    try:
        # libyaml's safe loader where PyYAML has it: the same documents, 6x faster (the
        # 1.1 MB public suite parses in 0.7 s instead of 4.7 s)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{p}:{where} is not valid YAML",
                        "fix the YAML syntax (SCHEMA.md shows a record)") from None
    return records_from_data(data, where=str(p))


def records_from_data(data: Any, *, where: str = "validation file") -> list[Record]:
    """Records from parsed YAML; see :func:`load_records`."""
    if not isinstance(data, list):
        raise SpecError(f"{where}: expected a list of records, got "
                        f"{type(data).__name__}",
                        "a validation file is a YAML list (see SCHEMA.md)")
    out: list[Record] = []
    for i, raw in enumerate(data):
        if not isinstance(raw, Mapping):
            raise SpecError(f"{where}: record {i + 1} is a {type(raw).__name__}, not a "
                            "mapping", "every list item is one record (see SCHEMA.md)")
        rid = raw.get("id")
        rid = str(rid) if rid not in (None, "") else f"record-{i + 1}"
        out.append(Record(index=i, id=rid, workload=_workload_of(raw), raw=raw))
    return out


def _workload_of(raw: Mapping[str, Any]) -> str:
    w = raw.get("workload")
    if w is None and (raw.get("layers_measured") is not None or any(
            k in (raw.get("measured") or {}) for k in LAYER_METRICS)):
        return "layer"  # layer_micro.yaml: one layer's forward and backward
    return str(w) if w is not None else ""


def check_record(record: Record, seen: set[str]) -> None:
    """The checks every record passes before it is predicted (strict keys, unique id).

    :raises SpecError: naming the record and the key.
    """
    raw = record.raw
    rid = record.id
    if record.id in seen:
        raise SpecError(f"record {rid}: duplicate id", "ids must be unique in a file")
    if record.workload not in WORKLOADS:
        raise SpecError(f"record {rid}: unknown workload {raw.get('workload')!r}",
                        "use workload: train or infer")
    unknown = sorted(set(map(str, raw)) - _KNOWN_KEYS)
    if unknown:
        raise SpecError(f"record {rid}: unknown key {unknown[0]!r}",
                        f"known keys: {', '.join(sorted(_KNOWN_KEYS))}")
    par = raw.get("parallel")
    if par is not None and not isinstance(par, Mapping):
        raise SpecError(f"record {rid}: parallel must be a mapping",
                        "e.g. parallel: {tp: 8, pp: 1, dp: 4}")
    bad = sorted(set(map(str, par or {})) - _PARALLEL_KEYS)
    if bad:
        raise SpecError(f"record {rid}: unknown parallel key {bad[0]!r}",
                        f"use {', '.join(sorted(_PARALLEL_KEYS))}")
    dispatcher = (par or {}).get("ep_dispatcher")
    if dispatcher is not None and dispatcher not in EP_DISPATCHERS:
        raise SpecError(f"record {rid}: parallel.ep_dispatcher {dispatcher!r} is not one of "
                        f"{', '.join(EP_DISPATCHERS)}", "leave it out for Megatron's alltoall")
    for key in ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "decoder_first_pipeline_num_layers",
                "decoder_last_pipeline_num_layers"):
        v = (par or {}).get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise SpecError(f"record {rid}: parallel.{key} must be a positive integer or "
                            f"null, got {v!r}")
    layout = (par or {}).get("pipeline_model_parallel_layout")
    if layout is not None and not isinstance(layout, str):
        raise SpecError(f"record {rid}: parallel.pipeline_model_parallel_layout must be a "
                        f"string or null, got {layout!r}", "e.g. 'Et|(tt|)*30mL'")
    if (par or {}).get("zero") not in (None, 0, 1, 2, 3):
        raise SpecError(f"record {rid}: parallel.zero must be 0, 1, 2, 3 or null, got "
                        f"{par['zero']!r}")
    model = raw.get("model")
    if not isinstance(model, Mapping) or not isinstance(model.get("hf_config"), Mapping):
        raise SpecError(f"record {rid}: model.hf_config is missing",
                        "give the model's config.json as a mapping under model.hf_config")
    bad = sorted(set(map(str, model)) - _MODEL_KEYS)
    if bad:
        raise SpecError(f"record {rid}: unknown model key {bad[0]!r}",
                        "model holds name and hf_config")
    if not raw.get("hardware"):
        raise SpecError(f"record {rid}: hardware is missing", "give a hardware id")
    measured = raw.get("measured")
    if not isinstance(measured, Mapping) or not measured:
        raise SpecError(f"record {rid}: measured is missing or empty",
                        "a record holds at least one measured quantity")
    # fields the estimators' constructors would otherwise reject with their own text
    for key in ("micro_batch", "concurrency", "max_batch"):
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            raise SpecError(f"record {rid}: {key} must be a positive integer or null, got "
                            f"{v!r}", "null takes the default (SCHEMA.md)")
    if record.workload != "infer":
        from zrt_core.strategy import PRECISIONS, RECOMPUTE

        for key, allowed in (("recompute", RECOMPUTE), ("precision", PRECISIONS)):
            v = raw.get(key)
            if key == "precision" and isinstance(v, str):
                v = v.lower()  # read as serving records are: FP8 is fp8
            if v is not None and v not in allowed:
                raise SpecError(f"record {rid}: {key} {v!r} is not one zrt models for "
                                "training", f"use one of {', '.join(allowed)}, or null")


def _need_int(record: Record, key: str) -> int:
    v = record.raw.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SpecError(f"record {record.id}: {key} must be a positive integer, got {v!r}",
                        "see ../shared/validation/SCHEMA.md")
    return v
