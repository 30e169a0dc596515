"""``zrt run MODEL --hw ID --train``: one training step of a model on a machine and a layout.

Registered as the ``train`` mode of :mod:`zrt_core.cli.run_cmd` (which owns the shared
layout flags, ``--out``, ``--json`` and ``--no-cache``). Prints the step breakdown, the
per-stage table and memory per device; ``--json`` prints :meth:`TrainingReport.to_json`
(the identity fields, ``step_time_s``, ``tokens_per_s_per_gpu``, ``mfu``, ``hfu``, the
memory fields); ``--out DIR`` writes ``report.html``, ``report.json`` and ``trace.json``
(the pipeline schedule, one process per pipeline rank, and the first stage's kernels).
A layout rule that fails is one line naming the rule, exit 2; a layout that does not fit
in memory is reported as such, with the numbers.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from zrt_core.cli._output import console, out_dir, positive_int, print_json
from zrt_core.cli.run_cmd import add_mode, parallel_from_args, use_fusion_rules


def add_train_args(p: argparse.ArgumentParser) -> None:
    from zrt_core.strategy import OPTIMIZERS, PP_SCHEDULES, PRECISIONS, RECOMPUTE

    g = p.add_argument_group("training (--train)")
    g.add_argument("--micro-batch", type=positive_int("--micro-batch"), default=1,
                   metavar="B", help="sequences per micro-batch (default 1)")
    g.add_argument("--global-batch", type=positive_int("--global-batch"), default=None,
                   metavar="G", help="sequences per step (default: micro-batch × dp)")
    g.add_argument("--seq-len", type=positive_int("--seq-len"), default=4096, metavar="S",
                   help="tokens per sequence (default 4096)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none",
                   help="activation recomputation: Megatron-LM's selective (the attention "
                        "core) or full, or op: PyTorch's checkpointing by op as torchtitan's "
                        "selective_ac_option op runs it (default none)")
    g.add_argument("--recompute-modules", default=None, metavar="LIST",
                   help="with --recompute selective: Megatron-Core's recompute_modules, "
                        "comma-separated (core_attn, moe_act, layernorm, mla_up_proj, mlp, "
                        "moe, shared_experts; default core_attn)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=1,
                   help="ZeRO stage; 1 is Megatron's distributed optimizer (default 1)")
    g.add_argument("--fsdp", action="store_true", help="FSDP (parameters sharded, as ZeRO-3)")
    g.add_argument("--reshard-after-forward", type=reshard_value, default=None,
                   metavar="true|false|N",
                   help="FSDP2's reshard_after_forward: free gathered parameters after "
                        "forward (true), keep them for backward (false) or keep a shard over "
                        "N ranks (default: false with --pp > 1, else true, as torchtitan)")
    g.add_argument("--hsdp", type=positive_int("--hsdp"), default=None, metavar="R",
                   help="HSDP: shard within groups of R data-parallel ranks, replicate "
                        "across them (default: shard over all of dp)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw",
                   help="optimizer (default adamw)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="bf16, fp16, fp8 (TransformerEngine delayed scaling), fp8_cs (current "
                        "scaling), mxfp8 or nvfp4 (Blackwell block scaling); default bf16")
    g.add_argument("--pp-schedule", choices=PP_SCHEDULES, default=None,
                   help="pipeline schedule (default 1f1b, interleaved when --vp > 1)")
    g.add_argument("--offload-optimizer", action="store_true",
                   help="keep optimizer states in host memory (needs --host-link-gbps)")
    g.add_argument("--grad-reduce-in-bf16", dest="grad_reduce_in_fp32",
                   action="store_false",
                   help="keep and reduce gradients in bf16 (Megatron's grad_reduce_in_fp32 "
                        "off, as Megatron-Bridge's performance recipes run); default fp32")
    g.add_argument("--fp8-param-gather", dest="quantized_params", action="store_true",
                   help="with an fp8-family --precision, keep the layers' weights only in "
                        "their low-precision copies (Megatron's fp8_param_gather)")
    g.add_argument("--lora-rank", type=positive_int("--lora-rank"), default=0, metavar="R",
                   help="LoRA fine-tuning: frozen base weights, rank-R adapters on every "
                        "decoder linear layer (Megatron-Bridge's default is 32; without it "
                        "every weight trains)")
    g.add_argument("--lora-modules", default=None, metavar="LIST",
                   help="with --lora-rank: the linear layers that carry adapters, "
                        "comma-separated Megatron names (linear_qkv, linear_proj, linear_fc1, "
                        "linear_fc2); default all four (Megatron-Bridge's LoRA default; its "
                        "performance configs use linear_qkv)")
    g.add_argument("--freeze-language-model", action="store_true",
                   help="the decoder's weights do not train (Megatron-Bridge's "
                        "freeze_language_model, as its Qwen3-VL recipes run): no weight "
                        "gradients, gradient reduction or optimizer states for them")
    g.add_argument("--host-link-gbps", type=float, default=None, metavar="GB_S",
                   help="device-to-host bandwidth per device, GB/s (PCIe or C2C)")
    g.add_argument("--ep-overlap", action="store_true",
                   help="overlap one micro-batch's EP all-to-all with another's compute "
                        "(Megatron-Core --overlap-moe-expert-parallel-comm)")
    g.add_argument("--moe-shared-expert-overlap", action="store_true",
                   help="run the shared experts on their own stream under the EP "
                        "all-to-all (Megatron-Core --moe-shared-expert-overlap; in serving "
                        "SGLang's and TensorRT-LLM's DeepSeek MoE; off by default)")
    g.add_argument("--attention", choices=("flash", "flash2", "flash1", "unfused"),
                   default="flash",
                   help="attention kernels: flash (default: the device's own fused kernel, "
                        "cuDNN / FlashAttention-3 on Hopper), flash2 or flash1 "
                        "(FlashAttention-2 or 1.x: PyTorch SDPA's flash backend, flash-attn "
                        "2.x / 1.x, as PyTorch-native stacks run them), or unfused "
                        "(Megatron-LM before FlashAttention)")
    g.add_argument("--num-gpus", type=positive_int("--num-gpus"), default=None, metavar="N",
                   help="check that tp × cp × pp × dp equals this")
    from zrt_core.cli.search_cmd import int_list

    g.add_argument("--gpus", type=int_list("--gpus"), default=None, metavar="LIST",
                   help="weak scaling: estimate at each GPU count (a list 64,128 or a "
                        "doubling range 64-16384), dp growing with the GPUs and the global "
                        "batch with dp (the per-GPU batch of --dp and --global-batch)")
    g.add_argument("--no-nvls", action="store_true",
                   help="price collectives as NCCL_NVLS_ENABLE=0 does: no NVLink SHARP "
                        "(NeMo / Megatron-Bridge performance launchers set it)")
    g.add_argument("--embedding-loss-stages", action="store_true",
                   help="count the embedding and the loss as layers when splitting layers "
                        "into stages (Megatron's account_for_*_in_pipeline_split)")
    g.add_argument("--decoder-first-pipeline-num-layers", type=positive_int(
                   "--decoder-first-pipeline-num-layers"), default=None, metavar="N",
                   help="decoder layers on the first pipeline rank (Megatron's uneven split; "
                        "split over its vp chunks)")
    g.add_argument("--decoder-last-pipeline-num-layers", type=positive_int(
                   "--decoder-last-pipeline-num-layers"), default=None, metavar="N",
                   help="decoder layers on the last pipeline rank")
    g.add_argument("--pipeline-model-parallel-layout", default=None, metavar="LAYOUT",
                   help="Megatron's layout string, one |-separated entry per virtual stage: "
                        "E embedding, t decoder layer, m MTP layer, L loss, e.g. "
                        "'Et|(tt|)*30mL'")
    from zrt_core.cli.goodput_args import add_goodput_args

    add_goodput_args(p)


def reshard_value(text: str) -> bool | int:
    """``true`` / ``false`` / a positive group size, as FSDP2's ``reshard_after_forward``."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        value = int(low)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--reshard-after-forward must be true, false or a positive group size, "
            f"got {text!r}")
    return value


