"""torchtitan TOML job configs (``[parallelism]``, ``[training]``, ``[activation_checkpoint]``)
read into ``zrt run --train``'s layout, and written back.

Keys and defaults: pytorch/torchtitan ``torchtitan/config/job_config.py`` as of @238fa99 (the
last commit before the TOML configs became Python dataclasses) and the preset
``torchtitan/models/llama3/train_configs/llama3_70b.toml`` (@038d5fd).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomllib

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import Header, Imported, RunRequest, as_bool, as_int, choice

#: ``pipeline_parallel_schedule`` → zrt's schedule
SCHEDULES = {"GPipe": "gpipe", "1F1B": "1f1b", "Interleaved1F1B": "interleaved",
             "InterleavedZeroBubble": "zb-h1", "ZBVZeroBubble": "zb-v", "DualPipeV": "dualpipev"}
#: ``[model] converters`` → zrt precision (torchao float8 / MX training). torchao's float8
#: training scales each tensor from its own amax (``Float8LinearConfig``'s tensorwise recipe,
#: dynamic scaling; torchao has had no delayed scaling since 0.9): zrt's fp8_cs.
CONVERTERS = {"float8": "fp8_cs", "quantize.linear.float8": "fp8_cs", "mx": "mxfp8",
              "quantize.linear.mx": "mxfp8"}

#: keys read: section → key → zrt flag
READ = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "tensor_parallel_degree", "pipeline_parallel_degree",
                    "context_parallel_degree", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size",
                    "fsdp_reshard_after_forward"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "model": {"converters"},
    "optimizer": {"name"},
}


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{where}: not a TOML file ({exc})",
                        "give torchtitan a job config .toml") from None
    ignored = [f"[{sec}] {k} (not modelled)" for sec, body in doc.items()
               if isinstance(body, dict) for k in body if k not in READ.get(sec, ())]
    ignored += [f"{sec} (not modelled)" for sec, body in doc.items() if not isinstance(body, dict)]
    par, tr = doc.get("parallelism", {}), doc.get("training", {})
    notes: list[str] = []

    def num(sec: Mapping[str, Any], key: str, default: int, minimum: int = 1) -> int:
        return as_int(sec.get(key, default), key, where, minimum=minimum)

    # defaults: job_config.py (replicate 1, shard -1 = the rest, every other degree 1)
    tp, pp = num(par, "tensor_parallel_degree", 1), num(par, "pipeline_parallel_degree", 1)
    cp, ep = num(par, "context_parallel_degree", 1), num(par, "expert_parallel_degree", 1)
    replicate = num(par, "data_parallel_replicate_degree", 1)
    shard = as_int(par.get("data_parallel_shard_degree", -1), "data_parallel_shard_degree",
                   where, minimum=-1)
    if shard == 0:
        raise SpecError(f"{where}: data_parallel_shard_degree must be -1 or ≥ 1, got 0",
                        "use -1 (the remaining ranks) or a degree")
    values: dict[str, Any] = {"mode": "train", "tp": tp, "pp": pp, "cp": cp, "ep": ep,
                              # torchtitan's TP plan shards norms along the sequence
                              "sp": tp > 1}
    if ep > 1 or "expert_tensor_parallel_degree" in par:
        # job_config: expert_tensor_parallel_degree defaults to 1 (experts whole on a rank)
        values["etp"] = num(par, "expert_tensor_parallel_degree", 1)
    if shard == -1:
        world = context.get("num_gpus")
        if world is None:
            raise SpecError(f"{where}: data_parallel_shard_degree = -1 takes the ranks left "
                            "over, but the world size is not known",
                            "pass --num-gpus, or give data_parallel_shard_degree")
        rest = tp * pp * cp * replicate
        if world % rest:
            raise SpecError(f"{where}: {world} GPUs are not a multiple of tp × pp × cp × "
                            f"replicate = {rest}", "fix the degrees or --num-gpus")
        shard = world // rest
    values["dp"] = replicate * shard
    # FSDP (fully_shard) over the shard degree; DDP when only replicated; HSDP (shard
    # within groups of data_parallel_shard_degree, replicate across) when both
    values["fsdp"], values["zero"] = (shard > 1, 3 if shard > 1 else 0)
    if shard > 1 and replicate > 1:
        values["hsdp"] = shard
    # torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy: "default" is
    # not pp_enabled, zrt's own default for --fsdp
    policy = par.get("fsdp_reshard_after_forward", "default")
    reshard = choice(policy, "fsdp_reshard_after_forward", where,
                     {"default": "default", "always": "always", "never": "never"})
    if shard > 1 and reshard != "default":
        values["reshard_after_forward"] = reshard == "always"
    schedule = par.get("pipeline_parallel_schedule", "1F1B")
    values["pp_schedule"] = choice(schedule, "pipeline_parallel_schedule", where, SCHEDULES)
    if "pipeline_parallel_layers_per_stage" in par:
        per = num(par, "pipeline_parallel_layers_per_stage", 1)
        layers = context.get("layers")
        if not layers:
            raise SpecError(f"{where}: pipeline_parallel_layers_per_stage needs the layer "
                            "count", "give the model")
        if layers % (per * pp):
            raise SpecError(f"{where}: pipeline_parallel_layers_per_stage {per} × pp {pp} "
                            f"does not divide the {layers} layers", "fix one of them")
        values["vp"] = layers // (per * pp)
    elif values["pp_schedule"] in ("interleaved", "zb-h1", "zb-v", "dualpipev"):
        values["vp"] = 2
        notes.append(f"{schedule} without pipeline_parallel_layers_per_stage: two stages "
                     "per rank assumed (torchtitan infers them from the model)")
    local = num(tr, "local_batch_size", 8)  # job_config default 8
    # a rank's local batch runs whole, or with pp > 1 in pipeline micro-batches of
    # pipeline_parallel_microbatch_size (default 1)
    values["micro_batch"] = local if pp == 1 else \
        num(par, "pipeline_parallel_microbatch_size", 1)
    gb = as_int(tr.get("global_batch_size", -1), "global_batch_size", where, minimum=-1)
    values["global_batch"] = local * values["dp"] if gb == -1 else gb
    values["seq_len"] = num(tr, "seq_len", 2048)  # job_config default 2048
    values["precision"] = choice(tr.get("mixed_precision_param", "bfloat16"),
                                 "mixed_precision_param", where,
                                 {"bfloat16": "bf16", "float32": "fp32"})
    converters = doc.get("model", {}).get("converters", [])
    if not isinstance(converters, list):
        raise SpecError(f"{where}: [model] converters must be a list, got {converters!r}",
                        'e.g. converters = ["float8"]')
    for conv in converters:
        values["precision"] = choice(conv, "converters", where, CONVERTERS)
    mode = doc.get("activation_checkpoint", {}).get("mode", "selective")
    values["recompute"] = choice(mode, "activation_checkpoint.mode", where,
                                 {"none": "none", "selective": "selective", "full": "full"})
    if mode == "selective":
        option = doc.get("activation_checkpoint", {}).get("selective_ac_option", "2")
        if option == "op":
            values["recompute"] = "op"
        else:
            notes.append(f"activation_checkpoint.mode selective (selective_ac_option "
                         f"{option}): priced as zrt's selective recompute (core attention)")
    name = doc.get("optimizer", {}).get("name", "AdamW")
    values["optimizer"] = choice(name, "optimizer.name", where, {"AdamW": "adamw", "Adam": "adam"})
    if "enable_async_tensor_parallel" in doc.get("compile", {}):
        as_bool(doc["compile"]["enable_async_tensor_parallel"], "enable_async_tensor_parallel",
                where)
    return Imported("torchtitan", values, tuple(ignored), tuple(notes))


def write(request: RunRequest, header: Header) -> str:
    train = request.train
    if train is None:
        raise SpecError("--emit torchtitan writes a training run; this is a serving run",
                        "use --emit trtllm or --emit vllm")
    p = request.parallel
    if train.zero in (1, 2) or (train.zero == 3 and not train.fsdp) or (train.fsdp and p.dp == 1):
        raise SpecError(f"torchtitan shards with FSDP or replicates with DDP; ZeRO-{train.zero}"
                        f"{' with FSDP' if train.fsdp else ''} has no torchtitan key",
                        "use --zero 3 --fsdp, or --zero 0")
    if p.tp > 1 and not p.sequence_parallel(training=True):
        raise SpecError("torchtitan's tensor parallelism always shards along the sequence",
                        "use --sp with --tp > 1")
    if p.cp > 1 and p.cp_kind != "ring":
        raise SpecError("torchtitan's context parallelism is ring attention",
                        "use --cp-kind ring")
    sched = {v: k for k, v in SCHEDULES.items()}.get(train.pp_schedule)
    if sched is None:
        raise SpecError(f"torchtitan has no {train.pp_schedule} schedule",
                        f"use one of {', '.join(SCHEDULES.values())}")
    precision = {"bf16": ("bfloat16", None), "fp32": ("float32", None),
                 "fp8_cs": ("bfloat16", "float8"), "mxfp8": ("bfloat16", "mx")}.get(train.precision)
    if precision is None or train.lora_rank or train.offload_optimizer:
        what = (f"{train.precision} training" if precision is None else
                "LoRA" if train.lora_rank else "optimizer offload")
        raise SpecError(f"torchtitan's job config has no {what}", "use --emit megatron")
    optimizer = {"adamw": "AdamW", "adam": "Adam"}.get(train.optimizer)
    if optimizer is None:
        raise SpecError(f"torchtitan's job config has no {train.optimizer} optimizer",
                        "use adamw")
    split = request.stage_split
    if split is not None and split != type(split)():
        raise SpecError("torchtitan has no uneven pipeline split argument zrt reads",
                        "drop the decoder-first/last or layout arguments")
    if isinstance(train.reshard_after_forward, int) and \
            not isinstance(train.reshard_after_forward, bool):
        raise SpecError("torchtitan's fsdp_reshard_after_forward is always, never or "
                        "default; it has no re-shard group size",
                        "use --reshard-after-forward true or false")
    local = train.micro_batch if p.pp == 1 else train.global_batch // p.dp
    shard = (train.hsdp or p.dp) if train.fsdp else 1
    lines = [f"# {line}" for line in header.lines("torchtitan job config")]
    if precision[1]:
        lines += ["", "[model]", f'converters = ["{precision[1]}"]']
    lines += ["", "[optimizer]", f'name = "{optimizer}"', "", "[training]",
              f"local_batch_size = {local}",
              f"global_batch_size = {train.global_batch}", f"seq_len = {train.seq_len}",
              f'mixed_precision_param = "{precision[0]}"', "", "[parallelism]",
              f"data_parallel_replicate_degree = {p.dp // shard}",
              f"data_parallel_shard_degree = {shard}",
              f"tensor_parallel_degree = {p.tp}", f"pipeline_parallel_degree = {p.pp}",
              f"context_parallel_degree = {p.cp}", f"expert_parallel_degree = {p.ep}"]
    if train.reshard_after_forward is not None:
        lines.append("fsdp_reshard_after_forward = "
                     f'"{"always" if train.reshard_after_forward else "never"}"')
    if p.pp > 1:
        lines.append(f"pipeline_parallel_microbatch_size = {train.micro_batch}")
    if p.ep > 1 or p.etp is not None:
        lines.append(f"expert_tensor_parallel_degree = {p.expert_tp}")
    lines.append(f'pipeline_parallel_schedule = "{sched}"')
    if p.vp > 1:
        if not header.layers:
            raise SpecError("torchtitan gives interleaving as layers per stage, and the "
                            "model's layer count is not known", "pass the model")
        lines.append(f"pipeline_parallel_layers_per_stage = {header.layers // (p.pp * p.vp)}")
    if train.recompute == "op":
        lines += ["", "[activation_checkpoint]", 'mode = "selective"',
                  'selective_ac_option = "op"', ""]
    else:
        lines += ["", "[activation_checkpoint]", f'mode = "{train.recompute}"', ""]
    return "\n".join(lines)
