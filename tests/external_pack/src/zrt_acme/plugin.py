"""The ``acme`` plugin: every YAML spec in ``hardware/`` becomes a zrt hardware id."""

from __future__ import annotations

from pathlib import Path

from zrt_core.plugin import HardwareSpec, hookimpl, load_specs


@hookimpl
def zrt_hardware_specs() -> list[HardwareSpec]:
    return load_specs(Path(__file__).parent / "hardware")
