"""The ``zrt search`` and ``zrt compare`` jobs: their request bodies, the checks made before a
job is queued (the space, the hardware, the model), and the runners in the worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Bounds that keep one request's space finite; the per-job time limit bounds the rest.
_DEGREE = Field(None, min_length=1, max_length=16)
_GPUS = Field(min_length=1, max_length=16)


class _Space(BaseModel):
    """The search space as ``zrt search``'s flags give it (docs/search.md); a list fixes a
    dimension to those values, a missing one is searched."""

    model_config = ConfigDict(extra="forbid")

    model: str | dict[str, Any] = Field(description="a bundled name (GET /v1/models), a path "
                                        "under the server's --model-dir, or a config mapping")
    mode: Literal["train", "infer"] = "infer"
    gpus: list[int] = _GPUS
    # training
    global_batch: int | None = Field(None, ge=1, le=1 << 20)
    seq_len: int = Field(4096, ge=1, le=1 << 20)
    pp: list[int] | None = _DEGREE
    vp: list[int] | None = _DEGREE
    cp: list[int] | None = _DEGREE
    etp: list[int] | None = _DEGREE
    micro_batch: list[int] | None = _DEGREE
    recompute: list[Literal["none", "selective", "full", "op"]] | None = None
    sharding: list[Literal["zero0", "zero1", "zero2", "zero3", "fsdp"]] | None = None
    pp_schedule: list[str] | None = Field(None, max_length=8)
    precision: list[str] | None = Field(None, max_length=8)
    # both
    tp: list[int] | None = _DEGREE
    ep: list[int] | None = _DEGREE
    # serving
    input_len: int = Field(1024, ge=1, le=1 << 20)
    output_len: int = Field(128, ge=1, le=1 << 20)
    dp: list[int] | None = _DEGREE
    quant: list[str] | None = Field(None, max_length=8)
    batch: list[int] | None = Field(None, min_length=1, max_length=16)
    ttft_ms: float | None = Field(None, gt=0, le=1e9)
    tpot_ms: float | None = Field(None, gt=0, le=1e9)
    rate: float | None = Field(None, gt=0, le=1e9)
    engine: Literal["sglang", "trtllm", "vllm"] = "trtllm"
    top_k: int = Field(10, ge=1, le=100)


class SearchRequest(_Space):
    """``zrt search MODEL --hw ID ...`` as JSON."""

    hardware: str = Field(description="a hardware id or alias (GET /v1/hardware)")


class CompareRequest(_Space):
    """``zrt compare MODEL --hw A,B,...`` as JSON."""

    hardware: list[str] = Field(min_length=1, max_length=32,
                                description="hardware ids to compare, the first the baseline")


def _space(body: dict[str, Any]) -> Any:
    """The library's space value of a request (its checks: one line each, by body key)."""
    from zrt_core.search.space import space_from_values

    return space_from_values({k: tuple(x) if isinstance(x, list) else x
                              for k, x in body.items()}, name=str)


def _options(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("top_k", "ttft_ms", "tpot_ms", "rate", "engine")}


def prepare_search(body: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """The space built (its checks), the hardware id known, the model resolved in the
    sandbox; the search itself runs in a worker."""
    from zrt_core.serve.sandbox import check_finite

    check_finite(body)
    _space(body)
    ids = body["hardware"] if isinstance(body["hardware"], list) else [body["hardware"]]
    for hw_id in ids:
        ctx.host.hardware_spec(hw_id)
    payload = dict(body)
    payload["model"] = ctx.model(body["model"])
    return payload


def run_search(payload: dict[str, Any], progress: Callable[[int, int], None]
               ) -> tuple[Any, dict[str, bytes]]:
    from zrt_core.search.run import search
    from zrt_core.serve.host import worker_host

    result = search(payload["model"], payload["hardware"], _space(payload), host=worker_host(),
                    progress=progress, **_options(payload))
    return result.to_json(), {}


def run_compare(payload: dict[str, Any], progress: Callable[[int, int], None]
                ) -> tuple[Any, dict[str, bytes]]:
    from zrt_core.search.compare import compare
    from zrt_core.serve.host import worker_host

    result = compare(payload["model"], payload["hardware"], _space(payload),
                     host=worker_host(), **_options(payload))
    return result.to_json(), {}

