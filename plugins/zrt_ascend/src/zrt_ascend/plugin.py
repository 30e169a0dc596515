"""The ``zrt_ascend`` plugin: contributes the Ascend hardware specs in ``hardware/``."""

from __future__ import annotations

from pathlib import Path

from zrt_core.plugin import HardwareSpec, hookimpl, load_specs

HARDWARE_DIR = Path(__file__).parent / "hardware"


@hookimpl
def zrt_hardware_specs() -> list[HardwareSpec]:
    return load_specs(HARDWARE_DIR)
