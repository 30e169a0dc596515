"""The kinds of job the server runs: how a request is checked and normalised in the server
(no torch: a bad request is a 4xx before anything is queued) and what a worker process runs.

:data:`KINDS` is the registry. A kind is a :class:`JobKind`: ``prepare(body, ctx)`` returns
the payload stored with the job (every model already resolved by
:func:`~zrt_core.serve.sandbox.model_reference`), ``runner`` names the function a worker
calls as ``runner(payload, progress) -> (result, files)``, ``result`` being what the CLI's
``--json`` prints. New kinds (``search``, ``compare``) register here with
:func:`register_kind` and get their endpoint from :func:`zrt_core.serve.app.create_app`'s
loop over the registry.
"""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from zrt_core.errors import ZrtError
from zrt_core.serve.host import worker_host
from zrt_core.serve.sandbox import check_finite, check_no_remote_code, model_reference


@frozen
class PrepareContext:
    """What checking a request may use: the plugin host and the operator's model folder;
    ``files_read`` collects the model-folder names a request was resolved from (such a
    request's answer may change with the file, so it is never answered by its body alone)."""

    host: Any
    model_dir: Path | None
    files_read: list[str] = field(factory=list)

    def model(self, model: Any) -> Any:
        ref = model_reference(model, self.host, self.model_dir)
        if isinstance(model, str) and not isinstance(ref, str):
            self.files_read.append(model)
        return ref


@frozen
class JobKind:
    """One kind of job: ``POST /v1/<name>`` with a body of ``request_model``."""

    name: str
    summary: str
    request_model: Any
    prepare: Callable[[dict[str, Any], PrepareContext], dict[str, Any]]
    runner: str
    #: the body as sent (a spec document whose parser has its own defaults), not with the
    #: request model's defaults filled in
    as_sent: bool = False


KINDS: dict[str, JobKind] = {}


def register_kind(kind: JobKind) -> None:
    KINDS[kind.name] = kind




def run_job(kind: str, payload: dict[str, Any], progress: Callable[[int, int], None]
            ) -> tuple[Any, dict[str, bytes]]:
    """In a worker process: the kind's runner on a prepared payload."""
    import importlib

    module, _, name = KINDS[kind].runner.partition(":")
    return getattr(importlib.import_module(module), name)(payload, progress)


# -- estimate -------------------------------------------------------------------------------


def prepare_estimate(body: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
    """The ``zrt estimate`` spec document, its model resolved; then every check the CLI
    makes before the estimator runs (spec, hardware id, config numbers, layout)."""
    from zrt_core.analytic.spec import EstimateSpec
    from zrt_core.capture.sources import raw_config
    from zrt_core.checks import check_infer_request, check_train_request

    files = bool(body.pop("files", False))
    check_finite(body)
    spec_data = dict(body)
    spec_data["model"] = _spec_model(body.get("model"), ctx)
    spec = EstimateSpec.from_mapping(spec_data, where="request")
    ctx.host.hardware_spec(spec.hardware)
    config, where = raw_config(spec.model, ctx.host)
    check_no_remote_code(config, "model")
    if spec.workload == "train":
        check_train_request(config, spec.parallel, spec.train, num_gpus=spec.num_gpus,
                            where=where)
    else:
        check_infer_request(config, spec.parallel, spec.infer, where=where)
    return {"spec": spec_data, "files": files}


def _spec_model(model: Any, ctx: PrepareContext) -> Any:
    """An estimate spec's ``model`` (docs/estimate.md) with names resolved in the sandbox."""
    if isinstance(model, Mapping) and "config" in model:
        check_no_remote_code(model["config"], "model.config")
        return dict(model)
    if isinstance(model, Mapping) and set(model) == {"name"}:
        model = model["name"]
    if isinstance(model, str):
        ref = ctx.model(model)
        return ref if isinstance(ref, str) else {"config": ref, "name": model.strip()}
    return model  # model numbers, or something EstimateSpec refuses with its own message


def run_estimate(payload: dict[str, Any], progress: Callable[[int, int], None]
                 ) -> tuple[Any, dict[str, bytes]]:
    from zrt_core.analytic.spec import EstimateSpec
    from zrt_core.estimate.from_spec import estimate_from_spec

    spec = EstimateSpec.from_mapping(payload["spec"], where="request")
    host = worker_host()
    hw = host.hardware_spec(spec.hardware)
    report = estimate_from_spec(spec, host, hw, keep_timelines=payload["files"])
    files: dict[str, bytes] = {}
    if payload["files"]:
        from zrt_core.reports.files import write_inference_outputs, write_training_outputs

        write = write_training_outputs if spec.workload == "train" else write_inference_outputs
        files = _read_written(lambda d: write(report, d))
    return {"spec": spec.to_json(), **report.to_json()}, files


def _read_written(write: Callable[[Path], list[Path]]) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="zrt-serve-") as tmp:
        return {p.name: p.read_bytes() for p in write(Path(tmp))}


