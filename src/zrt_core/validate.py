"""``zrt validate``: predict every published measurement of a validation file and compare.

A validation file is a YAML list of records in the format of
``../shared/validation/SCHEMA.md`` (version 1): a model (a HuggingFace config mapping), a
machine, a parallel layout, a workload and what was measured. :func:`validate` predicts
each record with :func:`~zrt_core.estimate.training.estimate_training` (``workload:
train``), :func:`~zrt_core.estimate.estimate_inference` (``workload: infer``) or, for the
per-layer records of ``layer_micro.yaml`` (``layers_measured``, no ``workload``), the
training estimator's per-layer timelines, and reports ``(predicted − measured) /
measured`` for every measured quantity that zrt predicts.

The file is read strictly but tolerantly: a file that is not a list of mappings is an
error (exit 2); a record with an unknown key, a missing field, an unsupported model type,
a layout that does not divide the model or anything else zrt cannot predict becomes a
``status: error`` row with a one-line reason, and the run goes on.

Fields a source did not publish are ``null``; :func:`training_case`,
:func:`inference_case` and :func:`layer_case` take the defaults the named framework uses
(docs/validation.md lists them), and every default taken is listed in the record's
``assumptions``.

Captures are shared across records (one per model config, micro-batch, sequence and dtype
for training; per config and prompt length for serving) and kept on disk by the
estimators' capture caches (``$ZRT_CACHE_DIR``, see :mod:`zrt_core.estimate.captures`), so
a second run needs no torch. ``frontend="analytic"`` builds the graphs from the model numbers instead
(:mod:`zrt_core.analytic.builder`): no torch at all.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.checks import check_infer_request, check_train_request
from zrt_core.errors import ModelError, SpecError, UnknownNameError, ZrtError
from zrt_core.ir.graph import Phase
from zrt_core.source_flops import published_model_flops

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost
    from zrt_core.strategy import InferSpec, Parallel

SCHEMA_VERSION = 1
WORKLOADS = ("train", "infer", "layer")
FRONTENDS = ("capture", "analytic")

#: Measured quantities zrt predicts, per workload (anything else measured is kept and
#: shown, but has no error).
TRAIN_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu")
INFER_METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms")
LAYER_METRICS = ("fwd_ms_per_layer", "bwd_ms_per_layer", "fwd_plus_bwd_ms_per_layer")
#: The quantity a record is ranked by (the first one it measured).
PRIMARY = {
    "train": ("step_time_s", "tokens_per_s_per_gpu", "mfu"),
    "infer": ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "tpot_ms", "ttft_ms"),
    "layer": ("fwd_plus_bwd_ms_per_layer", "fwd_ms_per_layer", "bwd_ms_per_layer"),
}
#: Throughput quantities pooled into the summary's ``mape_throughput``.
THROUGHPUT = ("tokens_per_s_per_gpu", "output_tokens_per_s")
#: ``mfu`` is as each source defined it (often hardware FLOPs): shown, never summarised.
INFORMATIONAL = frozenset({"mfu"})

_COMMON_KEYS = frozenset({"id", "source", "trust", "workload", "model", "hardware", "num_gpus",
                          "parallel", "precision", "measured", "notes"})
_TRAIN_KEYS = frozenset({"recompute", "micro_batch", "global_batch", "seq_len"})
_INFER_KEYS = frozenset({"input_len", "output_len", "concurrency", "max_batch"})
_LAYER_KEYS = frozenset({"recompute", "micro_batch", "seq_len", "layers_measured"})
#: Keys either workload may carry as null (public.yaml gives every record every key).
_KNOWN_KEYS = _COMMON_KEYS | _TRAIN_KEYS | _INFER_KEYS | _LAYER_KEYS
#: ``pipeline_model_parallel_layout`` and ``decoder_first/last_pipeline_num_layers`` give an
#: uneven pipeline split by Megatron's argument names (``STAGE_SPLIT_FIELDS``).
_PARALLEL_KEYS = frozenset({"tp", "pp", "vp", "cp", "ep", "etp", "dp", "sp", "zero", "fsdp",
                            "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
                            "decoder_last_pipeline_num_layers"})
_MODEL_KEYS = frozenset({"name", "hf_config"})

#: Record precision → (zrt weight/activation quantisation, KV-cache dtype) for serving.
#: The quantised checkpoints the published serving numbers use (NVIDIA ModelOpt FP8 and
#: NVFP4) set ``kv_cache_quant_algo: FP8`` in their ``hf_quant_config.json``.
SERVING_PRECISION = {
    "bf16": ("none", None),
    "fp16": ("none", None),
    "fp8": ("fp8", "fp8"),
    "mxfp8": ("fp8", "fp8"),
    "nvfp4": ("fp4", "fp8"),
}


#: Validation files shipped inside the package (``zrt validate --suite NAME``): ``public``
#: is ``../shared/validation/public.yaml``, the published measured runs with their sources
#: (a test keeps the copy equal to it).
SUITES = {"public": "public.yaml"}
SUITE_DIR = Path(__file__).parent / "data" / "validation"


def suite_path(name: str) -> Path:
    """The shipped validation file of a suite.

    :raises UnknownNameError: no such suite.
    """
    if name not in SUITES:
        raise UnknownNameError(f"unknown validation suite {name!r}",
                               f"use one of {', '.join(SUITES)}, or pass a file")
    return SUITE_DIR / SUITES[name]


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


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


# -- defaults: from a record to the estimators' inputs ----------------------------------------


@frozen
class InferenceCase:
    """The inputs of one serving estimate read from a record, with the defaults taken."""

    config: Mapping[str, Any] = field(converter=_ro)
    hardware: str
    parallel: Parallel
    infer: InferSpec
    engine: str
    num_gpus: int
    assumptions: tuple[str, ...] = ()


def training_case(record: Record) -> Any:
    """A :class:`~zrt_core.estimate.training.TrainingCase` with Megatron-LM / NeMo defaults
    for null fields (:func:`~zrt_core.estimate.training.case_from_record`): dp = GPUs /
    (tp × cp × pp); SP on when tp > 1; the distributed optimizer (ZeRO-1); no FSDP; no
    recompute; micro-batch 1; bf16; expert TP = TP; 1F1B, interleaved when vp > 1; AdamW;
    Megatron-Core's overlap flags, or none for Megatron-LM as published in 2021-22."""
    from zrt_core.estimate.training import case_from_record

    _need_int(record, "num_gpus")
    _need_int(record, "global_batch")
    _need_int(record, "seq_len")
    return case_from_record(dict(record.raw))


