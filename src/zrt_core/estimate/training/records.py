"""Validation records: a record's training case (``case_from_record``), its estimate, and the
search for a Megatron layout when the record gives none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import evolve, field, frozen

from zrt_core.errors import LayoutError, ModelError
from zrt_core.estimate.training.capture import TrainingCapture
from zrt_core.estimate.training.estimator import (
    FULL_CUDA_GRAPH_RECIPES,
    FUSED_CROSS_ENTROPY_SOURCES,
    NO_NVLS_SOURCES,
    NO_TP_COMM_OVERLAP_MODELS,
    NO_TP_COMM_OVERLAP_RECIPES,
    SYNC_TP_BACKWARD_SOURCES,
    TP_ONLY_AMAX_SOURCES,
    default_overlap,
    estimate_training,
    legacy_overlap,
)
from zrt_core.estimate.training.spec import (
    USABLE_MEMORY_FRACTION,
    MtpSpec,
    _ro,
    mtp_from_config,
    source_attention,
    source_recompute,
)
from zrt_core.reports.training import TrainingReport
from zrt_core.schedule.scheduler import OverlapRules
from zrt_core.schedule.stages import StageSplit
from zrt_core.strategy import Parallel, TrainSpec

if TYPE_CHECKING:
    from zrt_core.capture.api import CaptureResult
    from zrt_core.modelinfo import ModelDims
    from zrt_core.plugins import PluginHost


@frozen
class TrainingCase:
    """The inputs of one estimate, as read from a validation record (SCHEMA.md) with
    Megatron-LM / NeMo defaults for what the record leaves null; ``assumptions`` lists each
    default that was taken."""

    config: Mapping[str, Any] = field(converter=_ro)
    hardware: str
    parallel: Parallel
    train: TrainSpec
    overlap: OverlapRules
    num_gpus: int
    attention: str = "flash"
    stage_split: str | StageSplit = "even"
    zero_algorithm: str | None = None
    assumptions: tuple[str, ...] = ()
    #: the source published no layout (tp, pp, cp, vp and dp all null): :func:`estimate_case`
    #: runs :func:`search_layout` instead of the placeholder ``parallel``
    layout_search: bool = False
    #: (first, last) decoder layers whose linear layers stay bf16 under an fp8/fp4 recipe
    bf16_layers: tuple[int, int] = (0, 0)
    #: multi-token prediction the recipe trains (:func:`mtp_from_config`)
    mtp: MtpSpec | None = None
    #: the loss kernels (``fused`` or ``megatron``)
    cross_entropy: str = "fused"
    #: fp8 delayed scaling's amax-reduction group (``dp_tp``, ``tp``, ``none``)
    amax_reduction: str = "dp_tp"
    #: MoE layers drop and pad tokens to capacity (no routing-count sync to the host)
    moe_token_drop: bool = False
    #: ``none`` (eager) or ``full`` (whole layers as CUDA graphs)
    cuda_graph: str = "none"
    #: NCCL may use NVLink SHARP (False: the launcher sets ``NCCL_NVLS_ENABLE=0``)
    nvls: bool = True


#: Share of the decoder layers, the last ones, whose linear layers NVIDIA's NVFP4 training
#: recipe keeps in BF16: about 15% of the linear layers ("Pretraining Large Language Models
#: with NVFP4", NVIDIA 2025), taken as Nemotron 3 Super's 14 of 88 — the rule for an
#: ``nvfp4`` record of a source whose recipe zrt has not read.
NVFP4_BF16_TAIL = 14 / 88
#: Megatron-Bridge's performance recipes: the generic ``nvfp4`` precision
#: (``get_precision_config`` → ``bf16_with_nvfp4_mixed``, whose ``MixedPrecisionConfig`` keeps
#: ``first_last_layers_bf16 = False``) quantises every layer; only these models' recipes keep
#: their last layers in bf16: Nemotron 3 Super (``nemotron_3_super_bf16_with_nvfp4_mixed``,
#: ``num_layers_at_end_in_bf16 = 14``, v0.4.0 onwards) and GPT-OSS 20B
#: (``perf_recipes/gpt_oss/common.py``, ``_gpt_oss_20b_nvfp4_precision``: 4).
MBRIDGE_NVFP4_BF16_END = {"nemotron_3_super": 14, "gpt_oss_20b": 4}
#: Megatron-Bridge perf-config models trained with Muon: Kimi K2's
#: (``scripts/performance/configs/kimi/kimi_llm_pretrain.py``, v0.4.0 onwards:
#: ``optimizer_type: str = "muon"``, the summaries' note "Muon optimizer was used for
#: pre-training Kimi-K2").
MBRIDGE_MUON_MODELS = ("kimi_k2",)


#: Megatron-Bridge releases whose perf configs run TransformerEngine's fused loss
#: (``cross_entropy_fusion_impl = "te"``: each 25.09 ``scripts/performance/configs/*.yaml``,
#: ``utils/helpers.py`` in v0.2.0, ``utils/overrides.py`` from v0.3.0 to v0.5.0) in a container
#: whose TE keeps the gradient in the logits (``ctx.save_for_backward(inp.detach())`` up to
#: TE 2.17; TE 2.9 in 25.11, 2.12 in 26.02, 2.14 in 26.04, 2.16 in 26.06:
#: ``docs/releases/software-versions.md``). 26.08's container TE is not listed at the
#: bundled snapshot, and its Nemotron-H recipes switch to the native kernel: ``fused``.
MBRIDGE_TE_INPLACE_LOSS = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01",
                           "26.06", "26.06.01")


def _mbridge_model(record: Mapping[str, Any]) -> str | None:
    """The Megatron-Bridge perf-config key of a record's model name (None if unknown)."""
    from zrt_core.recipes import model_key

    return model_key(str((record.get("model") or {}).get("name", "")))


