"""The server's request and response bodies (pydantic), so ``/openapi.json`` describes every
endpoint. Request sections the CLI reads strictly (an estimate's ``parallel``, ``train`` and
``infer``) are passed to the same parser, so a bad key gets the CLI's message."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Largest batch, sequence or token count a request may ask for (2**31: far past any real
#: run, small enough that no count overflows what the estimators multiply it by).
MAX_COUNT = 1 << 31


class Problem(BaseModel):
    """An error (RFC 9457 problem details); ``detail`` is the line the CLI prints."""

    type: str = Field(description="'about:blank' or a zrt error class, e.g. "
                      "'zrt:ModelError'")
    title: str
    status: int
    detail: str


class EstimateRequest(BaseModel):
    """The ``zrt estimate`` spec document as JSON (docs/estimate.md)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "model": "llama3-8b", "hardware": "nvidia_h100_sxm", "parallel": {"tp": 1},
        "infer": {"input_len": 1024, "output_len": 128}}]})

    model: str | dict[str, Any] = Field(description="a bundled name (GET /v1/models), a "
                                        "path under the server's --model-dir, {config: "
                                        "{...}, name: LABEL}, or model numbers")
    hardware: str = Field(description="a hardware id or alias (GET /v1/hardware)")
    parallel: dict[str, Any] | None = Field(None, description="tp, pp, vp, cp, ep, etp, dp, "
                                            "sp, cp_kind, moe_load ({imbalance, "
                                            "distribution, redundant})")
    train: dict[str, Any] | None = Field(None, description="micro_batch, seq_len, ... "
                                         "(exactly one of train and infer)")
    infer: dict[str, Any] | None = Field(None, description="input_len, output_len, batch, "
                                         "concurrency, "
                                         "quant, kv_dtype, dtype, engine")
    frontend: Literal["analytic", "capture"] | None = None
    num_gpus: int | None = Field(None, ge=1, le=MAX_COUNT)


class CaptureRequest(BaseModel):
    """``zrt capture``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    model: str | dict[str, Any] = Field(description="a bundled name, a path under "
                                        "--model-dir, or a config.json mapping")
    phases: list[Literal["prefill", "decode", "train_forward", "train_backward"]] = Field(
        default=["prefill", "decode", "train_forward", "train_backward"], min_length=1)
    batch: int = Field(1, ge=1, le=MAX_COUNT)
    seq_len: int = Field(2048, ge=1, le=MAX_COUNT)
    full_depth: bool = False
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    moe_imbalance: float = Field(1.0, ge=1.0, le=1e6)


class ValidateRequest(BaseModel):
    """Records in the validation schema (shared/validation/SCHEMA.md), inline."""

    model_config = ConfigDict(extra="forbid")

    records: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)
    frontend: Literal["analytic", "capture"] = "capture"
    only: str | None = Field(None, description="records whose id contains this text")


class Progress(BaseModel):
    done: int
    total: int


class Job(BaseModel):
    """A job: ``result`` is what the CLI's ``--json`` prints once ``status`` is ``done``;
    ``error`` the CLI's one line once it is ``failed``."""

    id: str
    kind: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    request: dict[str, Any]
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    progress: Progress | None = None
    attempts: int
    created_s: float
    started_s: float | None = None
    finished_s: float | None = None
    files: list[str] = Field(default_factory=list, description="what GET /v1/jobs/{id}/NAME "
                             "serves")


class JobSummary(BaseModel):
    id: str
    kind: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    error: str | None = None
    progress: Progress | None = None
    created_s: float
    finished_s: float | None = None


class JobList(BaseModel):
    jobs: list[JobSummary]
    total: int


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    workers: int
    queued: int
    running: int


class HardwareList(BaseModel):
    hardware: list[dict[str, Any]]


class ModelList(BaseModel):
    models: list[dict[str, Any]]


class PluginList(BaseModel):
    plugins: list[dict[str, Any]]
