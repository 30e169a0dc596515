"""The inference report: what :func:`zrt_core.estimate.estimate_inference` returns, its JSON
for machines and its tables for people.

Times are per step on one device of one replica; throughput is the whole system (every DP
replica) and per GPU (over ``num_gpus`` devices). ``to_json`` keeps the keys the CLI's
``--json`` promises (``ttft_ms``, ``tpot_ms``, ``output_tokens_per_s``,
``output_tokens_per_s_per_gpu``, ``memory_gib_per_device``, ``max_batch``) at the top.
Memory is in GiB (2^30 bytes) and the device count is ``num_gpus``, as in the training
report's JSON: one convention for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

if TYPE_CHECKING:
    from zrt_core.schedule.timeline import Timeline

#: Memory is reported in GiB, as the training report does (and HBM sizes are given).
GIB = 2.0**30


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@frozen
class PhaseBreakdown:
    """One priced step (a prefill, a decode step, or a mixed in-flight iteration).

    :param time_s: the step's time on one device (pipeline stages summed).
    :param by_category_s: time per op category (matmul, attention, collective...).
    :param by_layer_kind_s: time per layer kind over all its layers; ``outside_layers`` for
        embedding, head and what runs between layers.
    :param per_layer_s: time of one layer of each kind.
    :param collectives: ``"group/kind"`` → ``{"count", "bytes", "time_s"}`` per step.
    """

    phase: str
    batch: int
    tokens: int
    time_s: float
    flops: int
    bytes: int
    by_category_s: Mapping[str, float] = field(converter=_ro)
    by_layer_kind_s: Mapping[str, float] = field(converter=_ro)
    per_layer_s: Mapping[str, float] = field(converter=_ro)
    layer_counts: Mapping[str, int] = field(converter=_ro)
    collectives: Mapping[str, Any] = field(converter=_ro)
    coverage: Mapping[str, float] = field(factory=dict, converter=_ro)
    price_coverage: Mapping[str, Any] = field(factory=dict, converter=_ro)

    @property
    def comm_s(self) -> float:
        return float(self.by_category_s.get("collective", 0.0))

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "batch": self.batch, "tokens": self.tokens,
                "time_ms": self.time_s * 1e3, "flops": self.flops, "bytes": self.bytes,
                "comm_ms": self.comm_s * 1e3,
                "by_category_ms": {k: v * 1e3 for k, v in sorted(
                    self.by_category_s.items(), key=lambda kv: -kv[1])},
                "by_layer_kind_ms": {k: v * 1e3 for k, v in self.by_layer_kind_s.items()},
                "per_layer_ms": {k: v * 1e3 for k, v in self.per_layer_s.items()},
                "layer_counts": dict(self.layer_counts),
                "collectives": {k: dict(v) for k, v in self.collectives.items()},
                "price_sources": dict(self.coverage),
                "price_coverage": dict(self.price_coverage)}


@frozen
class MemoryReport:
    """Memory of one device, bytes. ``fits`` is False when weights, activations and the
    runtime reserve leave nothing for the KV cache, or the batch's cache exceeds it.

    :param kv_per_token: cache bytes each token of a sequence adds.
    :param kv_per_sequence: cache bytes of one sequence of input + output tokens (whole KV
        blocks), fixed state included.
    :param kv_fixed_per_sequence: the part that does not grow with the sequence (sliding
        windows, SSM and convolution states).
    :param kv_by_layer_kind: layer kind → (bytes per token, fixed bytes) of its layers.
    """

    capacity: float
    weights: float
    activations: float
    reserve: float
    kv_budget: float
    kv_per_token: float
    kv_per_sequence: float
    kv_in_use: float
    fits: bool
    message: str = ""
    kv_fixed_per_sequence: float = 0.0
    kv_by_layer_kind: Mapping[str, tuple[float, float]] = field(factory=dict)

    @property
    def total_in_use(self) -> float:
        return self.weights + self.activations + self.reserve + self.kv_in_use

    def to_json(self) -> dict[str, Any]:
        return {"capacity_gib": self.capacity / GIB, "weights_gib": self.weights / GIB,
                "activations_gib": self.activations / GIB, "reserve_gib": self.reserve / GIB,
                "kv_budget_gib": self.kv_budget / GIB, "kv_cache_gib": self.kv_in_use / GIB,
                "kv_bytes_per_token": self.kv_per_token,
                "kv_bytes_per_sequence": self.kv_per_sequence,
                "kv_fixed_bytes_per_sequence": self.kv_fixed_per_sequence,
                "kv_by_layer_kind": {k: {"bytes_per_token": v[0], "fixed_bytes": v[1]}
                                     for k, v in self.kv_by_layer_kind.items()},
                "total_gib": self.total_in_use / GIB, "fits": self.fits,
                "message": self.message}


@frozen(eq=False)
class InferenceReport:
    """A serving prediction (see the module docstring).

    :param mode: ``latency`` (a given batch, static) or ``max_throughput`` (the batch the
        memory and the engine allow, with in-flight batching).
    :param batch: concurrent sequences per replica.
    :param throughput: the throughput model's own numbers (iteration times, tokens per
        iteration, engine settings).
    """

    model: str
    model_type: str
    hardware_id: str
    hardware_name: str
    parallel: Mapping[str, Any] = field(converter=_ro)
    workload: Mapping[str, Any] = field(converter=_ro)
    engine: str = "trtllm"
    mode: str = "latency"
    num_gpus: int = 1
    batch: int = 1
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    output_tokens_per_s: float = 0.0
    output_tokens_per_s_per_gpu: float = 0.0
    requests_per_s: float = 0.0
    max_batch: int = 0
    memory: MemoryReport | None = None
    prefill: PhaseBreakdown | None = None
    decode: PhaseBreakdown | None = None
    throughput: Mapping[str, Any] = field(factory=dict, converter=_ro)
    params: Mapping[str, Any] = field(factory=dict, converter=_ro)
    notes: tuple[str, ...] = field(default=(), converter=tuple)
    transforms: tuple[str, ...] = field(default=(), converter=tuple)
    timings_s: Mapping[str, float] = field(factory=dict, converter=_ro)
    timelines: Mapping[str, Timeline] = field(factory=dict, converter=_ro)

    @property
    def fits(self) -> bool:
        return self.memory is None or self.memory.fits

    def to_json(self) -> dict[str, Any]:
        mem = self.memory
        return {
            "ttft_ms": self.ttft_s * 1e3,
            "tpot_ms": self.tpot_s * 1e3,
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
            "memory_gib_per_device": (mem.total_in_use / GIB) if mem else None,
            "max_batch": self.max_batch,
            "batch": self.batch,
            "fits": self.fits,
            "mode": self.mode,
            "requests_per_s": self.requests_per_s,
            "model": self.model,
            "model_type": self.model_type,
            "hardware": self.hardware_id,
            "num_gpus": self.num_gpus,
            "parallel": dict(self.parallel),
            "workload": dict(self.workload),
            "engine": self.engine,
            "memory": mem.to_json() if mem else None,
            "prefill": self.prefill.to_json() if self.prefill else None,
            "decode": self.decode.to_json() if self.decode else None,
            "throughput_model": dict(self.throughput),
            "params": dict(self.params),
            "transforms": list(self.transforms),
            "notes": list(self.notes),
            "timings_s": dict(self.timings_s),
        }


def _layout(report: InferenceReport) -> str:
    n = report.num_gpus
    if n == 1:
        return "1 device, no parallelism"
    return f"{report.parallel.get('describe', '')} on {n} devices"


def summary_rows(report: InferenceReport) -> list[tuple[str, str]]:
    """``(label, value)`` rows for the people's table."""
    mem = report.memory
    # In max-throughput mode prompts and decodes share in-flight iterations: TTFT and TPOT
    # are those of the steady state, not of an idle engine.
    steady = " (steady state)" if report.mode == "max_throughput" else ""
    rows = [
        ("model", f"{report.model} ({report.model_type}, "
                  f"{report.params.get('total', 0) / 1e9:.2f} B params)"),
        ("hardware", f"{report.hardware_name} ({report.hardware_id})"),
        ("layout", _layout(report)),
        ("workload", f"input {report.workload.get('input_len')}, output "
                     f"{report.workload.get('output_len')}, quant "
                     f"{report.workload.get('quant')}, kv {report.workload.get('kv_dtype')}"),
        ("mode", f"{report.mode} ({report.engine})"),
        ("batch", f"{report.batch} sequences per replica (largest that fits: "
                  f"{report.max_batch})"),
        ("TTFT" + steady, f"{report.ttft_s * 1e3:.2f} ms"),
        ("TPOT" + steady, f"{report.tpot_s * 1e3:.3f} ms"),
        ("output throughput", f"{report.output_tokens_per_s:,.0f} tok/s "
                              f"({report.output_tokens_per_s_per_gpu:,.0f} per GPU)"),
    ]
    if mem is not None:
        rows.append(("memory / device", f"{mem.total_in_use / GIB:.1f} of "
                                        f"{mem.capacity / GIB:.1f} GiB (weights "
                                        f"{mem.weights / GIB:.1f}, KV "
                                        f"{mem.kv_in_use / GIB:.1f}, activations "
                                        f"{mem.activations / GIB:.1f})"))
        if not mem.fits:
            rows.append(("does not fit", mem.message))
    return rows
