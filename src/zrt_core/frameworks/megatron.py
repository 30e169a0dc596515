"""Megatron-LM command lines (``torchrun ... pretrain_gpt.py --tensor-model-parallel-size
...``) read into ``zrt run --train``'s layout, and written back.

Argument names and defaults: NVIDIA/Megatron-LM@d98e8a6 ``megatron/training/arguments.py``
(``ArgumentGroupFactory`` turns the fields of ``megatron/core/model_parallel_config.py`` and
``megatron/core/transformer/transformer_config.py`` into ``--field-name`` flags).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zrt_core.errors import SpecError
from zrt_core.frameworks.base import (
    Header,
    Imported,
    RunRequest,
    agree,
    as_int,
    choice,
    parse_flags,
    split_argv,
)

#: flag → arity (0 a switch, 1 a value, -1 one or more values)
FLAGS: dict[str, int] = {
    "--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 1,
    "--num-layers-per-virtual-pipeline-stage": 1, "--num-virtual-stages-per-pipeline-rank": 1,
    "--context-parallel-size": 1, "--cp-comm-type": -1, "--expert-model-parallel-size": 1,
    "--expert-tensor-parallel-size": 1, "--sequence-parallel": 0,
    "--use-distributed-optimizer": 0, "--use-megatron-fsdp": 0, "--use-torch-fsdp2": 0,
    "--grad-reduce-in-bf16": 0, "--fp8-param-gather": 0,
    "--data-parallel-sharding-strategy": 1, "--recompute-granularity": 1,
    "--recompute-activations": 0, "--recompute-modules": -1, "--recompute-method": 1,
    "--recompute-num-layers": 1, "--micro-batch-size": 1, "--global-batch-size": 1,
    "--seq-length": 1, "--bf16": 0, "--fp16": 0, "--fp8-format": 1, "--fp8-recipe": 1,
    "--fp4-format": 1, "--fp4-recipe": 1, "--optimizer": 1, "--optimizer-cpu-offload": 0,
    "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1,
    "--pipeline-model-parallel-layout": 1, "--account-for-embedding-in-pipeline-split": 0,
    "--account-for-loss-in-pipeline-split": 0, "--moe-token-dispatcher-type": 1,
    "--moe-flex-dispatcher-backend": 1,
    "--num-layers": 1, "--hidden-size": 1, "--ffn-hidden-size": 1,
    "--num-attention-heads": 1, "--num-query-groups": 1, "--group-query-attention": 0,
    "--num-experts": 1, "--moe-ffn-hidden-size": 1, "--moe-router-topk": 1,
}

#: torchrun's flags that give the world size (``--nnodes`` × ``--nproc-per-node``)
LAUNCHER = {"--nnodes": 1, "--nproc-per-node": 1, "--nproc_per_node": 1}

#: ``--fp8-recipe`` → zrt precision (``--fp8-format`` e4m3 / hybrid picks the E4M3/E5M2
#: split, which zrt's fp8 GEMM rate does not distinguish)
FP8_RECIPES = {"delayed": "fp8", "tensorwise": "fp8_cs", "blockwise": "fp8", "mxfp8": "mxfp8"}
#: Megatron's ``--optimizer`` → zrt's: Megatron's adam is decoupled weight decay (AdamW,
#: ``adam_w_mode`` of TE/Apex FusedAdam)
OPTIMIZERS = {"adam": "adamw", "sgd": "sgd", "muon": "muon", "dist_muon": "muon"}
#: ``--data-parallel-sharding-strategy`` (Megatron-FSDP) → ZeRO stage
SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
CP_COMM = {"p2p": "ring", "a2a": "ulysses"}

#: model-size flags checked against the model's config: flag → ModelDims field
SIZE_FLAGS = {"--num-layers": "layers", "--hidden-size": "hidden", "--ffn-hidden-size": "ffn",
              "--num-attention-heads": "heads", "--num-query-groups": "kv_heads",
              "--num-experts": "experts", "--moe-ffn-hidden-size": "moe_ffn",
              "--moe-router-topk": "top_k"}

#: modelled without a value of their own (what zrt assumes instead)
NOTED = {
    "--recompute-method": "zrt's full recompute recomputes every layer of the stage",
    "--recompute-num-layers": "zrt's full recompute recomputes every layer of the stage",
}


#: ``--moe-flex-dispatcher-backend`` → zrt's ``Parallel.ep_dispatcher``
FLEX_BACKENDS = {"deepep": "deepep", "hybridep": "hybridep"}


def _dispatcher(args: Mapping[str, Any], where: str, notes: list[str]) -> str:
    """``--moe-token-dispatcher-type`` (alltoall, Megatron's default; allgather; flex) and
    ``--moe-flex-dispatcher-backend`` (deepep, TransformerConfig's default; hybridep) as
    zrt's EP dispatcher."""
    kind = choice(args.get("--moe-token-dispatcher-type", "alltoall"),
                  "--moe-token-dispatcher-type", where,
                  {"alltoall": "alltoall", "allgather": "allgather", "flex": "flex"})
    if kind != "flex":
        if "--moe-flex-dispatcher-backend" in args:
            notes.append("--moe-flex-dispatcher-backend: read only with "
                         "--moe-token-dispatcher-type flex")
        if kind == "allgather":
            notes.append("--moe-token-dispatcher-type allgather: priced as the alltoall "
                         "dispatcher's all-to-all")
        return "alltoall"
    return choice(args.get("--moe-flex-dispatcher-backend", "deepep"),
                  "--moe-flex-dispatcher-backend", where, FLEX_BACKENDS)


def split_launch(words: list[str]) -> tuple[list[str], list[str]]:
    """``(launcher words, script words)``: everything up to the ``.py`` script is the
    launcher's (torchrun's), the rest the script's."""
    for i, word in enumerate(words):
        if word.endswith(".py"):
            return words[:i], words[i + 1:]
    return [], words


def read(text: str, where: str, context: Mapping[str, Any]) -> Imported:
    words = split_argv(text, where)
    launch, script = split_launch(words)
    args, unknown = parse_flags(script, where, flags=FLAGS)
    ignored = [f"{w} (not modelled)" for w in unknown]
    notes: list[str] = []
    values: dict[str, Any] = {"mode": "train"}
    if launch:
        lflags, lrest = parse_flags(launch, where, flags=LAUNCHER)
        nodes = as_int(lflags.get("--nnodes", 1), "--nnodes", where)
        per = lflags.get("--nproc-per-node", lflags.get("--nproc_per_node"))
        if per is not None:
            values["num_gpus"] = nodes * as_int(per, "--nproc-per-node", where)
        ignored += [f"{w} (launcher)" for w in lrest if w.startswith("-")]
    for flag, key in (("--tensor-model-parallel-size", "tp"),
                      ("--pipeline-model-parallel-size", "pp"),
                      ("--context-parallel-size", "cp"), ("--expert-model-parallel-size", "ep"),
                      ("--expert-tensor-parallel-size", "etp"),
                      ("--micro-batch-size", "micro_batch"),
                      ("--global-batch-size", "global_batch"), ("--seq-length", "seq_len"),
                      ("--decoder-first-pipeline-num-layers",
                       "decoder_first_pipeline_num_layers"),
                      ("--decoder-last-pipeline-num-layers",
                       "decoder_last_pipeline_num_layers")):
        if flag in args:
            values[key] = as_int(args[flag], flag, where)
    for flag, key in (("--micro-batch-size", "micro_batch"), ("--seq-length", "seq_len")):
        if flag not in args:  # Megatron-LM requires both; zrt takes its own flag's value
            notes.append(f"{flag} not given: zrt's {key}")
    pp = values.get("pp", 1)
    if "--num-virtual-stages-per-pipeline-rank" in args:
        values["vp"] = as_int(args["--num-virtual-stages-per-pipeline-rank"],
                              "--num-virtual-stages-per-pipeline-rank", where)
    if "--num-layers-per-virtual-pipeline-stage" in args:
        per_stage = as_int(args["--num-layers-per-virtual-pipeline-stage"],
                           "--num-layers-per-virtual-pipeline-stage", where)
        layers = (as_int(args["--num-layers"], "--num-layers", where) if "--num-layers" in args
                  else context.get("layers"))
        if not layers:
            raise SpecError(f"{where}: --num-layers-per-virtual-pipeline-stage needs the "
                            "layer count", "give --num-layers or the model")
        if layers % (pp * per_stage):
            raise SpecError(f"{where}: --num-layers-per-virtual-pipeline-stage {per_stage} × "
                            f"pp {pp} does not divide the {layers} layers",
                            "fix one of them")
        agree(values, "vp", layers // (pp * per_stage), where,
              "--num-layers-per-virtual-pipeline-stage")
    if "--pipeline-model-parallel-layout" in args:
        values["pipeline_model_parallel_layout"] = str(args["--pipeline-model-parallel-layout"])
    if "--cp-comm-type" in args:
        kinds = {choice(k, "--cp-comm-type", where, CP_COMM) for k in args["--cp-comm-type"]}
        if len(kinds) > 1:
            raise SpecError(f"{where}: --cp-comm-type mixes {sorted(kinds)} across layers",
                            "zrt prices one kind for every layer: give one")
        values["cp_kind"] = kinds.pop()
    values["ep_dispatcher"] = _dispatcher(args, where, notes)
    # Megatron's own defaults when a switch is absent: no sequence parallelism
    # (ModelParallelConfig.sequence_parallel = False), plain DDP (no distributed optimizer)
    values["sp"] = bool(args.get("--sequence-parallel", False))
    values["zero"], values["fsdp"] = 0, False
    # gradients reduced in fp32 unless --grad-reduce-in-bf16; fp8 weights kept alone with
    # --fp8-param-gather (Megatron-LM arguments.py)
    values["grad_reduce_in_fp32"] = not args.get("--grad-reduce-in-bf16", False)
    values["quantized_params"] = bool(args.get("--fp8-param-gather", False))
    if args.get("--use-distributed-optimizer"):
        values["zero"] = 1
    fsdp = [f for f in ("--use-megatron-fsdp", "--use-torch-fsdp2") if args.get(f)]
    if len(fsdp) > 1:
        raise SpecError(f"{where}: {fsdp[0]} and {fsdp[1]} are two FSDPs", "keep one")
    if fsdp:
        stage = choice(args.get("--data-parallel-sharding-strategy", "optim_grads_params"),
                       "--data-parallel-sharding-strategy", where, SHARDING)
        values["zero"], values["fsdp"] = stage, stage == 3
        if stage < 3:
            values["fsdp"] = False
    elif "--data-parallel-sharding-strategy" in args:
        ignored.append(f"--data-parallel-sharding-strategy "
                       f"{args['--data-parallel-sharding-strategy']} (only read with "
                       "--use-megatron-fsdp)")
    values["recompute"] = "none"
    if args.get("--recompute-activations"):
        values["recompute"] = "selective"
    if "--recompute-granularity" in args:
        granularity = choice(args["--recompute-granularity"], "--recompute-granularity",
                             where, {"full": "full", "selective": "selective"})
        if values["recompute"] == "selective" and granularity != "selective":
            raise SpecError(f"{where}: --recompute-activations (selective) and "
                            f"--recompute-granularity {granularity} disagree", "keep one")
        values["recompute"] = granularity
    if "--recompute-modules" in args:
        mods = list(args["--recompute-modules"])
        if values["recompute"] == "full":
            raise SpecError(f"{where}: --recompute-modules is for selective recompute, but "
                            "--recompute-granularity is full", "drop one")
        values["recompute"] = "selective"
        values["recompute_modules"] = tuple(mods)
    values.update(_precision(args, where))
    if "--optimizer" in args:
        values["optimizer"] = choice(args["--optimizer"], "--optimizer", where, OPTIMIZERS)
    if args.get("--optimizer-cpu-offload"):
        values["offload_optimizer"] = True
    emb, loss = (bool(args.get(f"--account-for-{k}-in-pipeline-split"))
                 for k in ("embedding", "loss"))
    if emb != loss:
        raise SpecError(f"{where}: --account-for-{'embedding' if emb else 'loss'}-in-pipeline-"
                        "split without the other", "zrt counts both or neither: give both")
    values["embedding_loss_stages"] = emb
    for flag, why in NOTED.items():
        if flag in args:
            notes.append(f"{flag} {args[flag]}: {why}")
    _check_sizes(args, context.get("dims"), where)
    if args.get("--group-query-attention") is not None and "--num-query-groups" not in args:
        notes.append("--group-query-attention without --num-query-groups: the model's KV "
                     "heads are used")
    return Imported("megatron", values, tuple(ignored), tuple(notes))


def _precision(args: Mapping[str, Any], where: str) -> dict[str, str]:
    if args.get("--bf16") and args.get("--fp16"):
        raise SpecError(f"{where}: --bf16 and --fp16 are both given", "keep one")
    if "--fp8-format" in args and "--fp4-format" in args:
        raise SpecError(f"{where}: --fp8-format and --fp4-format are both given", "keep one")
    if "--fp4-format" in args:
        choice(args["--fp4-format"], "--fp4-format", where, {"e2m1": "nvfp4"})
        choice(args.get("--fp4-recipe", "nvfp4"), "--fp4-recipe", where, {"nvfp4": "nvfp4"})
        return {"precision": "nvfp4"}
    if "--fp8-format" in args:
        choice(args["--fp8-format"], "--fp8-format", where, {"e4m3": 1, "hybrid": 1})
        # TransformerConfig.fp8_recipe defaults to "delayed"
        return {"precision": choice(args.get("--fp8-recipe", "delayed"), "--fp8-recipe", where,
                                    FP8_RECIPES)}
    if args.get("--fp16"):
        return {"precision": "fp16"}
    if args.get("--bf16"):
        return {"precision": "bf16"}
    return {"precision": "fp32"}  # Megatron without --bf16/--fp16 trains in fp32


def _check_sizes(args: Mapping[str, Any], dims: Any, where: str) -> None:
    """The model-size arguments must describe the model zrt was given."""
    if dims is None:
        return
    for flag, attr in SIZE_FLAGS.items():
        if flag not in args:
            continue
        given = as_int(args[flag], flag, where)
        have = getattr(dims, attr)
        if attr == "ffn" and dims.is_moe and not have:
            continue
        if given != have:
            raise SpecError(f"{where}: {flag} {given} but the model has {have} "
                            f"({attr})", "pass the matching model, or fix the argument")


def write(request: RunRequest, header: Header) -> str:
    """The arguments of a ``pretrain_gpt.py`` launch, one per line, under a torchrun line
    that gives the world size."""
    train = request.train
    if train is None:
        raise SpecError("--emit megatron writes a training run; this is a serving run",
                        "use --emit trtllm or --emit vllm")
    if train.recompute == "op":
        raise SpecError("--recompute op is PyTorch's checkpointing by op (torchtitan's "
                        "selective_ac_option op); Megatron-LM has no such setting",
                        "use --recompute selective or full, or --emit torchtitan")
    p = request.parallel
    world = p.world_size
    nodes, per = (world // 8, 8) if world % 8 == 0 else (1, world)
    args: list[str] = [
        f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
        f"--context-parallel-size {p.cp}"]
    if p.vp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {p.vp}")
    if p.cp > 1:
        args.append(f"--cp-comm-type {'p2p' if p.cp_kind == 'ring' else 'a2a'}")
    if p.ep > 1 or p.etp is not None:
        args += [f"--expert-model-parallel-size {p.ep}",
                 f"--expert-tensor-parallel-size {p.expert_tp}"]
    if p.ep_dispatcher != "alltoall":
        args += ["--moe-token-dispatcher-type flex",
                 f"--moe-flex-dispatcher-backend {p.ep_dispatcher}"]
    if p.sequence_parallel(training=True):
        args.append("--sequence-parallel")
    if train.fsdp or train.zero >= 2:
        if train.zero == 3 and not train.fsdp:
            raise SpecError("ZeRO-3 without FSDP has no Megatron-LM argument",
                            "use --fsdp (Megatron-FSDP optim_grads_params) or --emit deepspeed")
        strategy = {v: k for k, v in SHARDING.items()}[train.zero if not train.fsdp else 3]
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}"]
    elif train.zero == 1:
        args.append("--use-distributed-optimizer")
    if not train.grad_reduce_in_fp32:
        args.append("--grad-reduce-in-bf16")
    if train.quantized_params:
        args.append("--fp8-param-gather")
    if train.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif train.recompute == "selective" and train.recompute_modules != ():
        # an empty list re-runs nothing: no recompute flags
        args.append("--recompute-granularity selective")  # modules: Megatron's default
        if train.recompute_modules is not None:
            args.append(" ".join(("--recompute-modules", *train.recompute_modules)))
    args += [f"--micro-batch-size {train.micro_batch}",
             f"--global-batch-size {train.global_batch}", f"--seq-length {train.seq_len}"]
    args += {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16"],
             "fp8": ["--bf16", "--fp8-format hybrid", "--fp8-recipe delayed"],
             "fp8_cs": ["--bf16", "--fp8-format hybrid", "--fp8-recipe tensorwise"],
             "mxfp8": ["--bf16", "--fp8-format e4m3", "--fp8-recipe mxfp8"],
             "nvfp4": ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"]}[train.precision]
    optimizer = {"adamw": "adam", "adam": None, "sgd": "sgd", "muon": "muon"}[train.optimizer]
    if optimizer is None:
        raise SpecError("Megatron-LM's adam is AdamW; plain Adam has no argument",
                        "use --optimizer adamw")
    args.append(f"--optimizer {optimizer}")
    if train.offload_optimizer:
        args.append("--optimizer-cpu-offload")
    if train.lora_rank:
        raise SpecError("Megatron-LM has no LoRA arguments", "use --emit bridge (peft)")
    if train.pp_schedule not in ("1f1b", "interleaved"):
        raise SpecError(f"Megatron-LM has no argument for the {train.pp_schedule} schedule",
                        "use 1f1b (interleaved with vp > 1)")
    split = request.stage_split
    if split is not None:
        if split.first_layers is not None:
            args.append(f"--decoder-first-pipeline-num-layers {split.first_layers}")
        if split.last_layers is not None:
            args.append(f"--decoder-last-pipeline-num-layers {split.last_layers}")
        if split.layout is not None:
            args.append(f"--pipeline-model-parallel-layout '{split.layout}'")
        if split.embedding_loss:
            args += ["--account-for-embedding-in-pipeline-split",
                     "--account-for-loss-in-pipeline-split"]
    head = "".join(f"# {line}\n" for line in header.lines("Megatron-LM arguments"))
    body = " \\\n    ".join(args)
    return (f"{head}torchrun --nnodes {nodes} --nproc-per-node {per} pretrain_gpt.py \\\n"
            f"    {body}\n")
