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
#: Published measurements of the kernels the frameworks run: priced from by default.
MEASURED_TABLES = (
    ("nvidia_h100_sxm", "gemm_bf16_openxla",
     "bf16 GEMM/batched GEMM times on an sm_90 GPU from OpenXLA's published interpolator table"),
    ("nvidia_h100_sxm", "attention_fa3",
     "FlashAttention-3 bf16 forward/backward times from PyTorch's benchmark and the FA3 paper"),
    ("nvidia_h800", "gemm_fp8_deepgemm",
     "DeepGEMM fp8 dense and grouped GEMM times for DeepSeek-V3 shapes (README, Feb 2025)"),
)
#: Eager PyTorch kernels one by one, timed by ``zrt profile`` on the GPU: right for an eager
#: step (``zrt diff``), not for engines that fuse and graph-replay (TensorRT-LLM), so priced
#: from only when a run names them (``--tables nvidia_h200/zrt_profile``; docs/profile.md).
OPT_IN_TABLES = (
    ("nvidia_h200", "zrt_profile",
     "bf16 GEMM, attention and pointwise times of eager PyTorch measured by zrt profile on an "
     "H200 (2026-11-27; Llama-3.1-8B, Qwen3-30B-A3B and GPT-2 shapes; docs/profile.md)"),
    ("nvidia_h100_sxm", "zrt_profile",
     "bf16 GEMM, attention and pointwise times of eager PyTorch measured by zrt profile on an "
     "H100 SXM (2026-11-27; Llama-3.1-8B and Qwen3-30B-A3B shapes; docs/profile.md)"),
)


@hookimpl
def zrt_measured_tables():
    """Published kernel measurements converted to times (CSV; each row names its source)."""
    from zrt_core.plugin import MeasuredTable

    return [MeasuredTable(name=f"{hw}/{table}", hardware_id=hw,
                          path=str(TABLES_DIR / f"{hw}_{table}.csv"), description=what,
                          opt_in=opt_in)
            for tables, opt_in in ((MEASURED_TABLES, False), (OPT_IN_TABLES, True))
            for hw, table, what in tables]
