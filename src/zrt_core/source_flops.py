"""Model-FLOP counters sources used for their published TFLOP/s and MFU, so a prediction can
be compared in the source's own definition (docs/training-model.md, "Known gaps")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def nemo2_llama_flops(config: Mapping[str, Any], seq_len: int, global_batch: int) -> float:
    """NeMo 2's ``llama2``/``llama3`` model FLOPs of one step (``nemo/utils/flops_formulas.py``,
    the ``FLOPsMeasurementCallback`` behind NeMo 25.x's TFLOP/s): fwd + bwd of every GEMM
    and the full s² attention square, the causal mask not credited —
    ``gbs·s·L·h²·(12 + 12·g/a + 18·f/h + 12·s/h + 6·V/(L·h))``."""
    h = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    groups = int(config.get("num_key_value_heads") or heads)
    ffn = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    return float(global_batch) * seq_len * layers * h * h * (
        12 + 12 * groups / heads + 18 * ffn / h + 12 * seq_len / h + 6 * vocab / (layers * h))


def published_model_flops(record: Mapping[str, Any]) -> tuple[float, str] | None:
    """(FLOPs per step, counter name) the record's source divided by its step time, where it
    is known to differ from zrt's (causal attention counted as the lower triangle); None
    otherwise. NVIDIA's NeMo long-sequence page, NeMo 25.x rows: NeMo 2's counter (its
    1 588-1 717 "TFLOP/s" stay flat from 8k to 1M tokens only because the s² term doubles
    the causal work). Its NeMo 24.03 rows fall with length as a causal count does and
    match zrt's definition."""
    source = str(record.get("source", ""))
    model = record.get("model")
    config = model.get("hf_config") if isinstance(model, Mapping) else None
    if not isinstance(config, Mapping) or "NeMo long-sequence" not in source \
            or "NeMo 25." not in source:
        return None
    try:
        return (nemo2_llama_flops(config, int(record["seq_len"]), int(record["global_batch"])),
                "NeMo 2 flops_formulas (full-square attention)")
    except (KeyError, TypeError, ValueError):
        return None
