"""The ``zrt_nvidia`` plugin: contributes the NVIDIA hardware specs in ``hardware/``."""

from __future__ import annotations

from pathlib import Path

from zrt_core.plugin import HardwareSpec, hookimpl, load_specs

HARDWARE_DIR = Path(__file__).parent / "hardware"


@hookimpl
def zrt_hardware_specs() -> list[HardwareSpec]:
    return load_specs(HARDWARE_DIR)


TABLES_DIR = Path(__file__).parent / "tables"

#: (hardware id, table, what it holds); the file is ``tables/<hardware id>_<table>.csv``.
MEASURED_TABLES = (
    ("nvidia_h100_sxm", "gemm_bf16_openxla",
     "bf16 GEMM/batched GEMM times on an sm_90 GPU from OpenXLA's published interpolator table"),
    ("nvidia_h100_sxm", "attention_fa3",
     "FlashAttention-3 bf16 forward/backward times from PyTorch's benchmark and the FA3 paper"),
    ("nvidia_h800", "gemm_fp8_deepgemm",
     "DeepGEMM fp8 dense and grouped GEMM times for DeepSeek-V3 shapes (README, Feb 2025)"),
)


@hookimpl
def zrt_measured_tables():
    """Published kernel measurements converted to times (CSV; each row names its source)."""
    from zrt_core.plugin import MeasuredTable

    return [MeasuredTable(name=f"{hw}/{table}", hardware_id=hw,
                          path=str(TABLES_DIR / f"{hw}_{table}.csv"), description=what)
            for hw, table, what in MEASURED_TABLES]
