"""The core's own contributions, registered through the same hooks plugins use."""

from __future__ import annotations

from zrt_core.hookspecs import hookimpl


@hookimpl
def zrt_model_configs():
    from zrt_core.models import load_bundled

    return load_bundled()


@hookimpl
def zrt_cost_backends():
    """The roofline (prices every node, lowest priority) and the measured-table backend
    (prices what the hardware plugins' tables cover, exactly or interpolated)."""
    from zrt_core.cost import measured, roofline
    from zrt_core.cost.backend import CostBackendSpec

    return [
        CostBackendSpec(
            name=measured.NAME, factory=measured.MeasuredBackend.for_hardware,
            priority=measured.PRIORITY,
            description="measured kernel times from zrt_measured_tables, exact or "
                        "interpolated; None for hardware without tables"),
        CostBackendSpec(
            name=roofline.NAME, factory=roofline.RooflineBackend.for_hardware,
            priority=roofline.PRIORITY,
            description="max(FLOPs / achievable compute, bytes / achievable HBM) + "
                        "overhead; collectives on the N-tier topology"),
    ]


@hookimpl
def zrt_op_formulas():
    """FLOP/byte formulas of aten ops and of the capture harness's ``zrt::`` ops."""
    from zrt_core.formulas.aten import core_formulas

    return core_formulas()


@hookimpl
def zrt_model_patches():
    """The capture harness's scoped patches: one attention node per layer, balanced MoE
    routing through transformers' experts interface, and Llama 4's experts routed."""
    from zrt_core.capture.patches import core_patches

    return core_patches()
