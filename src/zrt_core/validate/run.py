"""The run: ``Validator`` predicts every record (captures shared, one failure never stops the
rest) and :func:`validate` runs a file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zrt_core.checks import check_infer_request, check_train_request
from zrt_core.errors import ModelError, SpecError, ZrtError
from zrt_core.ir.graph import Phase
from zrt_core.source_flops import published_model_flops
from zrt_core.validate.cases import InferenceCase, inference_case, layer_case, training_case
from zrt_core.validate.records import Record, check_record, load_records
from zrt_core.validate.results import RecordResult, ValidationRun
from zrt_core.validate.schema import FRONTENDS, INFER_METRICS

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost


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
        if not report.fits and case.infer.batch is None:
            # offline max-throughput sizes its batch from the memory left: none left is no
            # throughput to compare (a 0 would be a number zrt cannot stand behind)
            raise SpecError(f"record {record.id}: no sequence fits beside the weights, so "
                            f"there is no max-throughput batch ({report.memory.message})",
                            "check the record's precision and layout against the "
                            "checkpoint that ran (a quantised checkpoint needs its precision)")
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
