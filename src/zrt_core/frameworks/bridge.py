"""Megatron-Bridge performance-recipe launches (``scripts/performance/setup_experiment.py``
/ ``run_script.py`` flags and Hydra ``key=value`` overrides) read into ``zrt run --train``'s
layout, and written back.

Flag names and defaults: NVIDIA-NeMo/Megatron-Bridge@067f987d
``scripts/performance/argument_parser.py`` (the commit the public validation records'
performance tables come from); overrides are the ConfigContainer's ``model.*``, ``ddp.*``,
``optimizer.*`` and ``peft.*`` fields that ``run_script.py`` applies (``set_cli_overrides``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import (
    Header,
    Imported,
    RunRequest,
    as_bool,
    as_int,
    choice,
    parse_flags,
    split_argv,
)

ALIASES = {"-m": "--model_family_name", "-mr": "--model_recipe_name", "-g": "--gpu",
           "-c": "--compute_dtype", "-ng": "--num_gpus", "-gn": "--gpus_per_node",
           "-tp": "--tensor_model_parallel_size", "-pp": "--pipeline_model_parallel_size",
           "-cp": "--context_parallel_size", "-vp": "--virtual_pipeline_model_parallel_size",
           "-ep": "--expert_model_parallel_size", "-et": "--expert_tensor_parallel_size",
           "-mb": "--micro_batch_size", "-gb": "--global_batch_size", "-sl": "--seq_length",
           "-rl": "--recompute_num_layers"}
FLAGS = {"--model_family_name": 1, "--model_recipe_name": 1, "--gpu": 1, "--compute_dtype": 1,
         "--num_gpus": 1, "--gpus_per_node": 1, "--tensor_model_parallel_size": 1,
         "--pipeline_model_parallel_size": 1, "--context_parallel_size": 1,
         "--virtual_pipeline_model_parallel_size": 1, "--expert_model_parallel_size": 1,
         "--expert_tensor_parallel_size": 2, "--micro_batch_size": 1,
         "--global_batch_size": 1, "--seq_length": 1, "--recompute_num_layers": 1,
         "--recompute_modules": 1, "--use_megatron_fsdp": 1, "--task": 1,
         "--optimizer_type": 1, "--pipeline_model_parallel_layout": 1,
         "--moe_flex_dispatcher_backend": 1}

#: ``-c/--compute_dtype`` (choices bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4) → zrt precision:
#: fp8 current scaling (cs) is zrt's fp8_cs; sub-channel/blockwise scaling (sc) is priced as
#: zrt's fp8 (no amax pass: the block scales come from the block being cast)
COMPUTE_DTYPES = {"bf16": "bf16", "fp8_cs": "fp8_cs", "fp8_sc": "fp8", "fp8_mx": "mxfp8",
                  "nvfp4": "nvfp4"}
#: ``-g/--gpu`` (NUM_GPUS_PER_NODE_MAP's keys) ↔ zrt hardware ids
GPUS = {"h100": "nvidia_h100_sxm", "b200": "nvidia_b200", "b300": "nvidia_b300",
        "gb200": "nvidia_gb200_nvl72", "gb300": "nvidia_gb300_nvl72"}

#: Hydra overrides zrt reads: key → (zrt flag, kind)
OVERRIDES = {
    "model.sequence_parallel": ("sp", "bool"),
    "ddp.use_distributed_optimizer": ("zero", "bool"),
    "model.cp_comm_type": ("cp_kind", "cp"),
    "peft.dim": ("lora_rank", "int"),
    "model.num_layers_in_first_pipeline_stage": ("decoder_first_pipeline_num_layers", "int"),
    "model.num_layers_in_last_pipeline_stage": ("decoder_last_pipeline_num_layers", "int"),
    "model.account_for_embedding_in_pipeline_split": ("embedding_loss_stages", "bool"),
    "model.account_for_loss_in_pipeline_split": ("embedding_loss_stages", "bool"),
    "optimizer.optimizer_cpu_offload": ("offload_optimizer", "bool"),
    "ddp.grad_reduce_in_fp32": ("grad_reduce_in_fp32", "bool"),
    "mixed_precision.fp8_param_gather": ("quantized_params", "bool"),
    "model.freeze_language_model": ("freeze_language_model", "bool"),
}


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    from zrt_core.transforms.lora import DEFAULT_LORA_RANK

    words = split_argv(text, where)
    for i, word in enumerate(words):  # python scripts/performance/setup_experiment.py ...
        if word.endswith(".py"):
            words = words[i + 1:]
            break
    overrides = [w for w in words if "=" in w and not w.startswith("-")]
    flags = [w for w in words if w not in overrides]
    args, unknown = parse_flags(flags, where, flags=FLAGS, aliases=ALIASES)
    ignored = [f"{w} (not modelled)" for w in unknown if w not in ("python", "python3")]
    notes: list[str] = []
    # the perf recipes' settings zrt takes when the launch does not override them: the
    # distributed optimizer, sequence parallelism with tp > 1, no recompute, AdamW
    values: dict[str, Any] = {"mode": "train", "zero": 1, "fsdp": False, "recompute": "none"}
    for flag, key in (("--tensor_model_parallel_size", "tp"),
                      ("--pipeline_model_parallel_size", "pp"),
                      ("--context_parallel_size", "cp"), ("--expert_model_parallel_size", "ep"),
                      ("--micro_batch_size", "micro_batch"),
                      ("--global_batch_size", "global_batch"), ("--seq_length", "seq_len"),
                      ("--num_gpus", "num_gpus")):
        if flag in args:
            values[key] = as_int(args[flag], flag, where)
    missing = [f for f in ("--tensor_model_parallel_size", "--pipeline_model_parallel_size",
                           "--global_batch_size") if f not in args]
    if missing:
        # without them the layout is the recipe's table, which zrt does not read
        raise SpecError(f"{where}: {', '.join(missing)} not given: the layout would be the "
                        "recipe's own", "give -tp -pp -gb (and -cp -vp -ep -mb -sl); "
                        "scripts/performance/dump_perf_configs.py prints a recipe's")
    for flag, key in (("--context_parallel_size", "cp"), ("--micro_batch_size", "micro_batch"),
                      ("--seq_length", "seq_len")):
        if flag not in args:
            notes.append(f"{flag} not given: zrt's {key} (the recipe's own is not read)")
    vp = args.get("--virtual_pipeline_model_parallel_size")
    if vp is not None and vp != "None" and vp != "-1":
        values["vp"] = as_int(vp, "--virtual_pipeline_model_parallel_size", where)
    elif vp in ("None", None):
        values["vp"] = 1
    if "--expert_tensor_parallel_size" in args:
        etp = args["--expert_tensor_parallel_size"]
        values["etp"] = None if etp is None else as_int(etp, "--expert_tensor_parallel_size",
                                                        where)
    if "--compute_dtype" in args:
        values["precision"] = choice(args["--compute_dtype"], "--compute_dtype", where,
                                     COMPUTE_DTYPES)
        if args["--compute_dtype"] == "fp8_sc":
            notes.append("--compute_dtype fp8_sc: sub-channel scaling priced as zrt's fp8")
    else:
        values["precision"] = "bf16"  # the script's default
    if "--gpu" in args:
        hw = choice(args["--gpu"], "--gpu", where, GPUS)
        want = context.get("hardware")
        if want and want != hw:
            raise SpecError(f"{where}: --gpu {args['--gpu']} is {hw}, but zrt was asked for "
                            f"{want}", f"pass --hw {hw}, or fix --gpu")
    if as_bool(args.get("--use_megatron_fsdp", False), "--use_megatron_fsdp", where):
        values["zero"], values["fsdp"] = 3, True
    if "--recompute_num_layers" in args:
        as_int(args["--recompute_num_layers"], "--recompute_num_layers", where)
        values["recompute"] = "full"
    if "--recompute_modules" in args:
        if values["recompute"] == "full":
            raise SpecError(f"{where}: --recompute_modules (selective) and "
                            "--recompute_num_layers (full) are both given", "keep one")
        values["recompute"] = "selective"
        mods = tuple(m.strip() for m in str(args["--recompute_modules"]).split(",")
                     if m.strip())
        # the only way to say selective here; core_attn alone is Megatron-Core's default
        values["recompute_modules"] = None if mods == ("core_attn",) else mods
    if "--moe_flex_dispatcher_backend" not in args and values.get("ep", 1) > 1:
        notes.append("--moe_flex_dispatcher_backend not given: the recipe's own dispatcher "
                     "is not read from a launch line; priced as alltoall (give the flag for "
                     "deepep or hybridep)")
    if "--moe_flex_dispatcher_backend" in args:
        # scripts/performance/argument_parser.py: deepep, hybridep, or None for alltoall
        values["ep_dispatcher"] = choice(
            str(args["--moe_flex_dispatcher_backend"]), "--moe_flex_dispatcher_backend",
            where, {"deepep": "deepep", "hybridep": "hybridep", "None": "alltoall"})
    task = choice(args.get("--task", "pretrain"), "--task", where,
                  {"pretrain": 0, "sft": 0, "peft": DEFAULT_LORA_RANK})
    values["lora_rank"] = task
    if task:
        # every LoRA performance config (v0.3.0 on) overrides cfg.peft.target_modules
        values["lora_modules"] = ("linear_qkv",)
        notes.append("--task peft: adapters on linear_qkv only (the performance configs' "
                     "peft.target_modules)")
    if "--optimizer_type" in args:
        values["optimizer"] = choice(args["--optimizer_type"], "--optimizer_type", where,
                                     {"adam": "adamw", "muon": "muon"})
    if "--pipeline_model_parallel_layout" in args:
        values["pipeline_model_parallel_layout"] = str(args["--pipeline_model_parallel_layout"])
    _overrides(overrides, values, ignored, where)
    if values.get("lora_rank") and not task:
        raise SpecError(f"{where}: peft.dim is set but --task is {args.get('--task')}",
                        "add --task peft")
    for flag in ("--model_family_name", "--model_recipe_name", "--gpus_per_node"):
        if flag in args:
            notes.append(f"{flag} {args[flag]}: the model and machine are zrt's MODEL and --hw")
    return Imported("bridge", values, tuple(ignored), tuple(notes))


def _overrides(words: list[str], values: dict[str, Any], ignored: list[str],
               where: str) -> None:
    emb_loss: dict[str, bool] = {}
    for word in words:
        key, _, raw = word.partition("=")
        key = key.lstrip("+")
        if key not in OVERRIDES:
            ignored.append(f"{word} (not modelled)")
            continue
        dest, kind = OVERRIDES[key]
        if kind == "bool":
            value: Any = as_bool(raw, key, where)
        elif kind == "int":
            value = as_int(raw, key, where)
        else:
            value = choice(raw, key, where, {"p2p": "ring", "a2a": "ulysses"})
        if dest == "zero":
            value = 1 if value else 0
            if values.get("fsdp"):
                raise SpecError(f"{where}: {word} with --use_megatron_fsdp", "keep one")
        if dest == "embedding_loss_stages":
            emb_loss[key] = value
        values[dest] = value
    if len(set(emb_loss.values())) > 1 or len(emb_loss) == 1:
        raise SpecError(f"{where}: model.account_for_embedding_in_pipeline_split and "
                        "model.account_for_loss_in_pipeline_split differ",
                        "zrt counts both or neither: set both")


def write(request: RunRequest, header: Header) -> str:
    """A ``setup_experiment.py`` launch with the layout's flags and overrides."""
    from zrt_core.transforms.lora import DEFAULT_LORA_RANK

    train = request.train
    if train is None:
        raise SpecError("--emit bridge writes a training run; this is a serving run",
                        "use --emit trtllm or --emit vllm")
    if train.recompute == "op":
        raise SpecError("--recompute op is PyTorch's checkpointing by op (torchtitan's "
                        "selective_ac_option op); Megatron-Bridge has no such setting",
                        "use --recompute selective or full, or --emit torchtitan")
    p = request.parallel
    dtype = {v: k for k, v in COMPUTE_DTYPES.items() if k != "fp8_sc"}.get(train.precision)
    if dtype is None:
        raise SpecError(f"Megatron-Bridge's --compute_dtype has no {train.precision}"
                        + (" (delayed scaling)" if train.precision == "fp8" else ""),
                        "use bf16, fp8_cs, mxfp8 or nvfp4")
    words = []
    gpu = {v: k for k, v in GPUS.items()}.get(header.hardware)
    if gpu:
        words.append(f"-g {gpu}")
    words += [f"-c {dtype}", f"-ng {p.world_size}", f"-tp {p.tp}", f"-pp {p.pp}",
              f"-cp {p.cp}", f"-vp {p.vp if p.vp > 1 else 'None'}", f"-ep {p.ep}"]
    if p.etp is not None:
        words.append(f"-et {p.etp}")
    words += [f"-mb {train.micro_batch}", f"-gb {train.global_batch}",
              f"-sl {train.seq_len}"]
    if p.ep_dispatcher != "alltoall":
        words.append(f"--moe_flex_dispatcher_backend {p.ep_dispatcher}")
    if train.recompute == "full":
        words.append("-rl 1")
    elif train.recompute == "selective" and train.recompute_modules != ():
        # an empty list re-runs nothing: no recompute flag
        words.append(f"--recompute_modules {','.join(train.recompute_modules or ('core_attn',))}")
    if train.fsdp or train.zero >= 2:
        if not (train.fsdp and train.zero == 3):
            raise SpecError(f"ZeRO-{train.zero}{' FSDP' if train.fsdp else ''} has no "
                            "Megatron-Bridge flag", "use zero 0 or 1, or --fsdp with zero 3")
        words.append("--use_megatron_fsdp true")
    optimizer = {"adamw": "adam", "muon": "muon"}.get(train.optimizer)
    if optimizer is None:
        raise SpecError(f"Megatron-Bridge's --optimizer_type has no {train.optimizer}",
                        "use adamw or muon")
    words.append(f"--optimizer_type {optimizer}")
    if train.lora_rank:
        if train.lora_modules not in (None, ("linear_qkv",)):
            raise SpecError("Megatron-Bridge's performance configs put LoRA adapters on "
                            f"linear_qkv only, not {', '.join(train.lora_modules)}",
                            "use --lora-modules linear_qkv, or emit another framework")
        words.append("--task peft")
    if train.pp_schedule not in ("1f1b", "interleaved"):
        raise SpecError(f"Megatron-Bridge has no flag for the {train.pp_schedule} schedule",
                        "use 1f1b (interleaved with vp > 1)")
    split = request.stage_split
    if split is not None and split.layout is not None:
        words.append(f"--pipeline_model_parallel_layout '{split.layout}'")
    over = []
    if p.tp > 1 and not p.sequence_parallel(training=True):
        over.append("model.sequence_parallel=false")
    if train.zero == 0 and not train.fsdp:
        over.append("ddp.use_distributed_optimizer=false")
    if not train.grad_reduce_in_fp32:
        over.append("ddp.grad_reduce_in_fp32=false")
    if train.quantized_params:
        over.append("mixed_precision.fp8_param_gather=true")
    if p.cp > 1 and p.cp_kind == "ulysses":
        over.append("model.cp_comm_type=a2a")
    if train.lora_rank and train.lora_rank != DEFAULT_LORA_RANK:
        over.append(f"peft.dim={train.lora_rank}")
    if train.offload_optimizer:
        over.append("optimizer.optimizer_cpu_offload=true")
    if train.freeze_language_model:
        over.append("model.freeze_language_model=true")
    if split is not None:
        if split.first_layers is not None:
            over.append(f"model.num_layers_in_first_pipeline_stage={split.first_layers}")
        if split.last_layers is not None:
            over.append(f"model.num_layers_in_last_pipeline_stage={split.last_layers}")
        if split.embedding_loss:
            over += ["model.account_for_embedding_in_pipeline_split=true",
                     "model.account_for_loss_in_pipeline_split=true"]
    head = "".join(f"# {line}\n" for line in header.lines("Megatron-Bridge performance launch"))
    head += "# add -m FAMILY -mr RECIPE: the model's recipe in scripts/performance/configs\n"
    if not gpu:
        head += f"# no -g: {header.hardware} is not one of {', '.join(GPUS)}\n"
    body = " \\\n    ".join(words + over)
    return f"{head}python scripts/performance/setup_experiment.py \\\n    {body}\n"
