"""``zrt run --from FRAMEWORK SOURCE`` (the layout from a framework's own config) and
``--emit FRAMEWORK`` (the run written back as that framework's config): the flags and the
glue to :mod:`zrt_core.frameworks`. What the config sets becomes ``zrt run``'s flags, so the
runners build the same objects as from the flags; a flag given as well must agree."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from zrt_core.errors import SpecError

#: reader field → ``zrt run`` flag as the user types it (for messages)
FLAG_NAMES = {"tp": "--tp", "pp": "--pp", "vp": "--vp", "cp": "--cp", "ep": "--ep",
              "etp": "--etp", "dp": "--dp", "sp": "--sp/--no-sp", "cp_kind": "--cp-kind",
              "micro_batch": "--micro-batch", "global_batch": "--global-batch",
              "seq_len": "--seq-len", "recompute": "--recompute", "zero": "--zero",
              "fsdp": "--fsdp", "optimizer": "--optimizer", "precision": "--precision",
              "pp_schedule": "--pp-schedule", "offload_optimizer": "--offload-optimizer",
              "lora_rank": "--lora-rank", "lora_modules": "--lora-modules", "hsdp": "--hsdp",
              "grad_reduce_in_fp32": "--grad-reduce-in-bf16",
              "quantized_params": "--fp8-param-gather",
              "freeze_language_model": "--freeze-language-model",
              "reshard_after_forward": "--reshard-after-forward", "batch": "--batch", "quant": "--quant",
              "kv_dtype": "--kv-dtype", "engine": "--engine", "num_gpus": "--num-gpus",
              "input_len": "--input-len", "output_len": "--output-len",
              "decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers",
              "decoder_last_pipeline_num_layers": "--decoder-last-pipeline-num-layers",
              "pipeline_model_parallel_layout": "--pipeline-model-parallel-layout",
              "embedding_loss_stages": "--embedding-loss-stages"}


#: The names ``zrt_core.frameworks.FRAMEWORKS`` registers, for the help text: building the
#: parser must not import the readers (tests/test_cli_frameworks.py checks they agree).
FRAMEWORK_NAMES = ("megatron", "bridge", "torchtitan", "deepspeed", "trtllm", "vllm")


def add_framework_args(p: argparse.ArgumentParser) -> None:
    names = ", ".join(FRAMEWORK_NAMES)
    g = p.add_argument_group("framework configs")
    g.add_argument("--from", dest="from_framework", nargs=2, metavar=("FRAMEWORK", "SOURCE"),
                   default=None,
                   help=f"take the layout from a framework's config ({names}): a file, or "
                        "for megatron, bridge and vllm the command line itself; arguments "
                        "zrt does not model are listed (docs/frameworks.md)")
    g.add_argument("--emit", metavar="FRAMEWORK", default=None,
                   help=f"print the run as that framework's arguments or config ({names}) "
                        "with zrt's predicted figures in its header, instead of the report")
    p.set_defaults(_run_parser=p, dtype=None)


def apply_from(args: argparse.Namespace) -> None:
    """Read ``--from`` and set the flags it gives; report what it ignores on stderr."""
    from zrt_core.frameworks import FRAMEWORKS, framework_of, read

    if args.emit is not None:
        framework_of(args.emit)  # an unknown name fails before any estimate
    if args.from_framework is None:
        return
    name, source = args.from_framework
    framework_of(name)
    workload = FRAMEWORKS[name.lower()][2]
    if args.mode is not None and args.mode != workload:
        raise SpecError(f"--from {name} gives a {'training' if workload == 'train' else 'serving'}"
                        f" run, but --{args.mode} was asked for", f"drop --{args.mode}")
    args.mode = workload
    imported = read(name, source, _context(args))
    parser = args._run_parser
    values = dict(imported.values)
    values.pop("mode", None)
    world = values.pop("num_gpus", None)
    if world is not None:
        if workload == "train":
            _set(args, parser, "num_gpus", world, name)
    world = world or getattr(args, "num_gpus", None)
    if "dp" not in values and world:
        from zrt_core.frameworks.base import dp_from_world

        tp, pp, cp = (values.get(k, getattr(args, k)) for k in ("tp", "pp", "cp"))
        values["dp"] = dp_from_world(world, tp, pp, cp)
    for key, value in values.items():
        _set(args, parser, key, value, name)
    for line in imported.ignored:
        print(f"zrt: --from {name} ignores {line}", file=sys.stderr)
    for line in imported.notes:
        print(f"zrt: --from {name}: {line}", file=sys.stderr)


def _set(args: argparse.Namespace, parser: argparse.ArgumentParser, key: str, value: Any,
         name: str) -> None:
    if key == "dtype":
        args.dtype = value
        return
    if not hasattr(args, key):
        raise SpecError(f"--from {name} sets {key}, which zrt run has no flag for",
                        "this is a bug in zrt")
    given, default = getattr(args, key), parser.get_default(key)
    if given != default and given != value:
        flag = FLAG_NAMES.get(key, key)
        raise SpecError(f"{flag} {given} contradicts --from {name}, which gives "
                        f"{key}={value}", f"drop {flag} or change the config")
    setattr(args, key, value)


def _context(args: argparse.Namespace) -> dict[str, Any]:
    """What a reader may check against: the model's dimensions, the world size, the
    hardware."""
    from zrt_core.capture.sources import raw_config
    from zrt_core.errors import ModelError
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import get_plugin_manager

    context: dict[str, Any] = {"num_gpus": getattr(args, "num_gpus", None)}
    host = get_plugin_manager()
    context["hardware"] = host.hardware_spec(args.hw).id
    try:
        config, _where = raw_config(args.model, host)
        dims = ModelDims.from_config(config)
    except ModelError:
        return context
    context["dims"], context["layers"] = dims, dims.layers
    return context


def emit_run(args: argparse.Namespace, report: Any, **objects: Any) -> bool:
    """With ``--emit``, print the run as the framework's config and return True."""
    if not getattr(args, "emit", None):
        return False
    from zrt_core.frameworks import Header, RunRequest, emit

    data = report.to_json()
    keys = ("step_time_s", "tokens_per_s_per_gpu", "mfu") if "step_time_s" in data else \
        ("ttft_ms", "tpot_ms", "output_tokens_per_s_per_gpu", "batch")
    predicted = {k: data.get(k) for k in keys}
    ctx = _context(args)
    dims = ctx.get("dims")
    header = Header(model=str(args.model), hardware=str(data.get("hardware") or args.hw),
                    predicted=predicted, layers=ctx.get("layers"),
                    experts=None if dims is None else dims.experts)
    sys.stdout.write(emit(args.emit, RunRequest(**objects), header))
    return True
