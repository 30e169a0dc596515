"""The named parallelism families side by side for one model and GPU count (DDP, FSDP/ZeRO-3,
TP, TP with SP, PP, EP, 3D): one canonical layout each, estimated like any search layout."""

from __future__ import annotations

from typing import Any

from zrt_core.errors import ZrtError
from zrt_core.modelinfo import ModelDims
from zrt_core.search.space import POWERS_OF_TWO, TrainCandidate, _tp_fits
from zrt_core.strategy import Parallel

FAMILIES = ("DDP", "FSDP", "TP", "SP", "PP", "EP", "3D")


def _largest(limit: int, ok: Any) -> int:
    """The largest power of two ≤ ``limit`` for which ``ok`` holds (1 if none)."""
    return max((v for v in POWERS_OF_TWO if v <= limit and ok(v)), default=1)


def family_layouts(dims: ModelDims, gpus: int, global_batch: int, nvlink: int | None
                   ) -> dict[str, tuple[Parallel, str] | str]:
    """Each family's layout and sharding, or why the family does not apply.

    DDP: every GPU a replica, nothing sharded (ZeRO-0). FSDP: the same replicas, parameters,
    gradients and optimizer states sharded (ZeRO-3). TP: the largest tensor-parallel degree
    within the NVLink domain that divides the heads and the GPUs, data parallel over the
    rest, no sequence parallelism; SP: the same with Megatron's sequence parallelism. PP:
    the largest pipeline dividing the layers and the GPUs with a micro-batch per stage at
    least. EP: the largest expert-parallel degree dividing the experts (MoE only). 3D: the
    largest tp up to TP's leaving ≥ 4 GPUs per rank group × a pipeline of 2 × data
    parallel, with SP. All but FSDP and DDP use ZeRO-1 (Megatron's distributed
    optimizer)."""
    def heads_ok(t: int) -> bool:
        return _tp_fits(dims, t) and gpus % t == 0

    tp = _largest(min(gpus, nvlink or 8, 8), heads_ok)
    pp = _largest(gpus, lambda p: dims.layers % p == 0 and gpus % p == 0
                  and global_batch // (gpus // p) >= p)
    out: dict[str, tuple[Parallel, str] | str] = {
        "DDP": (Parallel(dp=gpus), "zero0"),
        "FSDP": (Parallel(dp=gpus), "fsdp") if gpus > 1 else "one GPU: nothing to shard",
    }
    out["TP"] = (Parallel(tp=tp, dp=gpus // tp, sp=False), "zero1") if tp > 1 else \
        "no tensor-parallel degree > 1 divides the heads and the GPUs"
    out["SP"] = (Parallel(tp=tp, dp=gpus // tp, sp=True), "zero1") if tp > 1 else \
        "sequence parallelism needs tp > 1"
    out["PP"] = (Parallel(pp=pp, dp=gpus // pp), "zero1") if pp > 1 else \
        "no pipeline > 1 divides the layers and the GPUs"
    if dims.is_moe:
        ep = _largest(gpus, lambda e: dims.experts % e == 0 and gpus % e == 0)
        out["EP"] = (Parallel(ep=ep, dp=gpus), "zero1") if ep > 1 else \
            "no expert-parallel degree > 1 divides the experts and the GPUs"
    else:
        out["EP"] = "a dense model has no experts"
    # 3D: the largest tp up to TP's that leaves room for a pipeline of 2 and dp ≥ 2
    tp3 = _largest(tp, lambda t: heads_ok(t) and gpus // t >= 4)
    if tp3 > 1 and dims.layers % 2 == 0 and gpus % (tp3 * 2) == 0:
        out["3D"] = (Parallel(tp=tp3, pp=2, dp=gpus // (tp3 * 2), sp=True), "zero1")
    else:
        out["3D"] = "needs tp > 1, a pipeline of 2 and dp > 1 within the GPUs"
    return out


def compare_strategies(model: Any, hardware: Any, gpus: int, global_batch: int, seq_len: int,
                       *, micro_batch: int = 1, recompute: str = "none",
                       precision: str = "bf16", host: Any = None,
                       use_cache: bool | None = None) -> list[dict[str, Any]]:
    """One row per family (:data:`FAMILIES`): its layout and the estimate's step time,
    tokens/s per GPU and memory per device, or ``error`` saying why it does not apply."""
    from zrt_core.capture.sources import raw_config
    from zrt_core.checks import check_config
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.search.evaluate import TrainEvaluator

    host = host or get_plugin_manager()
    hw = host.hardware_spec(hardware) if isinstance(hardware, str) else hardware
    config, where = raw_config(model, host)
    dims = check_config(config, where=where)
    nvlink = hw.interconnect[0].devices if hw.interconnect else None
    ev = TrainEvaluator(model, hw, global_batch, seq_len, host=host, use_cache=use_cache)
    rows = []
    for name, layout in family_layouts(dims, gpus, global_batch, nvlink).items():
        if isinstance(layout, str):
            rows.append({"strategy": name, "error": layout})
            continue
        par, sharding = layout
        cand = TrainCandidate(gpus, par, micro_batch, recompute, sharding,
                              "1f1b", precision)
        try:
            row = ev.row(cand)
        except ZrtError as exc:  # a capture-level refusal: the family's reason
            row = {**cand.to_json(), "rejected": str(exc)}
        row = {"strategy": name, "sp": par.sp if par.sp is not None else par.tp > 1, **row}
        if "rejected" in row:
            row["error"] = row.pop("rejected")
        rows.append(row)
    return rows