#: Sources whose runs used Megatron-LM as of 2021-22, before overlapped gradient reduction,
#: parameter gathers and TP userbuffers existed.
LEGACY_MEGATRON_SOURCES = ("Narayanan et al. 2021", "Korthikanti et al. 2022")

#: DeepSeek's own pre-training runs, as their reports describe them (HAI-LLM, not Megatron):
#: a record whose source is the report takes the report's schedule, dispatch and overlap for
#: the fields the schema has no column for.
#:
#: - DeepSeek-V3 Technical Report (arXiv 2412.19437) §3.2: DualPipe over 16 pipeline ranks,
#:   whose paired forward and backward chunks hide the expert-parallel all-to-all; DeepSeek's
#:   own node-limited dispatch and combine kernels (at most 4 nodes per token; DeepEP is
#:   their open release); "Recomputation of RMSNorm and MLA Up-Projection".
#: - DeepSeek-V2 (arXiv 2405.04434) §3.1.4: zero-bubble pipeline parallelism over 16 ranks,
#:   8-way expert parallelism inside a node, shared experts' computation overlapped with the
#:   expert all-to-all.
DEEPSEEK_REPORTS: tuple[tuple[tuple[str, ...], Mapping[str, Any]], ...] = (
    (("DeepSeek-V3 Technical Report", "2412.19437"),
     {"pp_schedule": "dualpipe", "ep_dispatcher": "deepep", "ep_batch_overlap": True,
      "recompute_modules": ("layernorm", "mla_up_proj"),
      "why": "the DeepSeek-V3 report: DualPipe, node-limited dispatch (DeepEP), the "
             "all-to-all hidden under the paired chunks, RMSNorm and MLA up-projection "
             "recomputed"}),
    (("DeepSeek-V2", "2405.04434"),
     {"pp_schedule": "zb-h1", "ep_async": True,
      "why": "the DeepSeek-V2 report: zero-bubble pipeline, shared experts overlapped with "
             "the expert all-to-all"}),
)


def deepseek_report(source: str) -> Mapping[str, Any] | None:
    """The published setup of a DeepSeek report's run (:data:`DEEPSEEK_REPORTS`), or None for
    any other source (a Megatron run of a DeepSeek model is Megatron's)."""
    if "Megatron" in source or "NVIDIA" in source:
        return None
    return next((setup for keys, setup in DEEPSEEK_REPORTS if any(k in source for k in keys)),
                None)


#: (model name part, hardware or ``*``) whose Megatron-Bridge fp8 perf configs turn
#: ``fp8_param_gather`` off, where the library's ``bf16_with_fp8_current_scaling_mixed`` /
#: ``bf16_with_mxfp8_mixed`` (every release) turn it on: DeepSeek-V3 on H100
#: (perf_recipes/deepseek/h100/deepseek_v3.py), Kimi K2 (configs/kimi/kimi_llm_pretrain.py).
FP8_PARAM_OFF = (("deepseek", "nvidia_h100_sxm"), ("kimi", "*"))


#: What a record's notes say of a token-drop MoE run (Megatron-Bridge 25.09's
#: ``apply_moe_token_drop``: capacity factor 1, padded to capacity).
TOKEN_DROP_NOTE = "Token-drop MoE run"


