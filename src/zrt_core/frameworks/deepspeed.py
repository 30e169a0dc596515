"""DeepSpeed ``ds_config.json`` (ZeRO stage, batch sizes, bf16/fp16, optimizer offload) read
into ``zrt run --train``'s layout, and written back. The model comes separately (zrt's
MODEL); the config holds only data parallelism.

Keys: DeepSpeed's configuration JSON (deepspeed.ai/docs/config-json): ``train_batch_size`` =
``train_micro_batch_size_per_gpu`` × ``gradient_accumulation_steps`` × data-parallel ranks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import Header, Imported, RunRequest, as_bool, as_int, choice

READ_TOP = {"train_batch_size", "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps", "zero_optimization", "bf16", "fp16", "optimizer"}
READ_ZERO = {"stage", "offload_optimizer"}
#: optimizer.type → zrt's; DeepSpeed's Adam is AdamW unless ``adam_w_mode`` is false
OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "sgd": "sgd"}


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{where}: not a JSON file ({exc.msg} at line {exc.lineno})",
                        "give DeepSpeed's ds_config.json") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: a ds_config is a JSON object, got {type(doc).__name__}",
                        "give DeepSpeed's ds_config.json")
    ignored = [f"{k} (not modelled)" for k in doc if k not in READ_TOP and k != "_comment"]
    notes: list[str] = []
    values: dict[str, Any] = {"mode": "train", "tp": 1, "pp": 1, "cp": 1, "ep": 1, "sp": False}
    zero = doc.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise SpecError(f"{where}: zero_optimization must be an object, got {zero!r}",
                        'e.g. "zero_optimization": {"stage": 2}')
    ignored += [f"zero_optimization.{k} (not modelled)" for k in zero if k not in READ_ZERO]
    stage = as_int(zero.get("stage", 0), "zero_optimization.stage", where, minimum=0)
    values["zero"] = choice(stage, "zero_optimization.stage", where, {"0": 0, "1": 1, "2": 2,
                                                                     "3": 3})
    values["fsdp"] = False
    offload = zero.get("offload_optimizer")
    if isinstance(offload, dict) and offload.get("device", "none") not in ("none", None):
        choice(offload["device"], "zero_optimization.offload_optimizer.device", where,
               {"cpu": 1, "nvme": 1})
        values["offload_optimizer"] = True
        if offload["device"] == "nvme":
            notes.append("offload_optimizer.device nvme: priced at the host link, as cpu")
    def given(key: str) -> Any:
        # "auto": filled in by the HF Trainer / Accelerate from their own arguments
        value = doc.get(key)
        if value == "auto":
            notes.append(f"{key} auto: zrt's flag (--micro-batch, --global-batch) instead")
            return None
        return value

    micro = given("train_micro_batch_size_per_gpu")
    accum = given("gradient_accumulation_steps")
    total = given("train_batch_size")
    micro = None if micro is None else as_int(micro, "train_micro_batch_size_per_gpu", where)
    accum = None if accum is None else as_int(accum, "gradient_accumulation_steps", where)
    total = None if total is None else as_int(total, "train_batch_size", where)
    world = context.get("num_gpus")
    if micro is not None and accum is not None and total is not None:
        if total % (micro * accum):
            raise SpecError(f"{where}: train_batch_size {total} is not micro {micro} × "
                            f"accumulation {accum} × ranks", "fix one of the three")
        dp = total // (micro * accum)
        if world is not None and world != dp:
            raise SpecError(f"{where}: the batch sizes give {dp} data-parallel ranks, but "
                            f"--num-gpus is {world}", "fix the batch sizes or --num-gpus")
        values["dp"] = dp
    elif world is not None:
        values["dp"] = world
    else:
        raise SpecError(f"{where}: the data-parallel size is not known (give all three of "
                        "train_batch_size, train_micro_batch_size_per_gpu and "
                        "gradient_accumulation_steps)", "or pass --num-gpus")
    dp = values["dp"]
    # DeepSpeed's rule: the missing one of the three follows from the other two; what
    # stays unknown is zrt's flag (--micro-batch, --global-batch)
    if micro is None and total is not None and accum is not None:
        micro = total // (accum * dp)
    if total is None and micro is not None and accum is not None:
        total = micro * accum * dp
    if micro is not None:
        values["micro_batch"] = micro
    if total is not None:
        values["global_batch"] = total
    enabled = {k: (doc.get(k) or {}).get("enabled", False) for k in ("bf16", "fp16")}
    if "auto" in enabled.values():
        notes.append("bf16/fp16 enabled auto: zrt's --precision instead")
    else:
        bf16, fp16 = (as_bool(enabled[k], f"{k}.enabled", where) for k in ("bf16", "fp16"))
        if bf16 and fp16:
            raise SpecError(f"{where}: bf16.enabled and fp16.enabled are both true",
                            "keep one")
        values["precision"] = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    opt = doc.get("optimizer")
    if isinstance(opt, dict) and "type" in opt:
        kind = str(opt["type"]).lower()
        values["optimizer"] = choice(kind, "optimizer.type", where, OPTIMIZERS)
        params = opt.get("params") or {}
        if kind == "adam" and params.get("adam_w_mode") is False:
            values["optimizer"] = "adam"
    notes.append("the sequence length is not in a ds_config: zrt's --seq-len")
    return Imported("deepspeed", values, tuple(ignored), tuple(notes))


def write(request: RunRequest, header: Header) -> str:
    train = request.train
    if train is None:
        raise SpecError("--emit deepspeed writes a training run; this is a serving run",
                        "use --emit trtllm or --emit vllm")
    p = request.parallel
    model = {k: getattr(p, k) for k in ("tp", "pp", "cp", "ep") if getattr(p, k) > 1}
    if model or train.fsdp or train.precision not in ("bf16", "fp16", "fp32") or \
            train.lora_rank:
        what = (", ".join(f"{k}={v}" for k, v in model.items()) or
                ("FSDP" if train.fsdp else "LoRA" if train.lora_rank else train.precision))
        raise SpecError(f"a ds_config holds data parallelism and ZeRO only, not {what}",
                        "use --emit megatron")
    if train.optimizer not in ("adamw", "adam", "sgd"):
        raise SpecError(f"DeepSpeed has no built-in {train.optimizer} optimizer",
                        "use adamw")
    doc: dict[str, Any] = {
        "_comment": " | ".join(header.lines("DeepSpeed config")),
        "train_batch_size": train.global_batch,
        "train_micro_batch_size_per_gpu": train.micro_batch,
        "gradient_accumulation_steps": train.num_microbatches(p),
        "zero_optimization": {"stage": train.zero},
        "bf16": {"enabled": train.precision == "bf16"},
        "fp16": {"enabled": train.precision == "fp16"},
        "optimizer": {"type": "SGD" if train.optimizer == "sgd" else "Adam",
                      "params": {"adam_w_mode": train.optimizer == "adamw"}
                      if train.optimizer != "sgd" else {}},
    }
    if train.offload_optimizer:
        doc["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    return json.dumps(doc, indent=2) + "\n"
