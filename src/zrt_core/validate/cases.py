"""Defaults: from a record to the estimators' inputs (training, per-layer and serving cases)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.errors import SpecError
from zrt_core.validate.records import Record, _need_int
from zrt_core.validate.schema import SERVING_PRECISION, _ro

if TYPE_CHECKING:
    from zrt_core.strategy import InferSpec, Parallel


# -- defaults: from a record to the estimators' inputs ----------------------------------------


@frozen
class InferenceCase:
    """The inputs of one serving estimate read from a record, with the defaults taken."""

    config: Mapping[str, Any] = field(converter=_ro)
    hardware: str
    parallel: Parallel
    infer: InferSpec
    engine: str
    num_gpus: int
    assumptions: tuple[str, ...] = ()


def training_case(record: Record) -> Any:
    """A :class:`~zrt_core.estimate.training.TrainingCase` with Megatron-LM / NeMo defaults
    for null fields (:func:`~zrt_core.estimate.training.case_from_record`): dp = GPUs /
    (tp × cp × pp); SP on when tp > 1; the distributed optimizer (ZeRO-1); no FSDP; no
    recompute; micro-batch 1; bf16; expert TP = TP; 1F1B, interleaved when vp > 1; AdamW;
    Megatron-Core's overlap flags, or none for Megatron-LM as published in 2021-22."""
    from zrt_core.estimate.training import case_from_record

    _need_int(record, "num_gpus")
    _need_int(record, "global_batch")
    _need_int(record, "seq_len")
    return case_from_record(dict(record.raw))