def case_from_record(record: Mapping[str, Any]) -> TrainingCase:
    """Read a ``workload: train`` validation record (../shared/validation/SCHEMA.md).

    Null fields take Megatron-LM / NeMo defaults (docs/training-model.md): dp =
    GPUs / (tp × cp × pp); sequence parallelism on when tp > 1; the distributed optimizer
    (ZeRO-1); no FSDP; the recipe's recompute (Megatron-Bridge records), else none;
    micro-batch 1; bf16; expert TP = TP; 1F1B, interleaved
    when vp > 1; AdamW. Overlap flags: Megatron-Core's (:func:`default_overlap`), except
    for runs of Megatron-LM as published in 2021-22 (:func:`legacy_overlap`).

    :raises ModelError: the record is not a training record or lacks what cannot default.
    """
    if record.get("workload") != "train":
        raise ModelError(f"record {record.get('id')!r} is not a training record",
                         "only workload: train records have a training step")
    rid = record.get("id", "?")
    try:
        config = record["model"]["hf_config"]
        hardware = record["hardware"]
        num_gpus = int(record["num_gpus"])
        seq_len = int(record["seq_len"])
        global_batch = int(record["global_batch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"record {rid}: missing or bad field {exc}",
                         "see ../shared/validation/SCHEMA.md") from None
    raw = dict(record.get("parallel") or {})
    assumptions: list[str] = []
    layout_search = all(raw.get(k) is None for k in ("tp", "pp", "cp", "vp", "dp"))

    def take(key: str, default: Any, why: str) -> Any:
        value = raw.get(key)
        if value is None:
            assumptions.append(f"{key}={default} ({why})")
            return default
        return value

    tp = int(take("tp", 1, "not published"))
    pp = int(take("pp", 1, "not published"))
    left = 1  # with dp published and cp not: what the GPU count leaves over tp × pp × dp
    if raw.get("dp") and num_gpus % (tp * pp * int(raw["dp"])) == 0:
        left = num_gpus // (tp * pp * int(raw["dp"]))
    cp = int(take("cp", left, "not published" if left == 1 else "GPUs / (tp × pp × dp)"))
    vp = int(take("vp", 1, "no interleaving stated"))
    ep = int(take("ep", 1, "not published"))
    if raw.get("dp") is None:
        dp = max(1, num_gpus // (tp * pp * cp))
        assumptions.append(f"dp={dp} (GPUs / (tp × cp × pp))")
    else:
        dp = int(raw["dp"])
    etp = raw.get("etp")
    if etp is None and ep > 1:
        etp = 1
        assumptions.append("etp=1 (NeMo / Megatron-Bridge MoE recipes: experts are not "
                           "tensor-parallel)")
    sp = raw.get("sp")
    if sp is None and tp > 1:
        assumptions.append("sp on (Megatron/NeMo default with tp > 1)")
    zero = raw.get("zero")
    if zero is None:
        zero = 1
        assumptions.append("zero=1 (distributed optimizer)")
    fsdp = bool(raw.get("fsdp") or False)
    source = str(record.get("source", ""))
    recipe = record_recipe(record)
    if recipe is None and "Megatron-Bridge" in source:
        _note_layout_conflict(record, assumptions)
    elif recipe is not None and recipe.gbs != record.get("global_batch"):
        assumptions.append(f"{_recipe_name(recipe)} (global batch {recipe.gbs}) run at the "
                           f"printed global batch {record.get('global_batch')} (the perf "
                           "launcher's --global_batch_size)")
    report = deepseek_report(source)
    dispatcher = record_dispatcher(record, recipe, assumptions)
    if report is not None and ep > 1 and "ep_dispatcher" in report \
            and raw.get("ep_dispatcher") is None:
        dispatcher = str(report["ep_dispatcher"])
    parallel = Parallel(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=int(etp) if etp else None,
                        dp=dp, sp=None if sp is None else bool(sp), ep_dispatcher=dispatcher)
    recompute = record.get("recompute")
    recompute_modules = None
    if report is not None and report.get("recompute_modules") \
            and recompute in (None, "selective"):
        recompute, recompute_modules = "selective", tuple(report["recompute_modules"])
    elif recompute is None:
        recompute, recompute_modules = record_recompute(recipe, assumptions)
    else:
        recompute = source_recompute(source, str(recompute), assumptions)
    micro_batch = record.get("micro_batch")
    if micro_batch is None:
        micro_batch = 1
        assumptions.append("micro_batch=1")
    precision = record.get("precision")
    if precision is None:
        precision = "bf16"
        assumptions.append("precision=bf16 (16-bit mixed precision)")
    precision = str(precision).lower()  # as serving records are read: FP8 is fp8
    lora_rank = _lora_rank(record, assumptions)
    lora_modules = _lora_modules(record, lora_rank, assumptions)
    if fsdp and pp == 1:
        # Megatron-FSDP (Megatron-Bridge's FSDP rows, all without a pipeline): parameters
        # released after forward and gathered again for backward, FSDP2's
        # reshard_after_forward=True — zrt's --fsdp default without a pipeline
        assumptions.append("FSDP as Megatron-FSDP and FSDP2 run it without a pipeline: "
                           "parameters re-gathered for backward, gradients reduce-scattered "
                           "every micro-batch (docs/fsdp.md)")
    elif int(zero) == 3:
        assumptions.append("ZeRO-3 as DeepSpeed runs it: parameters re-gathered for "
                           "backward, gradients reduce-scattered every micro-batch "
                           "(docs/fsdp.md)")
    train = TrainSpec(micro_batch=int(micro_batch), global_batch=global_batch,
                      seq_len=seq_len, recompute=str(recompute),
                      recompute_modules=recompute_modules, zero=int(zero), fsdp=fsdp,
                      optimizer="adamw", precision=str(precision),
                      pp_schedule="interleaved" if vp > 1 else "1f1b", lora_rank=lora_rank,
                      lora_modules=lora_modules)
    mlperf_lora = bool(lora_rank) and "MLPerf Training" in source
    if mlperf_lora and precision in ("fp8", "nvfp4"):
        train = evolve(train, quantized_params=True)
        assumptions.append("frozen base weights stored quantized, cast never per step "
                           "(NVIDIA's MLPerf LoRA: fp8 builds the model under "
                           "te.fp8_model_init, custom_llama.py; nvfp4 quantizes it once "
                           "before training, PRE_QUANTIZED_MODEL=True)")
    if "Megatron-Bridge" in source and _mbridge_model(record) in MBRIDGE_MUON_MODELS:
        train = evolve(train, optimizer="muon")
        assumptions.append("Muon optimizer (Megatron-Bridge's Kimi K2 perf configs: "
                           "optimizer_type='muon', dist_muon)")
    if report is not None and pp > 1 and vp == 1:
        schedule = str(report["pp_schedule"])
        microbatches = train.num_microbatches(parallel)
        if schedule == "dualpipe" and (pp % 2 or microbatches % 2):
            # DualPipe feeds half the micro-batches from each end: an odd pp or count
            # cannot run it, so such a layout is priced as 1F1B
            assumptions.append(f"1F1B, not the report's DualPipe: pp {pp} and "
                               f"{microbatches} micro-batches are not both even")
        else:
            train = evolve(train, pp_schedule=schedule)
    if _frozen_language_model(record, source, assumptions):
        train = evolve(train, freeze_language_model=True)
    if "Megatron-Bridge" in source and precision not in ("fp16", "fp32"):
        # every release's performance configs (scripts/performance, perf_recipes/_common.py
        # _benchmark_common): cfg.ddp.grad_reduce_in_fp32 = False
        train = evolve(train, grad_reduce_in_fp32=False)
        assumptions.append("bf16 gradient buffer and reduction (Megatron-Bridge performance "
                           "recipes: ddp.grad_reduce_in_fp32=False)")
        model = str((record.get("model") or {}).get("name", "")).lower()
        if precision in ("fp8", "fp8_cs", "mxfp8") and not any(
                m in model and h in (hardware, "*") for m, h in FP8_PARAM_OFF):
            train = evolve(train, quantized_params=True)
            assumptions.append("fp8 weights without a bf16 copy (Megatron-Bridge's fp8 "
                               "mixed-precision recipes: fp8_param_gather=True)")
    attention = "flash"
    if any(s in source for s in LEGACY_MEGATRON_SOURCES):
        attention = "unfused"
        assumptions.append("2021-22 attention kernels (no FlashAttention)")
    else:
        attention = source_attention(source, assumptions)
    zero_algorithm = None
    legacy_zero3 = any(s in source for s in LEGACY_MEGATRON_SOURCES) and int(zero) == 3
    if legacy_zero3:
        zero_algorithm = "pairwise"
        assumptions.append("DeepSpeed ZeRO-3 of 2021: parameter gathers and gradient "
                           "reduce-scatters at one scale-out link per GPU, each gather "
                           "queued behind the reduce-scatters before it")
    if any(s in source for s in LEGACY_MEGATRON_SOURCES) and int(zero) != 3:
        sync_tp = any(s in source for s in SYNC_TP_BACKWARD_SOURCES)
        overlap = legacy_overlap(tp_backward_async=not sync_tp)
        assumptions.append("Megatron-LM of 2021-22: no overlapped grad reduction, param "
                           "gather or TP userbuffers"
                           + ("; the backward TP all-reduce blocking (before "
                              "--async-tensor-model-parallel-allreduce)" if sync_tp else ""))
    else:
        overlap = default_overlap(parallel, train)
        if legacy_zero3:
            # DeepSpeed before mid-2021 (Narayanan et al.'s runs): "each all_gather calls
            # torch.cuda.synchronize() to guarantee previous communication op to be
            # completed" (deepspeedai/DeepSpeed PR #1188; issues #1069, #1174), so a
            # backward's prefetched gather waits for the reduce-scatter issued before it
            overlap = evolve(overlap, gather_behind_reduce=True)
        notes = str(record.get("notes", ""))
        if overlap.tp_comm_overlap > 0 and (
                any(r in notes for r in NO_TP_COMM_OVERLAP_RECIPES)
                or (recipe is not None and recipe.model in NO_TP_COMM_OVERLAP_MODELS)):
            overlap = evolve(overlap, tp_comm_overlap=0.0)
            assumptions.append("no TP userbuffer overlap (the recipe sets no comm_overlap: "
                               "forward TP/SP collectives block)")
        if report is not None and ep > 1 and (report.get("ep_batch_overlap")
                                              or report.get("ep_async")):
            overlap = evolve(overlap, ep_batch_overlap=bool(report.get("ep_batch_overlap")),
                             ep_async=bool(report.get("ep_async")))
        if report is not None:
            assumptions.append(f"{report['why']} ({train.pp_schedule} schedule, "
                               f"{dispatcher} dispatch)")
        if recipe is not None and recipe.moe_a2a_overlap and ep > 1:
            overlap = evolve(overlap, ep_batch_overlap=True)
            assumptions.append("EP all-to-all overlapped across micro-batches "
                               f"(overlap_moe_expert_parallel_comm, {_recipe_name(recipe)})")
    try:
        from zrt_core.modelinfo import ModelDims

        layers = ModelDims.from_config(config).layers
    except ModelError:
        layers = 0
    from zrt_core.recipes import release_of

    cross_entropy = "fused"
    if not any(s in source for s in FUSED_CROSS_ENTROPY_SOURCES):
        cross_entropy = "megatron"
        assumptions.append("cross-entropy unfused (Megatron-LM / NeMo default before "
                           "--cross-entropy-loss-fusion; Megatron-Bridge recipes fuse it)")
    elif "Megatron-Bridge" in source and release_of(source) in MBRIDGE_TE_INPLACE_LOSS:
        cross_entropy = "te_inplace"
        assumptions.append("fused loss as TransformerEngine's kernel up to TE 2.17 "
                           "(cross_entropy_fusion_impl='te' in the release's perf configs): "
                           "the gradient kept in the 16-bit logits")
    amax_reduction = "dp_tp"
    if any(s in source for s in TP_ONLY_AMAX_SOURCES):
        amax_reduction = "tp"
        assumptions.append("fp8 amax reduction over TP only (tp_only_amax_red)")
    mtp = mtp_from_config(config)
    stage_split = _record_stage_split(raw, layers, pp, vp, assumptions, recipe)
    if report is not None and stage_split == "auto":
        stage_split = _report_stage_split(layers, pp, vp, mtp.depths if mtp else 0,
                                          assumptions)
    if mtp is None and isinstance(stage_split, StageSplit) and stage_split.layout:
        # the run's own layout places MTP layers (m) the config does not declare (Qwen3-Next
        # and Qwen3.5 keep theirs out of transformers' config): the layout is what ran
        from zrt_core.errors import ZrtError
        from zrt_core.schedule.stages import parse_layout

        try:
            depths = "".join(parse_layout(stage_split.layout)).count("m")
        except ZrtError:
            depths = 0  # plan_stages gives the layout's own error
        if depths:
            config = {**config, "num_nextn_predict_layers": depths}
            mtp = mtp_from_config(config)
            assumptions.append(f"multi-token prediction trained: {depths} MTP layer(s) of the "
                               "last layer kind, as the pipeline layout places them (the "
                               "config declares none)")
    elif mtp is not None:
        assumptions.append(f"multi-token prediction trained: {mtp.depths} depth(s) of "
                           f"{'+'.join(mtp.kinds) or 'the last layer kind'} (the config's "
                           "num_nextn_predict_layers; Megatron-Bridge recipes)")
    bf16_layers = (0, 0)
    if str(precision) == "nvfp4" and layers:
        if "MLPerf Training" in source:
            bf16_layers = (0, 0)
            why = ("NVIDIA's MLPerf Training NVFP4 configs: first_last_layers_bf16 off, "
                   "num_layers_at_start/end_in_bf16 0")
        elif "Megatron-Bridge" in source:
            key = _mbridge_model(record)
            bf16_layers = (0, min(layers, MBRIDGE_NVFP4_BF16_END.get(str(key), 0)))
            why = ("Megatron-Bridge's recipe for this model: num_layers_at_end_in_bf16"
                   if bf16_layers[1] else "Megatron-Bridge's nvfp4 recipe, "
                   "bf16_with_nvfp4_mixed: first_last_layers_bf16 off")
        else:
            bf16_layers = (0, round(layers * NVFP4_BF16_TAIL))
            why = "NVIDIA's NVFP4 recipe: about 15% of the layers, the last ones"
        assumptions.append(f"nvfp4: the last {bf16_layers[1]} of {layers} layers keep bf16 "
                           f"linear layers ({why})")
    moe_token_drop = TOKEN_DROP_NOTE in str(record.get("notes", "")) or bool(
        recipe is not None and recipe.moe_pad_expert_input_to_capacity)
    if moe_token_drop:
        assumptions.append("MoE token drop padded to capacity (moe_pad_expert_input_to_capacity:"
                           " no routing-count sync to the host)")
    cuda_graph = "none"
    name = str((record.get("model") or {}).get("name", ""))
    if any(s in source and m == name and hardware in hws
           for s, m, hws in FULL_CUDA_GRAPH_RECIPES) or (
            recipe is not None and _whole_graphs(recipe)):
        cuda_graph = "full"
        assumptions.append("whole layers as CUDA graphs (the recipe's enable_cuda_graph)")
    # NVIDIA's MLPerf Llama 2 70B LoRA configs export NCCL_NVLS_ENABLE=1 (config_common.sh,
    # training_results_v5.0 and v5.1), unlike its other LLM benchmarks
    nvls = mlperf_lora or not any(s in source for s in NO_NVLS_SOURCES)
    if not nvls:
        assumptions.append("NCCL_NVLS_ENABLE=0 (the source's launcher: no NVLink SHARP)")
    if layout_search:
        assumptions = [a for a in assumptions if not a.startswith(("tp=", "pp=", "cp=", "vp=",
                                                                   "dp=", "sp on"))]
        assumptions.append("layout not published: the fastest feasible Megatron layout "
                           "(search_layout: tp within the NVLink domain dividing the heads, "
                           "pp dividing the layers, dp the rest, the global batch divisible, "
                           "memory within capacity)")
    return TrainingCase(config=config, hardware=str(hardware), parallel=parallel, train=train,
                        overlap=overlap, num_gpus=num_gpus, attention=attention,
                        stage_split=stage_split, zero_algorithm=zero_algorithm,
                        assumptions=tuple(assumptions), layout_search=layout_search,
                        bf16_layers=bf16_layers, mtp=mtp, cross_entropy=cross_entropy,
                        amax_reduction=amax_reduction, moe_token_drop=moe_token_drop,
                        cuda_graph=cuda_graph, nvls=nvls)


def _note_layout_conflict(record: Mapping[str, Any], assumptions: list[str]) -> None:
    """Say so when the release's perf config runs another layout than the record prints
    (:func:`zrt_core.recipes.layout_conflict`); the printed layout is still the one priced."""
    from zrt_core.recipes import layout_conflict

    other = layout_conflict(record)
    if other is None:
        return
    tp, pp, vp, cp, ep = other.layout
    assumptions.append(
        f"the release's perf config ({other.provenance_tag} {other.provenance_file}) runs tp "
        f"{tp}, pp {pp}, vp {vp}, cp {cp}, ep {ep}, micro-batch {other.mbs} at this GPU count "
        "and batch, not the printed layout: priced as printed")


def record_recipe(record: Mapping[str, Any]) -> Any:
    """The Megatron-Bridge perf recipe a record was measured with (:mod:`zrt_core.recipes`:
    the release's config read from its source), or None for other sources and records
    whose published layout no config of their release has."""
    if "Megatron-Bridge" not in str(record.get("source", "")):
        return None
    from zrt_core.recipes import lookup

    return lookup(record)


def record_dispatcher(record: Mapping[str, Any], recipe: Any, assumptions: list[str]) -> str:
    """The MoE token dispatcher of a record's run: ``parallel.ep_dispatcher`` when the record
    states it (zrt's extension of the schema), else its recipe's (Megatron-Core's flex
    dispatcher with a DeepEP or HybridEP backend), else Megatron-Core's ``alltoall``."""
    raw = dict(record.get("parallel") or {})
    value = raw.get("ep_dispatcher")
    if value is not None:
        return str(value)
    if recipe is not None and recipe.moe_token_dispatcher_type == "flex" \
            and recipe.moe_flex_dispatcher_backend in ("deepep", "hybridep"):
        assumptions.append(f"EP dispatch: flex + {recipe.moe_flex_dispatcher_backend} "
                           f"({_recipe_name(recipe)})")
        return str(recipe.moe_flex_dispatcher_backend)
    return "alltoall"


def record_recompute(recipe: Any, assumptions: list[str]
                     ) -> tuple[str, tuple[str, ...] | None]:
    """A record's activation recompute when it states none: its recipe's
    ``recompute_granularity`` / ``recompute_modules`` (``selective`` with no list is
    Megatron-Core's default, ``["core_attn"]``), else none (Megatron-Core's default
    granularity, ``None``). Modules zrt does not model are named and left out."""
    from zrt_core.strategy import RECOMPUTE_MODULES

    if recipe is None or recipe.recompute_granularity != "selective":
        why = ""
        if recipe is not None and "recompute_granularity" in recipe.recipe_defaults:
            why = " (the recipe leaves recompute_granularity to a provider default not " \
                  "resolved: taken as Megatron-Core's None)"
        assumptions.append(f"recompute=none{why}")
        return "none", None
    mods = recipe.recompute_modules
    if mods is None:
        assumptions.append(f"recompute=selective, Megatron-Core's default modules [core_attn] "
                           f"({_recipe_name(recipe)})")
        return "selective", None
    kept = tuple(m for m in mods if m in RECOMPUTE_MODULES)
    dropped = [m for m in mods if m not in RECOMPUTE_MODULES]
    assumptions.append(f"recompute=selective [{', '.join(kept)}] ({_recipe_name(recipe)})"
                       + (f"; not modelled: {', '.join(dropped)}" if dropped else ""))
    return "selective", kept


def _whole_graphs(recipe: Any) -> bool:
    """The recipe replays whole layers or the whole iteration as CUDA graphs: Megatron-Core's
    ``cuda_graph_impl = "full_iteration"``, or ``"local"`` graphs of whole layers (no scope,
    or the ``full_iteration`` one). Scoped TransformerEngine graphs (``attn``,
    ``moe_router``...) leave the experts eager: not whole."""
    impl = recipe.cuda_graph_impl
    scope = tuple(recipe.cuda_graph_scope or ())
    return impl == "full_iteration" or (impl == "local" and scope in ((), ("full_iteration",)))


def _recipe_name(recipe: Any) -> str:
    return f"Megatron-Bridge {recipe.provenance_tag} {recipe.provenance_config}"


#: Record fields (under ``parallel``) that give the pipeline split, by Megatron's argument
#: names: ``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``,
#: ``--pipeline-model-parallel-layout``.
STAGE_SPLIT_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                      "pipeline_model_parallel_layout")


def _record_stage_split(raw: Mapping[str, Any], layers: int, pp: int, vp: int,
                        assumptions: list[str], recipe: Any = None) -> str | StageSplit:
    """The split a record gives (:data:`STAGE_SPLIT_FIELDS`), else its Megatron-Bridge
    recipe's ``pipeline_model_parallel_layout``, else Megatron's even split, else ``auto``
    (the embedding and loss counted, else the balanced layout: the estimate notes which)."""
    first, last, layout = (raw.get(k) for k in STAGE_SPLIT_FIELDS)
    if first is None and last is None and layout is None and recipe is not None \
            and recipe.pipeline_model_parallel_layout and pp * vp > 1:
        layout = recipe.pipeline_model_parallel_layout
        assumptions.append(f"pipeline layout {layout} ({_recipe_name(recipe)})")
    if first is not None or last is not None or layout is not None:
        try:
            return StageSplit(first_layers=None if first is None else int(first),
                              last_layers=None if last is None else int(last),
                              layout=None if layout is None else str(layout))
        except (TypeError, ValueError) as exc:
            raise LayoutError(f"bad pipeline split in the record ({exc})",
                              "give integer layer counts or a layout string") from None
    if layers and layers % (pp * vp):
        assumptions.append(f"{layers} layers over pp × vp = {pp * vp} stages, no split "
                           "published: Megatron-Core's embedding/loss accounting, else the "
                           "balanced layout (the estimate's notes say which)")
        return "auto"
    return "even"


def _report_stage_split(layers: int, pp: int, vp: int, mtp_depths: int,
                        assumptions: list[str]) -> str | StageSplit:
    """A DeepSeek report's run over stages Megatron-Core's rules cannot split (DeepSeek-V2's
    60 layers over 16 ranks): their framework places layers itself, taken as the balanced
    layout (:func:`~zrt_core.schedule.stages.balanced_layout`); else ``auto``."""
    from zrt_core.schedule.stages import auto_splits, balanced_layout

    if not auto_splits(layers, pp, vp, mtp_depths):
        layout = balanced_layout(layers, pp * vp, mtp_depths)
        if layout is not None:
            assumptions.append(f"pipeline layout {layout}: the report's framework places "
                               "layers itself; taken as the balanced layout")
            return StageSplit(layout=layout)
    return "auto"


#: Megatron-Bridge's Qwen3-VL pre-training recipes, which every Qwen3-VL performance recipe
#: builds on (``recipes/qwen_vl/h100/qwen3_vl.py``, ``qwen3_vl_*_pretrain_mock_config``:
#: ``freeze_language_model=True``, ``freeze_vision_model=True``; Megatron-Bridge@067f987d):
#: only the vision projection trains. Its Qwen3.5-VL recipes train both (``common.py``).
_FROZEN_LM_FAMILIES = frozenset({"qwen3_vl", "qwen3_vl_moe"})


def _frozen_language_model(record: Mapping[str, Any], source: str,
                           assumptions: list[str]) -> bool:
    """Whether the record's language model is frozen: its ``freeze_language_model`` field,
    else the Megatron-Bridge Qwen3-VL pre-training recipes' setting."""
    given = record.get("freeze_language_model")
    if given is not None:
        return bool(given)
    config = (record.get("model") or {}).get("hf_config") or {}
    if "Megatron-Bridge" not in source or config.get("model_type") not in _FROZEN_LM_FAMILIES:
        return False
    assumptions.append("language and vision models frozen, only the vision projection trains "
                       "(Megatron-Bridge Qwen3-VL pre-training recipes: "
                       "freeze_language_model=True, freeze_vision_model=True); the vision "
                       "tower's forward is not priced")
    return True


def _lora_rank(record: Mapping[str, Any], assumptions: list[str]) -> int:
    """The LoRA rank of a fine-tuning record: its ``peft`` field (``lora``, or a mapping with
    ``method: lora`` and ``rank``), else ``lora`` as a token of its id (the Megatron-Bridge
    LoRA rows) at Megatron-Bridge's default rank; 0 for full training."""
    from zrt_core.transforms.lora import DEFAULT_LORA_RANK

    peft = record.get("peft")
    source = str(record.get("source", ""))
    if isinstance(peft, Mapping):
        if str(peft.get("method", "lora")).lower() != "lora":
            raise ModelError(f"record {record.get('id')}: peft method {peft.get('method')!r} "
                             "is not modelled", "only LoRA (peft: lora) is")
        return int(peft.get("rank") or DEFAULT_LORA_RANK)
    if isinstance(peft, str) and peft.lower() not in ("none", ""):
        if peft.lower() != "lora":
            raise ModelError(f"record {record.get('id')}: peft {peft!r} is not modelled",
                             "only LoRA (peft: lora) is")
        return DEFAULT_LORA_RANK
    if peft is None and "lora" in str(record.get("id", "")).lower().split("-"):
        if "MLPerf Training" in source:
            assumptions.append(f"LoRA fine-tuning (the id says lora): rank {MLPERF_LORA_RANK} "
                               "adapters, base weights frozen (NVIDIA's MLPerf Llama 2 70B "
                               "LoRA configs: adapter_dim 16)")
            return MLPERF_LORA_RANK
        assumptions.append(f"LoRA fine-tuning (the id says lora): rank {DEFAULT_LORA_RANK} "
                           "adapters, base weights frozen (Megatron-Bridge's LoRA default "
                           "rank)")
        return DEFAULT_LORA_RANK
    return 0


#: NVIDIA's MLPerf Training Llama 2 70B LoRA submissions: rank 16 on the attention's
#: linear layers (v4.0 ``megatron_gpt_peft_tuning_config.yaml``: ``adapter_dim`` 16,
#: ``target_modules: ['attention']``; v5.0 ``train.py``: ``LoRA(dim=16,
#: target_modules=["linear_proj", "linear_qkv"])``; mlcommons/training_results_v4.0, v5.0).
MLPERF_LORA_RANK = 16
MLPERF_LORA_MODULES = ("linear_qkv", "linear_proj")


def _lora_modules(record: Mapping[str, Any], rank: int, assumptions: list[str]
                  ) -> tuple[str, ...] | None:
    """The linear layers a LoRA record's adapters sit beside: its ``peft.target_modules``,
    else Megatron-Bridge's performance configs' (every LoRA perf config from v0.3.0
    overrides ``cfg.peft.target_modules = ["linear_qkv"]``,
    ``scripts/performance/configs/llama*/llama3_llm_finetune.py``), else all four (the
    library's ``LoRA`` default); None for full training."""
    if not rank:
        return None
    peft = record.get("peft")
    if isinstance(peft, Mapping) and peft.get("target_modules") is not None:
        return tuple(peft["target_modules"])
    source = str(record.get("source", ""))
    if "Megatron-Bridge" in source:
        assumptions.append("LoRA adapters on linear_qkv only (Megatron-Bridge's LoRA perf "
                           "configs: peft.target_modules = ['linear_qkv'])")
        return ("linear_qkv",)
    if "MLPerf Training" in source:
        assumptions.append("LoRA adapters on linear_qkv and linear_proj (NVIDIA's MLPerf "
                           "LoRA configs)")
        return MLPERF_LORA_MODULES
    assumptions.append("LoRA adapters on linear_qkv, linear_proj, linear_fc1 and linear_fc2 "
                       "(Megatron-Bridge's LoRA default target_modules)")
    return None


def estimate_case(case: TrainingCase, *, host: PluginHost | None = None,
                  captured: TrainingCapture | CaptureResult | None = None,
                  **options: Any) -> TrainingReport:
    """:func:`estimate_training` with every input a :class:`TrainingCase` carries (layout,
    recipe, overlap rules, attention kernels, stage split, ZeRO collectives); ``options``
    adds or overrides keyword arguments (``keep_timelines=True``, a hardware spec...)."""
    if case.layout_search:
        return search_layout(case, host=host, captured=captured, **options)
    kwargs: dict[str, Any] = {
        "host": host, "captured": captured, "overlap": case.overlap,
        "num_gpus": case.num_gpus, "attention": case.attention,
        "stage_split": case.stage_split, "zero_algorithm": case.zero_algorithm,
        "bf16_layers": case.bf16_layers, "mtp": case.mtp,
        "cross_entropy": case.cross_entropy, "amax_reduction": case.amax_reduction,
        "moe_token_drop": case.moe_token_drop, "cuda_graph": case.cuda_graph,
        "nvls": case.nvls, "attention_fallback": True}
    hardware = options.pop("hardware", case.hardware)
    kwargs.update(options)
    return estimate_training(case.config, hardware, case.parallel, case.train, **kwargs)


#: Largest tensor-parallel degree :func:`search_layout` tries: Megatron users keep TP inside
#: an 8-GPU board even on larger NVLink domains (TE userbuffers and the TP collectives of
#: every layer), and no published recipe goes beyond it.
MAX_SEARCH_TP = 8


def layout_candidates(dims: ModelDims, num_gpus: int, global_batch: int, micro_batch: int,
                      nvlink_domain: int | None, *, usable_bytes: float | None = None
                      ) -> list[Parallel]:
    """The Megatron layouts a user of the framework could run for an unpublished layout:
    ``tp`` a divisor of the attention heads (and of the KV heads or a multiple of them, and
    of the FFN width) within the NVLink domain and at most :data:`MAX_SEARCH_TP`; ``pp`` a
    divisor of the layers; ``dp = GPUs / (tp × pp)`` whole, with the global batch a multiple
    of ``micro_batch × dp`` and at least ``pp`` micro-batches; no context or expert
    parallelism, no interleaving. With
    ``usable_bytes``, layouts whose weights, fp32 gradients and sharded AdamW states alone
    exceed it (a lower bound on what a rank holds: ``P / (tp·pp) · (2 + 4 + 12/dp)``, with
    ``P`` counted without gated FFNs or biases) are left out."""
    top = min(MAX_SEARCH_TP, nvlink_domain or MAX_SEARCH_TP)
    params = dims.layers * (dims.hidden * (dims.heads + 2 * dims.kv_heads) * dims.head_dim
                            + dims.heads * dims.head_dim * dims.hidden
                            + 2 * dims.hidden * max(dims.ffn, dims.moe_ffn)) \
        + dims.vocab * dims.hidden
    out = []
    for tp in range(1, top + 1):
        if dims.heads % tp or (dims.kv_heads % tp and tp % dims.kv_heads) or \
                (dims.ffn and dims.ffn % tp) or num_gpus % tp:
            continue
        for pp in range(1, dims.layers + 1):
            if dims.layers % pp or num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if global_batch % (micro_batch * dp) or global_batch // (micro_batch * dp) < pp:
                continue
            if usable_bytes is not None and \
                    params / (tp * pp) * (2 + 4 + 12 / dp) > usable_bytes:
                continue
            out.append(Parallel(tp=tp, pp=pp, dp=dp))
    return out


def search_layout(case: TrainingCase, *, host: PluginHost | None = None,
                  captured: TrainingCapture | CaptureResult | None = None,
                  **options: Any) -> TrainingReport:
    """Estimate a record whose source did not publish its layout: every candidate of
    :func:`layout_candidates` with the case's recipe (1F1B, Megatron-Core's overlap flags),
    and the fastest one that fits in memory (the fastest of all, noted as not fitting, when
    none does). The report's ``parallel`` is the chosen layout and its notes say how many
    were tried."""
    from zrt_core.errors import ZrtError
    from zrt_core.modelinfo import ModelDims

    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    hardware = options.pop("hardware", case.hardware)
    hw = host.hardware_spec(hardware) if isinstance(hardware, str) else hardware
    dims = ModelDims.from_config(case.config)
    usable = hw.memory.capacity_gb * 2.0 ** 30 * USABLE_MEMORY_FRACTION
    tier0 = hw.interconnect[0].devices if hw.interconnect else None
    candidates = layout_candidates(dims, case.num_gpus, case.train.global_batch,
                                   case.train.micro_batch, tier0, usable_bytes=usable)
    if not candidates:
        raise LayoutError(
            f"no Megatron layout of {case.num_gpus} GPUs divides the model and the global "
            f"batch of {case.train.global_batch}",
            "publish the layout in the record (parallel.tp, pp, dp)")
    best: TrainingReport | None = None
    tried = 0
    for par in candidates:
        train = evolve(case.train, pp_schedule="1f1b")
        try:
            report = estimate_training(
                case.config, hw, par, train, host=host, captured=captured,
                overlap=default_overlap(par, train), num_gpus=case.num_gpus,
                attention=case.attention, zero_algorithm=case.zero_algorithm,
                bf16_layers=case.bf16_layers, mtp=case.mtp,
                cross_entropy=case.cross_entropy, amax_reduction=case.amax_reduction,
                moe_token_drop=case.moe_token_drop, cuda_graph=case.cuda_graph,
                nvls=case.nvls, attention_fallback=True, **options)
        except ZrtError:
            continue
        tried += 1
        key = (not report.feasible, report.step_time_s)
        if best is None or key < (not best.feasible, best.step_time_s):
            best = report
    if best is None:
        raise LayoutError(f"none of the {len(candidates)} candidate layouts could be estimated")
    p = best.parallel
    note = (f"layout not published: searched {tried} Megatron layouts of {case.num_gpus} GPUs "
            f"(tp ≤ {min(MAX_SEARCH_TP, tier0 or MAX_SEARCH_TP)} dividing the heads, pp "
            f"dividing the layers, dp the rest); the fastest that fits: tp {p.tp} × pp {p.pp} "
            f"× dp {p.dp}")
    return evolve(best, notes=(note, *best.notes))