# -- capture --------------------------------------------------------------------------------


def prepare_capture(body: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
    """``zrt capture``'s arguments; the config's numbers checked before any torch."""
    from zrt_core.capture.sources import check_capture_request

    check_finite(body)
    payload = dict(body)
    payload["model"] = ctx.model(body["model"])
    payload["phases"] = list(dict.fromkeys(body["phases"]))
    check_capture_request(payload["model"], payload["phases"], payload["seq_len"], ctx.host)
    return payload


def run_capture(payload: dict[str, Any], progress: Callable[[int, int], None]
                ) -> tuple[Any, dict[str, bytes]]:
    from zrt_core.analytic.catalog import capture_json
    from zrt_core.capture.api import capture
    from zrt_core.capture.export import summarize

    result = capture(payload["model"], phases=payload["phases"], batch=payload["batch"],
                     seq_len=payload["seq_len"], host=worker_host(),
                     full_depth=payload["full_depth"], moe_imbalance=payload["moe_imbalance"],
                     dtype=payload["dtype"])
    analytic = {phase: check.analytic for phase, check in result.flops_checks.items()}
    timings = {k: float(v) for k, v in result.timings_s.items()}
    summaries = summarize(result.graphs, analytic_flops=analytic, capture_s=timings)
    return capture_json(result, summaries, None, timings), {}


# -- validate -------------------------------------------------------------------------------


def prepare_validate(body: dict[str, Any], ctx: PrepareContext) -> dict[str, Any]:
    """An inline list of records in the validation schema; a record whose config asks for
    remote code is refused (the rest of a record's problems are its own error row)."""
    from zrt_core.validate import records_from_data

    check_finite(body)
    records = records_from_data(body["records"], where="request.records")
    for record in records:
        model = record.raw.get("model")
        if isinstance(model, Mapping):
            check_no_remote_code(model.get("hf_config"), f"record {record.id}: model.hf_config")
    return dict(body)


def run_validate(payload: dict[str, Any], progress: Callable[[int, int], None]
                 ) -> tuple[Any, dict[str, bytes]]:
    from zrt_core.validate import Validator, records_from_data

    records = records_from_data(payload["records"], where="request.records")
    if payload.get("only"):
        records = [r for r in records if payload["only"] in r.id]
    validator = Validator(worker_host(), frontend=payload["frontend"])
    progress(0, len(records))
    run = validator.run(records, on_result=lambda i, n, r: progress(i + 1, n), path="request")
    return run.to_json(), {"results.csv": _results_csv(run.results)}


def _results_csv(results: Any) -> bytes:
    """One row per record and measured quantity: predicted, measured, error."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(("id", "status", "workload", "hardware", "num_gpus", "quantity",
                     "predicted", "measured", "error", "message"))
    for r in results:
        quantities = list(r.measured) or [""]
        for q in quantities:
            writer.writerow((r.id, r.status, r.workload, r.hardware, r.num_gpus or "", q,
                             r.predicted.get(q, ""), r.measured.get(q, ""),
                             r.error.get(q, ""), r.message))
    return out.getvalue().encode("utf-8")


def _register_builtin() -> None:
    from zrt_core.serve import models

    here = __name__
    register_kind(JobKind("estimate", "one training or serving estimate (zrt estimate)",
                          models.EstimateRequest, prepare_estimate, f"{here}:run_estimate",
                          as_sent=True))
    register_kind(JobKind("capture", "capture each phase's operator graph (zrt capture)",
                          models.CaptureRequest, prepare_capture, f"{here}:run_capture"))
    register_kind(JobKind("validate", "predict published measurements (zrt validate)",
                          models.ValidateRequest, prepare_validate, f"{here}:run_validate"))
    from zrt_core.serve import search_kinds

    register_kind(JobKind("search", "the best layouts of a model on a machine (zrt search)",
                          search_kinds.SearchRequest, search_kinds.prepare_search,
                          "zrt_core.serve.search_kinds:run_search"))
    register_kind(JobKind("compare", "the best machine for a model (zrt compare)",
                          search_kinds.CompareRequest, search_kinds.prepare_search,
                          "zrt_core.serve.search_kinds:run_compare"))


_register_builtin()


def request_error(exc: ZrtError) -> str:
    """The CLI's one line for an error."""
    return "zrt: error: " + " ".join(str(exc).split())
