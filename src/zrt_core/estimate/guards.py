"""Guards against silent nonsense: a prediction zrt cannot stand behind — captured FLOPs far
from the analytic count, a time or throughput that is zero, negative or not finite, a
broken identity — is an :class:`~zrt_core.errors.InternalError` naming the cause, never a
number (docs/input-checks.md). Both estimators call these before returning a report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from zrt_core.checks import mixers_not_modelled
from zrt_core.errors import InternalError, ModelError

#: Largest relative gap between a captured phase's FLOPs and the analytic count
#: (:func:`zrt_core.modelmath.flops.reference_flops`) a prediction may rest on. The captures
#: of all 90 bundled models agree within 0.3% forward and 2.0% backward (1,024 tokens;
#: docs/input-checks.md); a decode that lost its KV cache was −48.7%. ``zrt capture`` flags
#: gaps over the same 10%.
FLOPS_TOLERANCE = 0.10
#: FlashAttention's backward recomputes the scores: 5 of the attention's matmuls against the
#: forward's 2, i.e. 2.5 × the forward where the analytic reference counts 2 ×. The backward's
#: upper bound allows that on the attention term.
FLASH_BACKWARD_ATTENTION = 2.5 / 2.0
#: Relative slack of the report identities (float rounding over thousands of terms).
IDENTITY_TOLERANCE = 1e-6


def check_flops(config: Mapping[str, Any], graphs: Mapping[str, Any], host: Any,
                *, model: str = "the model") -> None:
    """Each captured phase's FLOPs against the analytic count of the same batch and length.

    Forward phases must lie within :data:`FLOPS_TOLERANCE`; ``train_backward`` between
    ``(1 − tol) × 2 × forward`` and ``(1 + tol) × (2 × forward + flash recompute)``. A
    family no reference describes, and a capture with imbalanced MoE routing (more expert
    work than balanced, on purpose), are not checked.

    :raises InternalError: naming the phase, both counts and the gap.
    """
    from zrt_core.modelmath.flops import reference_flops

    for phase, graph in graphs.items():
        meta = graph.meta
        batch = int(meta.get("batch") or 1)
        length = int((meta.get("kv_len") if phase == "decode" else None)
                     or meta.get("seq_len") or 0)
        if length <= 0 or float(meta.get("moe_imbalance") or 1.0) != 1.0:
            continue  # an imbalanced routing asks for more expert work than the count
        try:
            ref, _source = reference_flops(dict(config), phase, batch, length, host=host)
        except (ModelError, KeyError, TypeError, ValueError):
            continue  # no reference for this family: nothing to hold the capture to
        if ref.total <= 0:
            continue
        captured = graph.totals().flops
        low = ref.total * (1 - FLOPS_TOLERANCE)
        high = ref.total * (1 + FLOPS_TOLERANCE)
        if phase == "train_backward":
            high = (ref.total + (FLASH_BACKWARD_ATTENTION - 1) * ref.attention) * \
                (1 + FLOPS_TOLERANCE)
        if not low <= captured <= high:
            gap = (captured - ref.total) / ref.total
            error = mixers_not_modelled(config, model, f"the captured {phase} runs "
                                        "transformers' reference code for them, "
                                        f"{gap:+.1%} against the analytic count")
            if error is not None:
                raise error
            raise InternalError(
                f"{model}: the captured {phase} graph has {captured:.4g} FLOPs, the analytic "
                f"count {ref.total:.4g} ({gap:+.1%}, beyond the {FLOPS_TOLERANCE:.0%} "
                "tolerance): the graph is missing or repeating work (a KV cache, an expert, "
                "a patch), so no prediction is made from it")


def check_serving(report: Any) -> None:
    """TTFT and TPOT finite and positive; throughput finite, and zero only when the model
    does not fit (the report says so); memory figures finite and non-negative."""
    where = f"serving {report.model} on {report.hardware_id}"
    _positive(where, {"ttft_s": report.ttft_s, "tpot_s": report.tpot_s})
    throughput = {"output_tokens_per_s": report.output_tokens_per_s,
                  "output_tokens_per_s_per_gpu": report.output_tokens_per_s_per_gpu,
                  "requests_per_s": report.requests_per_s}
    _finite(where, throughput, minimum=0.0)
    if report.memory.fits:
        _positive(where, throughput, why="the model fits, so it must make progress")
    memory = report.memory
    _finite(where, {k: getattr(memory, k) for k in (
        "capacity", "weights", "activations", "kv_budget", "kv_per_token",
        "kv_per_sequence", "kv_in_use")}, minimum=0.0)


def check_training(report: Any) -> None:
    """Step, pipeline and compute times finite and positive, every part of them finite and
    non-negative, the identities holding, throughput and MFU/HFU finite and positive."""
    from zrt_core.reports.training import identities

    where = f"training {report.model} on {report.hardware_id}"
    _positive(where, {"step_time_s": report.step_time_s, "pipeline_s": report.pipeline_s,
                      "compute_s": report.compute_s, "forward_s": report.forward_s,
                      "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu,
                      "mfu": report.mfu, "hfu": report.hfu})
    _finite(where, {"backward_s": report.backward_s, "recompute_s": report.recompute_s,
                    "optimizer_s": report.optimizer_s,
                    "optimizer_comm_exposed_s": report.optimizer_comm_exposed_s,
                    **_prefixed("exposed_comm_s", report.exposed_comm_s),
                    **_prefixed("pipeline_exposed_comm_s", report.pipeline_exposed_comm_s),
                    **_prefixed("hidden_comm_s", report.hidden_comm_s)}, minimum=0.0)
    # the bubble is what the pipeline leaves over: rounding may take it a hair below zero
    _finite(where, {"bubble_s": report.bubble_s},
            minimum=-IDENTITY_TOLERANCE * report.pipeline_s)
    for name, (left, right) in identities(report).items():
        if not math.isclose(left, right, rel_tol=IDENTITY_TOLERANCE, abs_tol=1e-12):
            raise InternalError(f"{where}: the identity {name} fails ({left:.6g} vs "
                                f"{right:.6g}), so the breakdown cannot be trusted")
    if report.memory is not None:
        m = report.memory
        _finite(where, {k: getattr(m, k) for k in (
            "weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
            "transient_bytes", "comm_buffer_bytes")}, minimum=0.0)


def _prefixed(prefix: str, values: Mapping[str, float]) -> dict[str, float]:
    return {f"{prefix}[{k}]": v for k, v in values.items()}


def _positive(where: str, values: Mapping[str, Any], *, why: str = "") -> None:
    for name, value in _items(values):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise InternalError(f"{where}: {name} is {value!r}, not a finite positive number"
                                + (f" ({why})" if why else ""))


def _finite(where: str, values: Mapping[str, Any], *, minimum: float) -> None:
    for name, value in _items(values):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= minimum):
            raise InternalError(f"{where}: {name} is {value!r}, not a finite number "
                                f"≥ {minimum:g}")


def _items(values: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    return values.items()
