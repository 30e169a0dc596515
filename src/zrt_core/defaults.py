"""The core's own contributions, registered through the same hooks plugins use."""

from __future__ import annotations

from zrt_core.plugins import hookimpl


@hookimpl
def zrt_model_configs():
    from zrt_core.models import load_bundled

    return load_bundled()


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
