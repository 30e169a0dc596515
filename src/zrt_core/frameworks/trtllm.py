"""TensorRT-LLM ``trtllm-serve`` / ``trtllm-bench`` ``--extra_llm_api_options`` YAML read into
``zrt run --infer``'s layout and workload, and written back.

Keys and defaults: the LLM API's ``LlmArgs`` (NVIDIA/TensorRT-LLM
``tensorrt_llm/llmapi/llm_args.py``: ``tensor_parallel_size`` 1, ``pipeline_parallel_size`` 1,
``context_parallel_size`` 1, ``moe_expert_parallel_size`` / ``moe_tensor_parallel_size`` None,
``enable_attention_dp`` False, ``kv_cache_config``, ``quant_config``, ``dtype`` "auto").
``enable_attention_dp: true`` reads as attention data-parallel over the tensor-parallel
ranks (zrt's tp 1, dp = tensor_parallel_size) with the experts split over all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import Header, Imported, RunRequest, as_bool, as_int, choice

READ = {"tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
        "moe_expert_parallel_size", "moe_tensor_parallel_size", "max_batch_size",
        "kv_cache_config", "quant_config", "dtype", "enable_attention_dp"}
#: ``quant_config.quant_algo`` (ModelOpt's QuantAlgo names) → zrt's --quant
QUANT_ALGOS = {"FP8": "fp8", "FP8_BLOCK_SCALES": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8",
               "NVFP4": "fp4", "W8A16": "int8", "W4A16": "int4", "W4A16_AWQ": "int4",
               "W4A16_GPTQ": "int4"}
KV_DTYPES = {"auto": None, "fp8": "fp8", "FP8": "fp8"}
DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "float16": "float16"}


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{where}: not a YAML file ({str(exc).splitlines()[0]})",
                        "give the extra_llm_api_options YAML") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: extra_llm_api_options is a YAML mapping, got "
                        f"{type(doc).__name__}", "give the extra_llm_api_options YAML")
    ignored = [f"{k} (not modelled)" for k in doc if k not in READ]
    notes: list[str] = []

    def num(key: str, default: int | None) -> int | None:
        v = doc.get(key, default)
        return None if v is None else as_int(v, key, where)

    tp, pp, cp = num("tensor_parallel_size", 1), num("pipeline_parallel_size", 1), \
        num("context_parallel_size", 1)
    ep, etp = num("moe_expert_parallel_size", None), num("moe_tensor_parallel_size", None)
    # TensorRT-LLM's Mapping (tensorrt_llm/mapping.py): with neither given moe_tp = tp and
    # moe_ep = 1; with one given the other is tp / it (tp × cp under ring CP, not modelled)
    if ep is None and etp is not None:
        ep = _whole(tp, etp, "moe_tensor_parallel_size", where)
    if ep is not None and etp is None:
        etp = _whole(tp, ep, "moe_expert_parallel_size", where)
    values: dict[str, Any] = {"mode": "infer", "engine": "trtllm", "tp": tp, "pp": pp,
                              "cp": cp, "ep": ep or 1, "dp": 1}
    if etp is not None:
        values["etp"] = etp
    if ep is not None and ep * (etp or 1) != tp:
        raise SpecError(f"{where}: moe_expert_parallel_size {ep} × moe_tensor_parallel_size "
                        f"{etp} ≠ tensor_parallel_size {tp}", "make their product tp")
    if "enable_attention_dp" in doc and as_bool(doc["enable_attention_dp"],
                                                "enable_attention_dp", where):
        # attention data-parallel over the tp ranks, each with whole heads and its own
        # scheduler; the experts stay split ep × moe_tp over them (llm_args.py,
        # modules/fused_moe: tokens all-gathered to the expert group)
        values.update(tp=1, dp=tp, etp=etp if etp is not None else tp)
        notes.append(f"enable_attention_dp: attention data-parallel over the {tp} ranks "
                     f"(tp 1, dp {tp}), experts ep {ep or 1} × expert tp "
                     f"{values['etp']}; max_batch_size and max_num_tokens hold per rank")
    if "max_batch_size" in doc:
        values["batch"] = num("max_batch_size", None)
    kv = doc.get("kv_cache_config") or {}
    if not isinstance(kv, dict):
        raise SpecError(f"{where}: kv_cache_config must be a mapping, got {kv!r}",
                        "e.g. kv_cache_config: {dtype: fp8}")
    ignored += [f"kv_cache_config.{k} (not modelled)" for k in kv if k != "dtype"]
    if "dtype" in kv:
        kv_dtype = choice(kv["dtype"], "kv_cache_config.dtype", where, KV_DTYPES)
        if kv_dtype is not None:
            values["kv_dtype"] = kv_dtype
    quant = doc.get("quant_config") or {}
    if not isinstance(quant, dict):
        raise SpecError(f"{where}: quant_config must be a mapping, got {quant!r}",
                        "e.g. quant_config: {quant_algo: FP8}")
    ignored += [f"quant_config.{k} (not modelled)" for k in quant
                if k not in ("quant_algo", "kv_cache_quant_algo")]
    values["quant"] = "none"
    if quant.get("quant_algo") is not None:
        values["quant"] = choice(quant["quant_algo"], "quant_config.quant_algo", where,
                                 QUANT_ALGOS)
    if quant.get("kv_cache_quant_algo") is not None:
        kvq = choice(quant["kv_cache_quant_algo"], "quant_config.kv_cache_quant_algo", where,
                     {"FP8": "fp8"})
        if values.get("kv_dtype", kvq) != kvq:
            raise SpecError(f"{where}: kv_cache_config.dtype and quant_config."
                            "kv_cache_quant_algo disagree", "keep one")
        values["kv_dtype"] = kvq
    if "dtype" in doc:
        values["dtype"] = choice(doc["dtype"], "dtype", where, DTYPES)
    notes.append("input and output lengths come from trtllm-bench's dataset: zrt's "
                 "--input-len/--output-len")
    return Imported("trtllm", values, tuple(ignored), tuple(notes))


def _whole(tp: int, part: int, name: str, where: str) -> int:
    if tp % part:
        raise SpecError(f"{where}: {name} {part} does not divide tensor_parallel_size {tp}",
                        "choose a divisor of tp")
    return tp // part


def write(request: RunRequest, header: Header) -> str:
    infer = request.infer
    if infer is None:
        raise SpecError("--emit trtllm writes a serving run; this is a training run",
                        "use --emit megatron, bridge, torchtitan or deepspeed")
    p = request.parallel
    # attention DP: one server of dp ranks whose experts span them (tp 1, ep × etp = dp)
    adp = p.tp == 1 and p.cp == 1 and p.dp > 1 and header.experts != 0 \
        and p.ep * p.expert_tp == p.dp
    if (p.dp > 1 and not adp) or p.vp > 1:
        raise SpecError(f"one TensorRT-LLM server holds tp × pp × cp ranks; dp={p.dp} "
                        f"vp={p.vp} are not its options",
                        "emit one replica (dp 1) and launch dp of them")
    lines = [f"# {line}" for line in header.lines("TensorRT-LLM extra_llm_api_options")]
    lines.append(f"# workload: input_len {infer.input_len}, output_len {infer.output_len} "
                 "(trtllm-bench's dataset)")
    group = p.dp if adp else p.tp
    lines += [f"tensor_parallel_size: {group}", f"pipeline_parallel_size: {p.pp}"]
    if adp:
        lines.append("enable_attention_dp: true")
    if p.cp > 1:
        lines.append(f"context_parallel_size: {p.cp}")
    if header.experts != 0 and (p.ep > 1 or p.etp is not None):
        if p.ep * p.expert_tp != group:
            raise SpecError(f"TensorRT-LLM splits the experts over the tp ranks: ep × expert "
                            f"tp = {p.ep} × {p.expert_tp} must be tp = {group}",
                            "choose ep × etp = tp")
        lines += [f"moe_expert_parallel_size: {p.ep}",
                  f"moe_tensor_parallel_size: {p.expert_tp}"]
    if infer.batch is not None:
        lines.append(f"max_batch_size: {infer.batch}")
    dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(infer.dtype)
    if dtype is None:
        raise SpecError(f"TensorRT-LLM's dtype has no {infer.dtype}", "use bfloat16 or float16")
    lines.append(f"dtype: {dtype}")
    kv = {None: "auto", "fp8": "fp8"}.get(infer.kv_dtype)
    if kv is None:
        raise SpecError(f"TensorRT-LLM's kv_cache_config.dtype has no {infer.kv_dtype}",
                        "use fp8, or leave the KV cache in the model's dtype")
    lines += ["kv_cache_config:", f"  dtype: {kv}"]
    if infer.quant != "none":
        algo = {"fp8": "FP8", "fp4": "NVFP4", "int8": "W8A16", "int4": "W4A16_AWQ"}[infer.quant]
        lines += ["quant_config:", f"  quant_algo: {algo}"]
        if infer.kv_dtype == "fp8":
            lines.append("  kv_cache_quant_algo: FP8")
    return "\n".join(lines) + "\n"