def run_train(args: argparse.Namespace) -> int:
    from zrt_core.capture.sources import raw_config
    from zrt_core.checks import check_train_request
    from zrt_core.cli.goodput_args import goodput_spec_from_args
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.schedule.stages import StageSplit
    from zrt_core.strategy import train_spec_defaults

    run_spec = goodput_spec_from_args(args)  # the run's flags, before anything slow
    host = get_plugin_manager()
    use_fusion_rules(host, args)
    hw = host.hardware_spec(args.hw)
    held: frozenset[str] = frozenset()  # the dtypes the --tables rows hold
    if getattr(args, "tables", None):
        from zrt_core.profile.tables import register_tables

        held = register_tables(host, args.tables, hw)
    parallel = parallel_from_args(args)
    global_batch = args.global_batch or args.micro_batch * parallel.dp
    fields: dict[str, Any] = {
        "micro_batch": args.micro_batch, "global_batch": global_batch,
        "seq_len": args.seq_len, "recompute": args.recompute, "zero": args.zero,
        "fsdp": args.fsdp, "optimizer": args.optimizer, "precision": args.precision,
        "offload_optimizer": args.offload_optimizer, "lora_rank": args.lora_rank,
        "lora_modules": args.lora_modules,
        "reshard_after_forward": args.reshard_after_forward, "hsdp": args.hsdp,
        "grad_reduce_in_fp32": args.grad_reduce_in_fp32,
        "quantized_params": args.quantized_params,
        "freeze_language_model": args.freeze_language_model}
    if args.pp_schedule:
        fields["pp_schedule"] = args.pp_schedule
    if args.recompute_modules is not None:
        fields["recompute_modules"] = args.recompute_modules
    train = train_spec_defaults(parallel, **fields)
    stage_split = StageSplit(first_layers=args.decoder_first_pipeline_num_layers,
                             last_layers=args.decoder_last_pipeline_num_layers,
                             layout=args.pipeline_model_parallel_layout,
                             embedding_loss=args.embedding_loss_stages)
    # the config's numbers and the layout, before the estimator (and torch) is imported
    config, where = raw_config(args.model, host)
    from zrt_core.cli.moe_args import mtp_from_args

    config, mtp = mtp_from_args(args, config)
    check_train_request(config, parallel, train, num_gpus=args.num_gpus,
                        stage_split=stage_split, where=where)
    if run_spec is not None:
        from zrt_core.estimate.goodput import checkpoint_gb_per_s

        checkpoint_gb_per_s(hw, run_spec)  # a missing bandwidth before the slow work
    from zrt_core.cli import run_compile
    from zrt_core.estimate.training import default_overlap, estimate_training

    captured = run_compile.captured_for_training(args, args.model, train.micro_batch,
                                                 train.seq_len, host)

    def estimate(parallel: Any, train: Any, num_gpus: int | None = args.num_gpus,
                 keep_timelines: bool = bool(args.out)) -> Any:
        overlap = None
        if args.ep_overlap or args.moe_shared_expert_overlap:
            from attrs import evolve

            overlap = evolve(default_overlap(parallel, train), ep_batch_overlap=args.ep_overlap,
                             ep_async=args.moe_shared_expert_overlap)
        return estimate_training(args.model, hw, parallel, train, host=host, overlap=overlap,
                                 num_gpus=num_gpus, host_link_gb_per_s=args.host_link_gbps,
                                 attention=args.attention, keep_timelines=keep_timelines,
                                 stage_split=stage_split, nvls=not args.no_nvls, mtp=mtp,
                                 captured=captured, price_coverage=True,
                                 use_cache=False if args.no_cache else None)

    if args.gpus is not None:
        from zrt_core.cli.run_scaling import run_weak_scaling

        if run_spec is not None:  # the curve's points are steps; a run is priced at one layout
            from zrt_core.errors import SpecError

            raise SpecError("--tokens / --steps price a run at one GPU count, not a --gpus "
                            "curve", "drop --gpus, or run the chosen point with --dp")

        return run_weak_scaling(args, estimate, parallel, train)
    report = estimate(parallel, train)
    gains = run_compile.compare(args, captured, hw, host)
    if run_spec is not None:
        from attrs import evolve as _evolve

        from zrt_core.estimate.goodput import training_goodput

        report = _evolve(report, goodput=training_goodput(report, hw, run_spec))
    written = write_training_outputs(report, args.out) if args.out else []
    from zrt_core.cli.run_frameworks import emit_run

    if emit_run(args, report, parallel=parallel, train=train, stage_split=stage_split,
                num_gpus=args.num_gpus):
        return 0
    if args.json:
        data = report.to_json()
        if written:
            data["files"] = [str(p) for p in written]
        if gains:
            data["compare_compile"] = [g.to_json() for g in gains]
        print_json(data)
    else:
        from zrt_core.reports.training import render

        con = console()
        render(report, con)
        if getattr(args, "tables", None):
            from zrt_core.cli.coverage_view import print_coverage

            con.print("forward and backward (one micro-batch):")
            print_coverage(con, dict(report.price_coverage), held)
        if gains:
            run_compile.print_gains(gains)
        for path in written:
            con.print(f"wrote {path}")
    return 0


def write_training_outputs(report: Any, out: str) -> list[Path]:
    """``report.html``, ``report.json`` and ``trace.json`` in ``out``."""
    from zrt_core.reports.files import write_training_outputs as write

    return write(report, out_dir(out))


add_mode("train", add_train_args, run_train)