def layer_case(record: Record) -> Any:
    """A one-micro-batch training case for a per-layer record (``layer_micro.yaml``): the
    global batch is one micro-batch per data-parallel replica and ZeRO is off (a layer's
    forward and backward do not depend on either); the rest as :func:`training_case`."""
    from attrs import evolve

    from zrt_core.estimate.training import case_from_record

    mb = record.raw.get("micro_batch") or 1
    par = dict(record.raw.get("parallel") or {})
    num_gpus = _need_int(record, "num_gpus")
    _need_int(record, "seq_len")
    tp, pp, cp = (int(par.get(k) or 1) for k in ("tp", "pp", "cp"))
    dp = int(par.get("dp") or max(1, num_gpus // (tp * pp * cp)))
    raw = {**record.raw, "workload": "train", "global_batch": int(mb) * dp,
           "parallel": {**par, "zero": par.get("zero") if par.get("zero") is not None else 0}}
    case = case_from_record(raw)
    return evolve(case, assumptions=(*case.assumptions,
                                     f"global_batch={int(mb) * dp} (one micro-batch per "
                                     "replica: the record times one layer)"))


def inference_case(record: Record) -> InferenceCase:
    """Serving inputs from an ``infer`` record, with these defaults for null fields:

    * every parallel degree 1 (``dp`` = GPUs / (tp × pp × cp) when null), sequence
      parallelism off, expert TP = TP;
    * precision → :data:`SERVING_PRECISION` (bf16 when null);
    * ``concurrency`` (or ``max_batch``) is the batch; null means offline max-throughput,
      the mode ``trtllm-bench`` and vLLM's throughput benchmark run;
    * the engine is vLLM when the source names it, TensorRT-LLM (``trtllm-bench``)
      otherwise.
    """
    from zrt_core.strategy import InferSpec, Parallel

    raw = record.raw
    num_gpus = _need_int(record, "num_gpus")
    input_len = _need_int(record, "input_len")
    output_len = _need_int(record, "output_len")
    par = dict(raw.get("parallel") or {})
    assumptions: list[str] = []

    def degree(key: str) -> int:
        v = par.get(key)
        if v is None:
            return 1
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecError(f"record {record.id}: parallel.{key} must be a positive "
                            f"integer, got {v!r}")
        return v

    tp, pp, cp, ep, vp = (degree(k) for k in ("tp", "pp", "cp", "ep", "vp"))
    if par.get("dp") is None:
        dp = max(1, num_gpus // (tp * pp * cp))
        if dp > 1:
            assumptions.append(f"dp={dp} (GPUs / (tp × pp × cp))")
    else:
        dp = degree("dp")
    etp = par.get("etp")
    parallel = Parallel(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=int(etp) if etp else None,
                        dp=dp, sp=par.get("sp"))
    precision = raw.get("precision")
    if precision is None:
        precision = "bf16"
        assumptions.append("precision=bf16")
    precision = str(precision).lower()
    if precision not in SERVING_PRECISION:
        raise SpecError(f"record {record.id}: precision {precision!r} is not a serving "
                        "precision zrt models",
                        f"use one of {', '.join(SERVING_PRECISION)}")
    quant, kv = SERVING_PRECISION[precision]
    if kv:
        assumptions.append(f"KV cache {kv} (quantised checkpoint's kv_cache_quant_algo)")
    batch = raw.get("concurrency") or raw.get("max_batch")
    if batch is None:
        assumptions.append("batch: offline max-throughput (trtllm-bench)")
    source = str(raw.get("source") or "")
    engine = "vllm" if "vllm" in source.lower() else "trtllm"
    dtype = "float16" if precision == "fp16" else "bfloat16"
    infer = InferSpec(input_len=input_len, output_len=output_len,
                      batch=int(batch) if batch else None, quant=quant, kv_dtype=kv,
                      dtype=dtype)
    config = dict(raw["model"]["hf_config"])
    return InferenceCase(config=config, hardware=record.hardware, parallel=parallel,
                         infer=infer, engine=engine, num_gpus=num_gpus,
                         assumptions=tuple(assumptions))


# -- results -------------------------------------------------------------------------------


@frozen
class RecordResult:
    """One record's outcome. ``error`` is ``(predicted − measured) / measured`` for each
    measured quantity that was predicted; a failed record has ``status == "error"`` and a
    one-line ``message``."""

    id: str
    status: str
    workload: str
    hardware: str
    num_gpus: int | None
    model_type: str = ""
    predicted: Mapping[str, float] = field(factory=dict, converter=_ro)
    measured: Mapping[str, float] = field(factory=dict, converter=_ro)
    error: Mapping[str, float] = field(factory=dict, converter=_ro)
    message: str = ""
    assumptions: tuple[str, ...] = field(default=(), converter=tuple)
    notes: tuple[str, ...] = field(default=(), converter=tuple)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def primary(self) -> str | None:
        """The quantity this record is ranked by: the first of :data:`PRIMARY` it has."""
        for k in PRIMARY.get(self.workload, ()):
            if k in self.error:
                return k
        return None

    def to_json(self) -> dict[str, Any]:
        if not self.ok:
            return {"id": self.id, "status": "error", "message": self.message,
                    "workload": self.workload, "hardware": self.hardware,
                    "num_gpus": self.num_gpus, "measured": dict(self.measured)}
        return {"id": self.id, "status": "ok", "predicted": dict(self.predicted),
                "measured": dict(self.measured), "error": dict(self.error),
                "workload": self.workload, "hardware": self.hardware,
                "num_gpus": self.num_gpus, "assumptions": list(self.assumptions),
                "notes": list(self.notes), "elapsed_s": self.elapsed_s}


def _mape(values: Iterable[float]) -> float | None:
    vals = [abs(v) for v in values]
    return statistics.fmean(vals) if vals else None


@frozen
class ValidationRun:
    """Every record's result, the file and the front-end used, and the wall time."""

    results: tuple[RecordResult, ...] = field(converter=tuple)
    path: str = ""
    frontend: str = "capture"
    elapsed_s: float = 0.0

    def errors_of(self, metric: str) -> list[float]:
        return [r.error[metric] for r in self.results if r.ok and metric in r.error]

    def summary(self, worst: int = 5) -> dict[str, Any]:
        """``records``, ``ok``, ``errors``, ``mape_step_time`` (train records),
        ``mape_throughput`` (tokens/s/GPU of train records and output tokens/s of infer
        records together), the MAPE per quantity and per workload, the ``worst`` records by
        the error of their primary quantity, and the failed records with their reasons."""
        ok = [r for r in self.results if r.ok]
        per_metric = {}
        for m in (*TRAIN_METRICS, *INFER_METRICS, *LAYER_METRICS):
            errs = self.errors_of(m)
            if errs:
                per_metric[m] = {"records": len(errs), "mape": _mape(errs),
                                 "bias": statistics.fmean(errs)}
        throughput = [e for m in THROUGHPUT for e in self.errors_of(m)]
        for r in ok:  # infer records measuring only the per-GPU rate
            if "output_tokens_per_s" not in r.error and \
                    "output_tokens_per_s_per_gpu" in r.error:
                throughput.append(r.error["output_tokens_per_s_per_gpu"])
        by_workload = {}
        for w in WORKLOADS:
            prim = [r.error[r.primary] for r in ok if r.workload == w and r.primary
                    and r.primary not in INFORMATIONAL]
            n = sum(1 for r in self.results if r.workload == w)
            if n:
                by_workload[w] = {"records": n,
                                  "ok": sum(1 for r in ok if r.workload == w),
                                  "mape_primary": _mape(prim)}
        ranked = sorted((r for r in ok if r.primary and r.primary not in INFORMATIONAL),
                        key=lambda r: -abs(r.error[r.primary]))
        from zrt_core.validate_groups import GROUPS, grouped

        groups = {f"by_{name}": grouped(self.results, key) for name, key in GROUPS.items()}
        return {
            "records": len(self.results),
            "ok": len(ok),
            "errors": len(self.results) - len(ok),
            "mape_step_time": _mape(self.errors_of("step_time_s")),
            "mape_throughput": _mape(throughput),
            "mape_by_quantity": per_metric,
            "by_workload": by_workload,
            **groups,
            "worst": [{"id": r.id, "quantity": r.primary, "error": r.error[r.primary]}
                      for r in ranked[:worst]],
            "failed": [{"id": r.id, "message": r.message} for r in self.results
                       if not r.ok],
            "frontend": self.frontend,
            "elapsed_s": self.elapsed_s,
        }

    def to_json(self) -> dict[str, Any]:
        """The shape SCHEMA.md specifies: ``records`` and ``summary``."""
        return {"schema_version": SCHEMA_VERSION, "file": self.path,
                "records": [r.to_json() for r in self.results],
                "summary": self.summary()}


# -- the run -------------------------------------------------------------------------------


class Validator:
    """Predicts records one by one, sharing captures between them.

    :param frontend: ``capture`` (FakeTensor capture of the HF model, cached on disk) or
        ``analytic`` (graphs built from the model numbers, no torch).
    :param use_cache: keep training captures on disk between runs (default: unless
        ``ZRT_NO_CACHE=1``); serving captures follow :func:`~zrt_core.estimate.
        load_or_capture`.
    """

    def __init__(self, host: PluginHost | None = None, *, frontend: str = "capture",
                 use_cache: bool | None = None) -> None:
        if frontend not in FRONTENDS:
            raise SpecError(f"unknown front-end {frontend!r}",
                            f"use one of {', '.join(FRONTENDS)}")
        if host is None:
            from zrt_core.plugins import get_plugin_manager

            host = get_plugin_manager()
        self.host = host
        self.frontend = frontend
        if use_cache is None:
            use_cache = os.environ.get("ZRT_NO_CACHE", "") not in ("1", "true", "yes")
        self.use_cache = use_cache
        self._memo: dict[str, Any] = {}

    # -- captures, shared across records --------------------------------------------------

    def training_capture(self, config: Mapping[str, Any], micro_batch: int, seq_len: int,
                         dtype: str) -> Any:
        """``train_forward`` + ``train_backward`` of one micro-batch: a
        :class:`~zrt_core.estimate.training.TrainingCapture` (captured, memoised and cached
        on disk by :func:`~zrt_core.estimate.training.capture_for_training`) or the analytic
        front-end's :class:`~zrt_core.capture.api.CaptureResult`."""
        key = _key({"config": dict(config), "mb": micro_batch, "seq": seq_len, "dtype": dtype,
                    "frontend": self.frontend, "phases": "train"})
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        phases = (Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD)
        if self.frontend == "analytic":
            from zrt_core.analytic.builder import analytic_capture

            result = analytic_capture(dict(config), phases=phases, batch=micro_batch,
                                      seq_len=seq_len, dtype=dtype, host=self.host)
        else:
            from zrt_core.estimate.training import capture_for_training

            result = capture_for_training(dict(config), micro_batch, seq_len, dtype=dtype,
                                          host=self.host, use_cache=self.use_cache)
        if len(self._memo) > 16:
            self._memo.pop(next(iter(self._memo)))
        self._memo[key] = result
        return result

    def serving_capture(self, config: Mapping[str, Any], input_len: int, dtype: str) -> Any:
        """``prefill`` + ``decode`` at batch 1 and the prompt length, as a
        :class:`~zrt_core.estimate.CapturedModel` (memoised; captures cached on disk)."""
        key = _key({"config": dict(config), "seq": input_len, "dtype": dtype,
                    "frontend": self.frontend, "phases": "serve"})
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        from zrt_core.estimate import CapturedModel, load_or_capture

        if self.frontend == "analytic":
            from zrt_core.analytic.builder import analytic_capture

            result = CapturedModel.from_capture(analytic_capture(
                dict(config), phases=(Phase.PREFILL, Phase.DECODE), batch=1,
                seq_len=input_len, dtype=dtype, host=self.host))
        else:
            result = load_or_capture(dict(config), input_len, host=self.host, dtype=dtype,
                                     use_cache=self.use_cache)
        if len(self._memo) > 16:
            self._memo.pop(next(iter(self._memo)))
        self._memo[key] = result
        return result

    # -- one record ---------------------------------------------------------------------

    def predict(self, record: Record) -> RecordResult:
        """Predict one (checked) record; a :class:`ZrtError` becomes an error row."""
        start = time.perf_counter()
        base = {"id": record.id, "workload": record.workload, "hardware": record.hardware,
                "num_gpus": record.num_gpus, "model_type": record.model_type,
                "measured": record.measured}
        try:
            if record.workload == "train":
                predicted, assumptions, notes = self._train(record)
            elif record.workload == "infer":
                predicted, assumptions, notes = self._infer(record)
            else:
                predicted, assumptions, notes = self._layer(record)
        except ZrtError as exc:
            return RecordResult(status="error", message=_one_line(str(exc)),
                                elapsed_s=time.perf_counter() - start, **base)
        except (TypeError, ValueError, KeyError, ArithmeticError) as exc:
            # a value of the wrong type or range that reached a constructor (tp: 0): the
            # record's problem, reported as such; the run goes on
            return RecordResult(status="error", elapsed_s=time.perf_counter() - start,
                                message=_one_line(f"record {record.id}: bad value: "
                                                  f"{type(exc).__name__}: {exc}"), **base)
        measured = record.measured
        error = {k: (predicted[k] - v) / v for k, v in measured.items()
                 if k in predicted and v and math.isfinite(predicted[k])}
        return RecordResult(status="ok", predicted=predicted, error=error,
                            assumptions=assumptions, notes=notes,
                            elapsed_s=time.perf_counter() - start, **base)

    def training_report(self, record: Record) -> tuple[Any, Any]:
        """``(TrainingReport, TrainingCase)`` of a ``train`` record."""
        from zrt_core.estimate.training import capture_dtype, estimate_case

        case = training_case(record)
        check_train_request(case.config, case.parallel, case.train, num_gpus=case.num_gpus,
                            stage_split=case.stage_split, layout=not case.layout_search,
                            where=f"record {record.id}")
        captured = self.training_capture(case.config, case.train.micro_batch,
                                         case.train.seq_len,
                                         capture_dtype(case.train.precision))
        return estimate_case(case, host=self.host, captured=captured), case

    def _train(self, record: Record) -> tuple[dict[str, float], tuple[str, ...], tuple[str,
                                                                                    ...]]:
        report, case = self.training_report(record)
        predicted = {"step_time_s": report.step_time_s,
                     "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu, "mfu": report.mfu}
        assumptions = case.assumptions
        counted = published_model_flops(record.raw)
        if counted is not None:
            # the MFU in the source's definition: its FLOPs over the predicted step
            flops, counter = counted
            peak = self.host.hardware_spec(case.hardware).compute.bf16_tflops * 1e12
            predicted["mfu"] = flops / (report.step_time_s * case.num_gpus * peak)
            assumptions = (*assumptions, f"MFU counted as the source did: {counter}")
        return predicted, assumptions, _notes(report.notes)

    def _layer(self, record: Record) -> tuple[dict[str, float], tuple[str, ...], tuple[str,
                                                                                    ...]]:
        """One layer's forward and backward, from the first pipeline stage's timelines:
        the mean time of a decoder layer's region (its compute and the communication it
        waits for; the backward's includes recomputation)."""
        from zrt_core.estimate.training import capture_dtype, estimate_case

        case = layer_case(record)
        check_train_request(case.config, case.parallel, case.train, num_gpus=case.num_gpus,
                            stage_split=case.stage_split, layout=not case.layout_search,
                            where=f"record {record.id}")
        captured = self.training_capture(case.config, case.train.micro_batch,
                                         case.train.seq_len,
                                         capture_dtype(case.train.precision))
        report = estimate_case(case, host=self.host, captured=captured, keep_timelines=True)
        fwd = _per_layer_s(report.timelines.get("forward"))
        bwd = _per_layer_s(report.timelines.get("backward"))
        if fwd is None or bwd is None:
            raise ModelError(f"record {record.id}: the estimate kept no per-layer timeline",
                             "the model has no decoder-layer template")
        predicted = {"fwd_ms_per_layer": fwd * 1e3, "bwd_ms_per_layer": bwd * 1e3,
                     "fwd_plus_bwd_ms_per_layer": (fwd + bwd) * 1e3}
        return predicted, case.assumptions, _notes(report.notes)

    def inference_report(self, record: Record) -> tuple[Any, InferenceCase]:
        """``(InferenceReport, InferenceCase)`` of an ``infer`` record."""
        from zrt_core.estimate import estimate_inference

        case = inference_case(record)
        if case.parallel.world_size != case.num_gpus:
            raise SpecError(
                f"record {record.id}: tp × cp × pp × dp = {case.parallel.world_size}, but "
                f"the run has {case.num_gpus} GPUs", "fix the record's parallel degrees")
        check_infer_request(case.config, case.parallel, case.infer, where=f"record {record.id}")
        captured = self.serving_capture(case.config, case.infer.input_len, case.infer.dtype)
        report = estimate_inference(None, case.hardware, case.parallel, case.infer,
                                    host=self.host, captured=captured, engine=case.engine)
        return report, case

    def _infer(self, record: Record) -> tuple[dict[str, float], tuple[str, ...], tuple[str,
                                                                                    ...]]:
        report, case = self.inference_report(record)
        out = report.to_json()
        predicted = {k: float(out[k]) for k in INFER_METRICS if out.get(k) is not None}
        return predicted, case.assumptions, _notes(report.notes)

    # -- the file -------------------------------------------------------------------------

    def run(self, records: Sequence[Record], *,
            on_result: Callable[[int, int, RecordResult], None] | None = None,
            path: str = "") -> ValidationRun:
        start = time.perf_counter()
        seen: set[str] = set()
        results = []
        for i, record in enumerate(records):
            try:
                check_record(record, seen)
            except ZrtError as exc:
                result = RecordResult(id=record.id, status="error", workload=record.workload,
                                      hardware=record.hardware, num_gpus=record.num_gpus,
                                      model_type=record.model_type,
                                      measured=record.measured, message=_one_line(str(exc)))
            else:
                result = self.predict(record)
            seen.add(record.id)
            results.append(result)
            if on_result is not None:
                on_result(i, len(records), result)
        return ValidationRun(results=results, path=path, frontend=self.frontend,
                             elapsed_s=time.perf_counter() - start)


def validate(path: str | os.PathLike[str], *, host: PluginHost | None = None,
             frontend: str = "capture", only: str | None = None,
             on_result: Callable[[int, int, RecordResult], None] | None = None,
             use_cache: bool | None = None) -> ValidationRun:
    """Predict every record of a validation file (``only``: ids containing this text).

    :raises SpecError: the file is unreadable or not a list of records.
    """
    records = load_records(path)
    if only:
        records = [r for r in records if only in r.id]
    validator = Validator(host, frontend=frontend, use_cache=use_cache)
    return validator.run(records, on_result=on_result, path=str(path))


# -- helpers -------------------------------------------------------------------------------


def _per_layer_s(timeline: Any) -> float | None:
    """Mean time of a decoder layer in a stage timeline: from the start of a layer region to
    the start of the next region (the layer's body, and any wait for what it prefetched)."""
    if timeline is None:
        return None
    placements = list(timeline.placements)
    spans = []
    for i, p in enumerate(placements):
        if p.layer_index is None:
            continue
        end = placements[i + 1].offset_s if i + 1 < len(placements) else \
            p.offset_s + p.region.body_s
        spans.append(end - p.offset_s)
    return statistics.fmean(spans) if spans else None


def _notes(notes: Iterable[str]) -> tuple[str, ...]:
    """The estimate's notes worth showing with a record (not the transform list)."""
    return tuple(n for n in notes if not n.startswith("graph transforms:"))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _key(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


__all__ = [
    "FRONTENDS",
    "INFER_METRICS",
    "LAYER_METRICS",
    "SERVING_PRECISION",
    "SUITES",
    "TRAIN_METRICS",
    "InferenceCase",
    "Record",
    "RecordResult",
    "ValidationRun",
    "Validator",
    "check_record",
    "inference_case",
    "layer_case",
    "load_records",
    "records_from_data",
    "suite_path",
    "training_case",
    "validate",
]