def layer_case(record: Record) -> Any:
    """A one-micro-batch training case for a per-layer record (``layer_micro.yaml``): the
    global batch is one micro-batch per data-parallel replica and ZeRO is off (a layer's
    forward and backward do not depend on either); the rest as :func:`training_case`."""
    from attrs import evolve

    from zrt_core.estimate.training import case_from_record

    mb = record.raw.get("micro_batch") or 1
    par = dict(record.raw.get("parallel") or {})
    num_gpus = _need_int(record, "num_gpus")
    _need_int(record, "seq_len")
    tp, pp, cp = (int(par.get(k) or 1) for k in ("tp", "pp", "cp"))
    dp = int(par.get("dp") or max(1, num_gpus // (tp * pp * cp)))
    raw = {**record.raw, "workload": "train", "global_batch": int(mb) * dp,
           "parallel": {**par, "zero": par.get("zero") if par.get("zero") is not None else 0}}
    case = case_from_record(raw)
    return evolve(case, assumptions=(*case.assumptions,
                                     f"global_batch={int(mb) * dp} (one micro-batch per "
                                     "replica: the record times one layer)"))


def _trtllm_moe_ep(config: Mapping[str, Any], tp: int) -> int:
    """The expert parallelism a TensorRT-LLM MoE record that leaves ``ep`` null ran with:
    the TP group (``tp``) where the experts divide over it, else 1. TensorRT-LLM's
    perf-overview runs MoE models as ``trtllm-bench --tp $tp_size --ep $ep_size`` without
    printing the size (TensorRT-LLM@00f3768, docs/source/performance/perf-overview.md); its
    ``Mapping`` then takes ``moe_tp_size = tp_size // moe_ep_size``. Read as ``ep = tp``,
    zrt predicts the page's Qwen3-235B columns closer on every machine, the two it was not
    tuned on included (docs/inference-model.md, "Expert parallelism of the published MoE
    runs")."""
    from zrt_core.modelinfo import ModelDims

    dims = ModelDims.from_config(config)
    return tp if dims.is_moe and dims.experts % tp == 0 else 1


def inference_case(record: Record) -> InferenceCase:
    """Serving inputs from an ``infer`` record, with these defaults for null fields:

    * every parallel degree 1 (``dp`` = GPUs / (tp × pp × cp) when null), sequence
      parallelism off, expert TP = tp × dp / ep (the engines' layout:
      :func:`zrt_core.strategy.serving_expert_tp`); a TensorRT-LLM MoE record with ``ep``
      and ``etp`` null and one TP group takes ``ep = tp`` (:func:`_trtllm_moe_ep`);
    * precision → :data:`SERVING_PRECISION` (bf16 when null);
    * ``concurrency`` (or ``max_batch``) caps the sequences in flight on the engine's
      in-flight batching (closed-loop clients: ``InferSpec.concurrency``), not a static
      batch; null means offline max-throughput, the mode ``trtllm-bench`` and vLLM's
      throughput benchmark run;
    * the engine is vLLM or SGLang when the source names it (one of them), TensorRT-LLM
      (``trtllm-bench``) otherwise.
    """
    from zrt_core.strategy import InferSpec, Parallel

    raw = record.raw
    num_gpus = _need_int(record, "num_gpus")
    input_len = _need_int(record, "input_len")
    output_len = _need_int(record, "output_len")
    par = dict(raw.get("parallel") or {})
    assumptions: list[str] = []

    def degree(key: str) -> int:
        v = par.get(key)
        if v is None:
            return 1
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise SpecError(f"record {record.id}: parallel.{key} must be a positive "
                            f"integer, got {v!r}")
        return v

    tp, pp, cp, ep, vp = (degree(k) for k in ("tp", "pp", "cp", "ep", "vp"))
    if par.get("dp") is None:
        dp = max(1, num_gpus // (tp * pp * cp))
        if dp > 1:
            assumptions.append(f"dp={dp} (GPUs / (tp × pp × cp))")
    else:
        dp = degree("dp")
    etp = par.get("etp")
    source = str(raw.get("source") or "")
    named = [e for e in ("vllm", "sglang") if e in source.lower()]
    engine = named[0] if len(named) == 1 else "trtllm"
    if engine != "trtllm":
        assumptions.append(f"engine {engine} with its defaults (the source names it)")
    config = dict(raw["model"]["hf_config"])
    if par.get("ep") is None and etp is None and engine == "trtllm" and tp > 1 and dp == 1:
        ep = _trtllm_moe_ep(config, tp)
        if ep > 1:
            etp = tp // ep  # TensorRT-LLM's Mapping: moe_tp_size = tp_size // moe_ep_size
            assumptions.append(f"ep={ep}, etp={etp} (TensorRT-LLM's published MoE runs pass "
                               "--ep with its size unprinted: the experts spread over the "
                               "TP group)")
    parallel = Parallel(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=int(etp) if etp else None,
                        dp=dp, sp=par.get("sp"))
    precision = raw.get("precision")
    if precision is None:
        precision = "bf16"
        assumptions.append("precision=bf16")
    precision = str(precision).lower()
    if precision not in SERVING_PRECISION:
        raise SpecError(f"record {record.id}: precision {precision!r} is not a serving "
                        "precision zrt models",
                        f"use one of {', '.join(SERVING_PRECISION)}")
    quant, kv = SERVING_PRECISION[precision]
    if kv:
        assumptions.append(f"KV cache {kv} (quantised checkpoint's kv_cache_quant_algo)")
    clients = raw.get("concurrency") or raw.get("max_batch")
    if clients is None:
        assumptions.append("batch: offline max-throughput (trtllm-bench)")
    else:
        key = "concurrency" if raw.get("concurrency") else "max_batch"
        assumptions.append(f"{key} {clients}: at most {clients} requests in flight on the "
                           "engine's in-flight batching (closed-loop clients), not a "
                           "static batch")
    dtype = "float16" if precision == "fp16" else "bfloat16"
    infer = InferSpec(input_len=input_len, output_len=output_len,
                      concurrency=clients, quant=quant,
                      kv_dtype=kv, dtype=dtype)
    return InferenceCase(config=config, hardware=record.hardware, parallel=parallel,
                         infer=infer, engine=engine, num_gpus=num_gpus,
                         assumptions=tuple(assumptions))
