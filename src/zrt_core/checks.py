"""Checks of the user's numbers before any slow work: a config's sizes and types, the
workload's lengths and batches, and the layout's divisibility — from the numbers alone, no
torch (docs/input-checks.md). Every front door calls these first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import evolve

from zrt_core.errors import LayoutError, ModelError, SpecError
from zrt_core.limits import (  # noqa: F401  (re-exported: the checks' public names)
    LIMITS,
    SCHEDULES,
    _check_name,
    _show,
    check_count,
    check_schedule,
    virtual_stages,
)
from zrt_core.modelinfo import (
    _EXPERTS,
    _FFN,
    _HEADS,
    _HIDDEN,
    _KV_HEADS,
    _LAYERS,
    _MOE_FFN,
    _TOP_K,
    _VOCAB,
    ModelDims,
    text_config,
)

if TYPE_CHECKING:
    from zrt_core.strategy import Parallel, TrainSpec

# config keys → (kind of limit, must be positive); a key that is present must be an integer
_SIZE_KEYS: dict[str, str] = {
    **{k: "width" for k in (*_HIDDEN, *_FFN, *_MOE_FFN)},
    **{k: "layers" for k in _LAYERS},
    **{k: "heads" for k in (*_HEADS, *_KV_HEADS)},
    **{k: "vocab" for k in _VOCAB},
    **{k: "experts" for k in (*_EXPERTS, *_TOP_K)},
    "head_dim": "head_dim", "kv_lora_rank": "width", "q_lora_rank": "width",
    "qk_rope_head_dim": "head_dim", "qk_nope_head_dim": "head_dim", "v_head_dim": "head_dim",
    "shared_expert_intermediate_size": "width", "moe_shared_expert_intermediate_size": "width",
    "mamba_num_heads": "heads", "mamba_head_dim": "head_dim", "n_groups": "heads",
    "ssm_state_size": "width", "conv_kernel": "width", "sliding_window": "tokens",
    "max_position_embeddings": "tokens", "n_positions": "tokens", "moe_layer_freq": "layers",
    "decoder_sparse_step": "layers", "interleave_moe_layer_step": "layers",
    "attention_chunk_size": "tokens", "o_groups": "heads",
}
# keys where 0 is a real setting (none of them, or "off"), still bounded and integral
_ZERO_OK: dict[str, str] = {
    "n_shared_experts": "experts", "num_shared_experts": "experts",
    "first_k_dense_replace": "layers", "num_nextn_predict_layers": "layers",
    "moe_num_shared_experts": "experts",
}
# (a key set to null is "not used": q_lora_rank of V2-Lite, sliding_window of Mistral v0.3)
# keys that hold a mapping when present
_MAPPING_KEYS = ("quantization_config", "rope_scaling", "rope_parameters", "text_config")


def check_config(config: Mapping[str, Any], *, where: str = "config") -> ModelDims:
    """Check a config mapping's numbers; return its :class:`ModelDims`.

    A size field that is present must be an integer within :data:`LIMITS` (positive, or
    non-negative for counts where 0 means none); heads must divide the hidden size unless
    ``head_dim`` is given, key/value heads must divide the attention heads, experts per token
    must lie in ``1..experts``, Mamba groups must divide the Mamba heads.

    :raises ModelError: the first field that fails, named with its value and the rule.
    """
    if not isinstance(config, Mapping):
        raise ModelError(f"{where}: a config must be a mapping, got {type(config).__name__}",
                         "pass a config.json mapping")
    for key in _MAPPING_KEYS:
        value = config.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ModelError(f"{where}: {key} must be a mapping, got {_show(value)}",
                             f"fix or remove {key} in config.json")
    cfg = text_config(config)
    for key, kind in _SIZE_KEYS.items():
        if key == "sliding_window" and cfg.get("use_sliding_window") is False and \
                cfg.get(key) == 0:
            continue  # Qwen2-MoE's saved configs: the window is off and its size 0
        _integer(cfg, key, kind, where, minimum=1)
    for key, kind in _ZERO_OK.items():
        _integer(cfg, key, kind, where, minimum=0)
    try:
        dims = ModelDims.from_config(config)
    except (TypeError, ValueError, OverflowError) as exc:  # a list where a number belongs
        raise ModelError(f"{where}: a model dimension cannot be read ({exc})",
                         "fix the field in config.json") from None
    except ModelError as exc:
        raise ModelError(f"{where}: {exc.message}", exc.hint) from None
    _check_dims(dims, cfg, where)
    return dims


def _integer(cfg: Mapping[str, Any], key: str, kind: str, where: str, *, minimum: int) -> None:
    value = cfg.get(key)
    if value is None:
        return
    if isinstance(value, list | tuple) and value and all(v == value[0] for v in value):
        value = value[0]  # one value per layer, all alike (HunYuan's moe_intermediate_size)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelError(f"{where}: {key} must be an integer, got {_show(value)}",
                         f"fix {key} in config.json")
    limit = LIMITS[kind]
    if value < minimum:
        rule = "positive" if minimum == 1 else "0 or more"
        raise ModelError(f"{where}: {key} must be {rule}, got {value}",
                         f"fix {key} in config.json")
    if value > limit:
        raise ModelError(f"{where}: {key} = {_show(value)} is beyond any real model (zrt's "
                         f"limit for {kind} is {limit:,})", f"fix {key} in config.json")


def _check_dims(dims: ModelDims, cfg: Mapping[str, Any], where: str) -> None:
    mla = dims.kv_lora_rank > 0
    if cfg.get("head_dim") is None and not mla and dims.hidden % dims.heads:
        raise ModelError(f"{where}: {dims.heads} attention heads do not divide hidden size "
                         f"{dims.hidden} (and no head_dim is given)",
                         "fix num_attention_heads or hidden_size, or give head_dim")
    if dims.kv_heads > dims.heads:
        raise ModelError(f"{where}: {dims.kv_heads} key/value heads outnumber the "
                         f"{dims.heads} attention heads",
                         "num_key_value_heads must be at most num_attention_heads")
    if dims.heads % dims.kv_heads:
        raise ModelError(f"{where}: {dims.kv_heads} key/value heads do not divide the "
                         f"{dims.heads} attention heads (each KV head serves a whole group)",
                         "num_key_value_heads must divide num_attention_heads")
    if dims.experts:
        top_k = dims.top_k or None
        if top_k is not None and top_k > dims.experts:
            raise ModelError(f"{where}: {top_k} experts per token but only {dims.experts} "
                             "experts", "num_experts_per_tok must be at most the expert count")
    if dims.mamba_heads and dims.mamba_groups and dims.mamba_heads % dims.mamba_groups:
        raise ModelError(f"{where}: n_groups={dims.mamba_groups} does not divide the "
                         f"{dims.mamba_heads} Mamba heads", "fix n_groups or mamba_num_heads")


def position_limit(config: Mapping[str, Any]) -> int | None:
    """Tokens a sequence may hold: ``max_position_embeddings`` (``n_positions``), stretched
    by a RoPE scaling factor (YaRN, linear, dynamic, llama3) over its original length; None
    when the config sets no limit (ALiBi models)."""
    cfg = text_config(config)
    limit = cfg.get("max_position_embeddings") or cfg.get("n_positions")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    for key in ("rope_scaling", "rope_parameters"):
        scaling = cfg.get(key)
        if isinstance(scaling, Mapping):
            factor = scaling.get("factor")
            original = scaling.get("original_max_position_embeddings") or limit
            if isinstance(factor, int | float) and not isinstance(factor, bool) and \
                    isinstance(original, int) and math.isfinite(factor) and factor > 1:
                limit = max(limit, int(original * factor))
    return limit


def check_tokens(config: Mapping[str, Any], tokens: int, what: str, *,
                 where: str = "config") -> None:
    """A sequence of ``tokens`` (``what`` names it) fits the model's positions and zrt's
    limit.

    :raises ModelError: naming the length and the limit.
    """
    cap = LIMITS["tokens"]
    if tokens > cap:
        raise ModelError(f"{what} ({_show(tokens)} tokens) is beyond any real model (zrt's "
                         f"limit is {cap:,})", "use a real sequence length")
    limit = position_limit(config)
    if limit is not None and tokens > limit:
        raise ModelError(f"{what} ({tokens:,} tokens) exceeds {where}'s {limit:,} positions "
                         "(max_position_embeddings, with any RoPE scaling)",
                         "shorten the sequence, or use a config that supports it")


def check_train_request(config: Mapping[str, Any], parallel: Any, train: Any, *,
                        num_gpus: int | None = None, stage_split: Any = "even",
                        layout: bool = True, positions: bool = True,
                        where: str = "config") -> ModelDims:
    """Everything a training estimate can check before capturing: the config, the sequence
    against the positions, the layout against the model and the step
    (:func:`zrt_core.strategy.check_layout`) and the pipeline schedule
    (:func:`zrt_core.schedule.pipeline.check_schedule`), as the estimator checks them.

    :param stage_split: a :class:`zrt_core.schedule.stages.StageSplit` or its name
        (``even``, ``embedding-loss``, ``auto``): how Megatron-Core splits the layers.
    :param layout: False when the layout is still to be searched (only the model and the
        workload are checked).
    :param positions: check the sequence against the config's positions (False for a
        config completed with a library's defaults: a capture's, which holds limits the user
        never stated).
    """
    from zrt_core.strategy import TrainSpec

    _check_parallel(parallel)
    if not isinstance(train, TrainSpec):
        raise SpecError(f"train must be a zrt_core.strategy.TrainSpec, got {_show(train)}",
                        "pass TrainSpec(micro_batch=..., global_batch=..., seq_len=...)")
    dims = check_config(config, where=where)
    check_mixers_modelled(config, where=where)
    check_tokens(config if positions else {}, train.seq_len, "a training sequence",
                 where=where)
    if layout:
        from zrt_core.strategy import check_layout

        schedule = _schedule_name(parallel, train)
        vp = parallel.vp if schedule == "interleaved" else 1
        stages = virtual_stages(schedule, parallel.pp, vp)
        from zrt_core.schedule.stages import plan_stages

        # the split Megatron-Core would build, refused as the estimator refuses it
        plan_stages(dims.layers, stages, parallel.pp, stage_split,
                    mtp_depths=_mtp_layers(text_config(config)),
                    rank_major=schedule not in ("zb-v", "dualpipev"))
        layout_dims = _dims_for_layout(dims, stages, dims.layers)
        checked = check_layout(parallel, layout_dims, num_gpus=num_gpus, train=train)
        check_schedule(schedule, parallel.pp, vp, train.num_microbatches(checked))
    return dims


def check_infer_request(config: Mapping[str, Any], parallel: Any, infer: Any, *,
                        positions: bool = True, where: str = "config") -> ModelDims:
    """Everything a serving estimate can check before capturing: the config, prompt plus
    output against the positions, and the layout against the model (an unset expert TP as
    the serving engines take it: :func:`zrt_core.strategy.serving_expert_tp`)."""
    from zrt_core.strategy import InferSpec, check_layout, serving_expert_tp

    _check_parallel(parallel)
    if not isinstance(infer, InferSpec):
        raise SpecError(f"infer must be a zrt_core.strategy.InferSpec, got {_show(infer)}",
                        "pass InferSpec(input_len=..., output_len=...)")
    dims = check_config(config, where=where)
    check_mixers_modelled(config, where=where)
    tokens = infer.input_len + infer.output_len
    check_tokens(config if positions else {}, tokens,
                 f"a sequence of {infer.input_len} prompt + {infer.output_len} output tokens",
                 where=where)
    check_layout(serving_expert_tp(parallel, moe=dims.is_moe), dims)
    return dims


def layout_notes(parallel: Any, train: Any) -> list[str]:
    """What a legal but idle setting means, for the report: ZeRO-1 (Megatron's distributed
    optimizer, ``zrt run``'s default) over one data-parallel rank shards nothing."""
    if train.zero == 1 and not train.fsdp and parallel.dp * parallel.cp == 1:
        return ["zero=1 with dp × cp = 1: the distributed optimizer has no data-parallel "
                "rank to shard over, so every device holds all optimizer states (Megatron "
                "accepts this; raise dp to shard them)"]
    return []


def _check_parallel(parallel: Any) -> None:
    from zrt_core.strategy import Parallel

    if not isinstance(parallel, Parallel):
        raise LayoutError(f"parallel must be a zrt_core.strategy.Parallel, got "
                          f"{_show(parallel)}", "pass Parallel(tp=..., dp=...)")


def check_hardware_arg(hardware: Any) -> None:
    """The ``hardware`` argument of the estimators: an id or a spec."""
    from zrt_core.hardware import HardwareSpec

    if not isinstance(hardware, str | HardwareSpec):
        raise SpecError(f"hardware must be a hardware id or a HardwareSpec, got "
                        f"{_show(hardware)}", "`zrt hw list` shows the ids")


def _schedule_name(parallel: Parallel, train: TrainSpec) -> str:
    schedule = train.pp_schedule
    if parallel.vp > 1 and schedule == "1f1b":
        return "interleaved"
    if parallel.pp == 1 and schedule in ("interleaved",):
        return "1f1b"
    return schedule


#: Families whose token mixers zrt does not model yet: their capture runs transformers'
#: reference code for them (slow-path scans, per-chunk loops) and the analytic count leaves
#: them out, so estimates refuse them with this reason (:func:`check_mixers_modelled`) before
#: capturing, and the FLOP check names it should a capture get that far.
MIXERS_NOT_MODELLED = {
    "jamba": "Jamba's Mamba-1 mixers",
    "zamba2": "Zamba2's shared attention blocks",
    "lfm2": "LFM2's short-convolution blocks",
    "lfm2_moe": "LFM2's short-convolution blocks",
    "recurrent_gemma": "RecurrentGemma's RG-LRU blocks",
    "kimi_linear": "Kimi Linear's delta attention (KDA)",
    "minimax": "MiniMax's lightning attention",
}


def mixers_not_modelled(config: Mapping[str, Any], where: str, why: str) -> ModelError | None:
    """The one-line refusal of a family in :data:`MIXERS_NOT_MODELLED` (``why``: what its
    capture runs instead), None for any other family."""
    family = str(text_config(config).get("model_type") or config.get("model_type") or "")
    if family not in MIXERS_NOT_MODELLED:
        return None
    return ModelError(f"{where}: zrt does not model {MIXERS_NOT_MODELLED[family]} yet ({why}), "
                      "so no prediction is made",
                      "a model patch routing them to one kernel node (as zrt.mamba_kernels "
                      "does for Mamba-2) and their analytic count would add the family")


def check_mixers_modelled(config: Mapping[str, Any], *, where: str = "config") -> None:
    """Refuse a family in :data:`MIXERS_NOT_MODELLED` before an estimate captures it."""
    error = mixers_not_modelled(config, where, "its capture would run transformers' reference "
                                "code for them")
    if error is not None:
        raise error


#: Keys by which a config declares the MTP layers Megatron-Bridge's recipes train with it
#: (DeepSeek's ``num_nextn_predict_layers``, Megatron's ``mtp_num_layers``).
TRAINED_MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_layers")
#: Keys of a checkpoint's MTP head, which serving can draft with: also Qwen3.5's
#: ``mtp_num_hidden_layers`` (whether its training recipes train it is not published; a
#: record's pipeline layout says so when they do).
MTP_HEAD_KEYS = (*TRAINED_MTP_KEYS, "mtp_num_hidden_layers")


def _first_count(config: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    cfg = text_config(config)
    return int(next((cfg[k] for k in keys if cfg.get(k)), 0))


def _mtp_layers(config: Mapping[str, Any]) -> int:
    """MTP layers a training run trains with this config."""
    return _first_count(config, TRAINED_MTP_KEYS)


def mtp_head_layers(config: Mapping[str, Any]) -> int:
    """MTP layers a checkpoint of this config carries (serving's draft head)."""
    return _first_count(config, MTP_HEAD_KEYS)


def _dims_for_layout(dims: ModelDims, stages: int, num_layers: int) -> ModelDims:
    """``check_layout`` requires pp × vp to divide the layers; an uneven split that Megatron
    accepts (:func:`zrt_core.schedule.stages.plan_stages`) was already
    checked, so the layer rule is checked against a count it divides."""
    if num_layers % stages == 0:
        return dims
    return evolve(dims, layers=stages * max(1, num_layers // stages))
