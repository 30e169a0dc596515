"""Parallel layouts and workloads, and the rules that make a layout valid.

Rank order follows Megatron-LM: TP innermost, then CP, then DP, then PP outermost; EP
groups are carved out of DP×CP (×TP when the expert TP is smaller than TP). A group's
*span* (how many consecutive ranks its members spread over) decides which interconnect
tier carries its traffic: see :meth:`Parallel.span`.

Every violated rule raises :class:`LayoutError` naming the rule and the numbers.
"""

from __future__ import annotations

from typing import Any

from attrs import evolve, field, frozen, validators

from zrt_core.errors import LayoutError, SpecError
from zrt_core.limits import LIMITS, check_count
from zrt_core.modelinfo import ModelDims
from zrt_core.moe_load import ExpertLoad

#: ``op`` is PyTorch's selective checkpointing with torchtitan's op policy (docs/training-
#: model.md, "Recompute by op")
RECOMPUTE = ("none", "selective", "full", "op")
#: Megatron-Core ``TransformerConfig.recompute_modules`` names (r0.14 – r0.18's allowed list),
#: for ``recompute = "selective"`` (docs/training-model.md, "Selective recompute modules")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: Training precisions: ``fp8`` is TransformerEngine's ``DelayedScaling``, ``fp8_cs`` its
#: ``Float8CurrentScaling`` (Megatron ``--fp8-recipe tensorwise``, Megatron-Bridge ``fp8_cs``).
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "fp8_cs", "mxfp8", "nvfp4")
#: Megatron's fused linear layers a LoRA adapter can sit beside (Megatron-Bridge
#: ``LoRA.target_modules``; its default is all four)
LORA_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe", "dualpipev")
OPTIMIZERS = ("adam", "adamw", "muon", "sgd")
QUANT = ("none", "int8", "int4", "fp8", "fp4")
CP_KINDS = ("ring", "ulysses")
#: How MoE tokens cross the EP group: ``alltoall`` (Megatron-Core's
#: ``MoEAlltoAllTokenDispatcher``: one NCCL all-to-all row per (token, expert) pair) or a
#: deduplicating dispatcher — ``deepep`` (DeepEP's kernels) or ``hybridep`` (Megatron-Core's
#: flex dispatcher with HybridEP) — that sends a token once per destination GPU inside a
#: node and once per destination node across nodes (docs/moe-training.md).
EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")


def _count(kind: str, error: type = SpecError):
    """A validator: a positive integer within zrt's limit for ``kind`` (checks.LIMITS);
    anything else is ``error`` naming the field (one line, exit 2 at the CLI)."""

    def check(_inst: Any, attribute: Any, value: Any) -> None:
        check_count(value, attribute.name, kind, error)

    return check


def _one_of(choices: tuple[Any, ...], error: type = SpecError):
    def check(_inst: Any, attribute: Any, value: Any) -> None:
        if (isinstance(value, bool) and not any(isinstance(c, bool) for c in choices)) \
                or value not in choices:
            raise error(f"{attribute.name} must be one of "
                        f"{', '.join(map(str, choices))}, got {value!r}")

    return check


def _text(_inst: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise SpecError(f"{attribute.name} must be a name, got {value!r}",
                        "e.g. bfloat16 or fp8")


def _names(field_name: str, names: tuple[str, ...], example: str):
    """A converter: a comma-separated string or a list of module names as a tuple (None
    stays None); anything else is one line naming ``field_name`` and the allowed names."""

    def convert(value: Any) -> tuple[str, ...] | None:
        if value is None or isinstance(value, tuple):
            return value
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        if isinstance(value, list):
            return tuple(value)
        raise SpecError(f"{field_name} must be a list of module names, got {value!r}",
                        f"e.g. {example}; names: {', '.join(names)}")

    return convert


_modules = _names("recompute_modules", RECOMPUTE_MODULES, "[moe_act, layernorm]")


def _recompute_modules(inst: Any, _attribute: Any, value: Any) -> None:
    if value is None:
        return
    for m in value:
        if m not in RECOMPUTE_MODULES:
            raise SpecError(f"unknown recompute module {m!r}",
                            f"use Megatron-Core's names: {', '.join(RECOMPUTE_MODULES)}")
    if inst.recompute != "selective":
        raise SpecError(f"recompute modules need recompute=selective, not {inst.recompute}",
                        "add --recompute selective, or drop --recompute-modules")


_lora_modules_in = _names("lora_modules", LORA_MODULES, "[linear_qkv]")


def _lora_modules(inst: Any, _attribute: Any, value: Any) -> None:
    if value is None:
        return
    if not value:
        raise SpecError("lora_modules is empty", f"name at least one of {', '.join(LORA_MODULES)}")
    for m in value:
        if m not in LORA_MODULES:
            raise SpecError(f"unknown LoRA target module {m!r}",
                            f"use Megatron's names: {', '.join(LORA_MODULES)}")
    if not inst.lora_rank:
        raise SpecError("LoRA target modules need a LoRA rank",
                        "add --lora-rank R, or drop --lora-modules")


def _flag(_inst: Any, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise SpecError(f"{attribute.name} must be true or false, got {value!r}")


def _reshard(_inst: Any, attribute: Any, value: Any) -> None:
    """PyTorch FSDP2's ``reshard_after_forward``: None (the framework's default), True,
    False or a re-shard group size ≥ 1."""
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, int) or not 1 <= value <= LIMITS["width"]:
        raise SpecError(f"{attribute.name} must be true, false or a group size from 1 to "
                        f"{LIMITS['width']:,}, got {value!r}",
                        "e.g. --reshard-after-forward 8 (re-shard within 8 ranks)")


def _rank(_inst: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= LIMITS["width"]:
        raise SpecError(f"{attribute.name} must be an integer from 0 to {LIMITS['width']:,}, "
                        f"got {value!r}")


_degree = _count("degree", LayoutError)


def _expert_load(value: Any) -> Any:
    """``Parallel.moe_load``: None for balanced routing; a spec's mapping
    (``{imbalance, distribution, redundant}``) becomes an :class:`ExpertLoad`."""
    if isinstance(value, dict):
        value = ExpertLoad(**value)
    return None if value is None or (isinstance(value, ExpertLoad) and value.is_default) \
        else value


@frozen
class Parallel:
    """A parallel layout.

    :param tp: tensor parallel degree.
    :param pp: pipeline stages.
    :param vp: virtual stages per pipeline rank (interleaved schedules).
    :param cp: context parallel degree (sequence split for attention).
    :param ep: expert parallel degree (experts split across ranks).
    :param etp: tensor parallel degree inside an expert; None means ``tp``.
    :param dp: data parallel replicas.
    :param sp: sequence parallel (norms/dropout split along the sequence over TP ranks);
        None means "on when tp > 1" for training (Megatron's default) and off for serving.
    :param cp_kind: ``ring`` or ``ulysses`` context parallelism.
    :param ep_dispatcher: one of :data:`EP_DISPATCHERS`.
    :param moe_load: routing skew and EPLB redundant experts over the EP ranks
        (:class:`~zrt_core.moe_load.ExpertLoad`); None is balanced routing.
    """

    tp: int = field(default=1, validator=_degree)
    pp: int = field(default=1, validator=_degree)
    vp: int = field(default=1, validator=_degree)
    cp: int = field(default=1, validator=_degree)
    ep: int = field(default=1, validator=_degree)
    etp: int | None = field(default=None, validator=validators.optional(_degree))
    dp: int = field(default=1, validator=_degree)
    sp: bool | None = field(default=None, validator=_flag)
    cp_kind: str = field(default="ring", validator=_one_of(CP_KINDS, LayoutError))
    ep_dispatcher: str = field(default="alltoall",
                               validator=_one_of(EP_DISPATCHERS, LayoutError))
    moe_load: ExpertLoad | None = field(
        default=None, validator=validators.optional(validators.instance_of(ExpertLoad)),
        converter=lambda v: _expert_load(v))

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        return self.etp if self.etp is not None else self.tp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert: the ranks of one stage over EP × expert TP."""
        return (self.tp * self.cp * self.dp) // (self.ep * self.expert_tp)

    def sequence_parallel(self, training: bool) -> bool:
        if self.sp is not None:
            return self.sp and self.tp > 1
        return training and self.tp > 1

    def span(self, group: str) -> tuple[int, int]:
        """``(group size, span)`` of a group: its member count and how many consecutive
        ranks they spread over (Megatron order: tp, cp, dp, pp; ep inside dp×cp)."""
        sizes = {
            "tp": (self.tp, self.tp),
            "cp": (self.cp, self.tp * self.cp),
            "dp": (self.dp, self.tp * self.cp * self.dp),
            # The gradient all-reduce of dense weights runs over DP×CP together.
            "dp_cp": (self.dp * self.cp, self.tp * self.cp * self.dp),
            "ep": (self.ep, self.expert_tp * self.ep),
            "etp": (self.expert_tp, self.expert_tp),
            "edp": (self.expert_dp, self.tp * self.cp * self.dp),
            "pp": (self.pp, self.world_size),
        }
        try:
            return sizes[group]
        except KeyError:
            raise LayoutError(f"unknown parallel group {group!r}",
                              f"use one of {', '.join(sizes)}") from None

    def describe(self) -> str:
        parts = [f"{k}{v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("vp", self.vp),
                                        ("cp", self.cp), ("ep", self.ep), ("dp", self.dp))
                 if v > 1]
        if self.etp is not None and self.etp != self.tp:
            parts.append(f"etp{self.etp}")
        return "-".join(parts) or "single-device"

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "vp": self.vp, "cp": self.cp, "ep": self.ep,
                "etp": self.expert_tp, "dp": self.dp, "sp": self.sp, "cp_kind": self.cp_kind,
                "ep_dispatcher": self.ep_dispatcher,
                **({"moe_load": self.moe_load.to_json()} if self.moe_load else {})}


@frozen
class TrainSpec:
    """One training step's workload and recipe."""

    micro_batch: int = field(validator=_count("batch"))
    global_batch: int = field(validator=_count("batch"))
    seq_len: int = field(validator=_count("tokens"))
    recompute: str = field(default="none", validator=_one_of(RECOMPUTE))
    #: under ``selective``: the Megatron-Core modules re-run in the backward (None: its
    #: default, ``["core_attn"]``; ``()`` re-runs nothing)
    recompute_modules: tuple[str, ...] | None = field(
        default=None, converter=_modules, validator=_recompute_modules)
    zero: int = field(default=0, validator=_one_of((0, 1, 2, 3)))
    fsdp: bool = field(default=False, validator=_flag)
    optimizer: str = field(default="adamw", validator=_one_of(OPTIMIZERS))
    precision: str = field(default="bf16", validator=_one_of(PRECISIONS))
    pp_schedule: str = field(default="1f1b", validator=_one_of(PP_SCHEDULES))
    offload_optimizer: bool = field(default=False, validator=_flag)
    #: LoRA fine-tuning: frozen base weights and adapters of this rank on every decoder
    #: linear layer (:mod:`zrt_core.transforms.lora`); 0 trains every weight
    lora_rank: int = field(default=0, validator=_rank)
    #: the linear layers that carry an adapter (:data:`LORA_MODULES`); None: all four
    lora_modules: tuple[str, ...] | None = field(
        default=None, converter=_lora_modules_in, validator=_lora_modules)
    #: FSDP2's ``reshard_after_forward``: True frees the gathered parameters after each
    #: layer's forward (gathered again for backward), False keeps them until backward, an
    #: int N keeps a 1/N shard for backward; None is the framework's default (docs/fsdp.md)
    reshard_after_forward: bool | int | None = field(default=None, validator=_reshard)
    #: HSDP: shard over groups of this many data-parallel ranks, replicate across the
    #: groups (None: shard over all of dp)
    hsdp: int | None = field(default=None, validator=validators.optional(_count("degree")))
    #: Megatron's ``grad_reduce_in_fp32`` (DDP's main-gradient buffer): True keeps and
    #: reduces fp32 gradients (Megatron-LM's default for bf16); False keeps them in the
    #: parameters' 16-bit dtype (Megatron-Bridge's performance recipes)
    grad_reduce_in_fp32: bool = field(default=True, validator=_flag)
    #: Megatron's ``fp8_param`` / ``fp8_param_gather``: under an fp8-family recipe the
    #: decoder layers' weights live only in TransformerEngine's quantized storage (no 16-bit
    #: copy beside it; the fp32 master copy is the optimizer's)
    quantized_params: bool = field(default=False, validator=_flag)
    #: Megatron-Bridge's ``freeze_language_model``: the decoder's weights do not train (no
    #: weight-gradient GEMMs, gradient reduction or optimizer states for them); activation
    #: gradients still run back through every layer to a trainable module before them (the
    #: vision projection of a VLM whose language model is frozen)
    freeze_language_model: bool = field(default=False, validator=_flag)

    def num_microbatches(self, parallel: Parallel) -> int:
        return self.global_batch // (self.micro_batch * parallel.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "micro_batch", "global_batch", "seq_len", "recompute", "recompute_modules", "zero",
            "fsdp", "optimizer", "precision", "pp_schedule", "offload_optimizer", "lora_rank",
            "lora_modules", "reshard_after_forward", "hsdp", "grad_reduce_in_fp32",
            "quantized_params",
            "freeze_language_model")}


@frozen
class InferSpec:
    """A serving workload: prompts of ``input_len`` tokens producing ``output_len`` tokens.

    :param batch: a static batch: its prompts prefilled together, then decoded together (a
        latency benchmark); None asks for in-flight batching (offline max-throughput, as
        ``trtllm-bench`` and vLLM's throughput benchmark run, or ``concurrency``).
    :param concurrency: closed-loop clients that keep this many requests in flight on the
        engine's in-flight batching, each sending its next request when one completes
        (vLLM's ``benchmark_serving --max-concurrency``, SGLang's ``bench_serving
        --max-concurrency``, ``genai-perf --concurrency``, ``trtllm-bench --concurrency``):
        the max-throughput steady state with at most this many sequences running, spread
        over the data-parallel replicas. None: as many as the engine holds. Not with
        ``batch``.
    :param quant: weight (and for fp8/fp4, activation) quantisation; "none" keeps ``dtype``.
    :param kv_dtype: the KV-cache dtype; None follows the activation dtype.
    :param shared_expert_overlap: the shared experts run on their own stream beside the
        routed path's EP all-to-all (SGLang's and TensorRT-LLM's DeepSeek MoE;
        ``--moe-shared-expert-overlap``); default off, every kernel back to back.
    :param num_requests: the requests an offline max-throughput benchmark serves, all
        queued at once (``trtllm-bench``'s dataset); the throughput then includes the
        set's ramp-up and drain (docs/inference-model.md). None: the steady state.
    """

    input_len: int = field(validator=_count("tokens"))
    output_len: int = field(validator=_count("tokens"))
    batch: int | None = field(default=None, validator=validators.optional(_count("batch")))
    quant: str = field(default="none", validator=_one_of(QUANT))
    dtype: str = field(default="bfloat16", validator=_text)
    kv_dtype: str | None = field(default=None, validator=_text)
    shared_expert_overlap: bool = field(default=False, validator=validators.instance_of(bool))
    num_requests: int | None = field(default=None,
                                     validator=validators.optional(_count("batch")))
    concurrency: int | None = field(default=None,
                                    validator=validators.optional(_count("batch")))

    def __attrs_post_init__(self) -> None:
        if self.batch is not None and self.concurrency is not None:
            raise SpecError(f"batch {self.batch} and concurrency {self.concurrency} both "
                            "given: a static batch has no clients in flight",
                            "give batch for a latency benchmark (prompts prefilled "
                            "together) or concurrency for closed-loop clients on in-flight "
                            "batching, not both")

    def to_json(self) -> dict[str, Any]:
        return {"input_len": self.input_len, "output_len": self.output_len, "batch": self.batch,
                "quant": self.quant, "dtype": self.dtype, "kv_dtype": self.kv_dtype,
                **({"shared_expert_overlap": True} if self.shared_expert_overlap else {}),
                **({"num_requests": self.num_requests} if self.num_requests else {}),
                **({"concurrency": self.concurrency} if self.concurrency else {})}


def train_spec_defaults(parallel: Parallel, **fields: Any) -> TrainSpec:
    """A :class:`TrainSpec` with Megatron's defaults for what is not given (vp > 1 →
    interleaved)."""
    spec = TrainSpec(**fields)
    if parallel.vp > 1 and spec.pp_schedule == "1f1b":
        spec = evolve(spec, pp_schedule="interleaved")
    return spec


def serving_expert_tp(parallel: Parallel, *, moe: bool) -> Parallel:
    """The layout with the serving engines' expert TP where it is unset (a model without
    experts, ``moe`` false, keeps its layout as given).

    Serving engines carve the expert groups out of the ranks that run attention, so the
    experts span every GPU of the instance: TensorRT-LLM's ``Mapping`` sets ``moe_tp_size``
    to ``tp_size // moe_ep_size`` when only the EP size is given (``trtllm-bench --tp 8 --ep
    8``: experts not split), SGLang's ``moe_ep_rank = tp_rank // (tp_size // ep_size)``
    likewise, vLLM's ``--enable-expert-parallel`` spreads the experts over TP × DP. Without
    EP the experts still span the instance: vLLM's expert layers "by default form a tensor
    parallel group of size DP × TP" (its data-parallel deployment guide), as TensorRT-LLM's
    MoE does under attention DP. So an unset expert TP is tp × dp / ep (the layout the
    serving search enumerates), not Megatron's training default (the attention TP); a set
    one, or an ep that does not divide tp × dp, is left as given.
    """
    if not moe or parallel.etp is not None or (parallel.ep == 1 and parallel.dp == 1):
        return parallel
    ranks = parallel.tp * parallel.dp
    if ranks % parallel.ep:
        return parallel
    return evolve(parallel, etp=ranks // parallel.ep)


def check_layout(
    parallel: Parallel,
    dims: ModelDims,
    *,
    num_gpus: int | None = None,
    train: TrainSpec | None = None,
) -> Parallel:
    """Check a layout against the model (and the step); return it with ``sp`` resolved.

    :raises LayoutError: naming the first rule that fails.
    """
    p = parallel
    if num_gpus is not None and p.world_size != num_gpus:
        raise LayoutError(
            f"tp × cp × pp × dp = {p.tp} × {p.cp} × {p.pp} × {p.dp} = {p.world_size}, "
            f"but the run has {num_gpus} GPUs",
            "choose degrees whose product is the GPU count",
        )
    if p.moe_load is not None:
        p.moe_load.check(dims.experts, p.ep)
    _divides(p.tp, dims.heads, "tp", "attention heads (num_attention_heads)")
    if dims.kv_heads % p.tp and p.tp % dims.kv_heads:
        raise LayoutError(
            f"tp={p.tp} neither divides the {dims.kv_heads} KV heads (num_key_value_heads) "
            "nor is a multiple of them (for replicated KV heads)",
            "pick a tp that divides num_key_value_heads",
        )
    if dims.ffn:
        _divides(p.tp, dims.ffn, "tp", "FFN width (intermediate_size)")
    if dims.o_groups:  # DeepSeek-V4's grouped output projection: whole groups per rank
        _divides(p.tp, dims.o_groups, "tp", "output-projection groups (o_groups)")
    if dims.mamba_heads:  # Mamba-2 mixers split by heads, B and C by their groups
        _divides(p.tp, dims.mamba_heads, "tp", "Mamba heads (mamba_num_heads)")
        _divides(p.tp, dims.mamba_groups or 1, "tp", "Mamba groups (n_groups)")
    if dims.is_moe:
        _divides(p.ep, dims.experts, "ep", "routed experts")
        _divides(p.expert_tp, dims.moe_ffn, "expert tp", "expert FFN width (moe_intermediate_size)")
        if (p.tp * p.cp * p.dp) % (p.ep * p.expert_tp):
            raise LayoutError(
                f"ep × expert tp = {p.ep} × {p.expert_tp} must divide tp × cp × dp = "
                f"{p.tp * p.cp * p.dp} (expert groups are carved out of the data-parallel ranks)",
                "lower ep or raise dp",
            )
    elif p.ep > 1:
        raise LayoutError(f"ep={p.ep} but the model has no routed experts", "use ep=1")
    if p.cp > 1 and p.cp_kind == "ulysses":
        # Ulysses trades the sequence split for a heads split inside attention
        _divides(p.cp, dims.heads // p.tp, "cp", "attention heads per TP rank (Ulysses)")
    stages = p.pp * p.vp
    if dims.layers % stages:
        raise LayoutError(
            f"pp × vp = {p.pp} × {p.vp} = {stages} does not divide the {dims.layers} layers",
            "choose pp and vp so that layers split evenly into stages",
        )
    if p.vp > 1 and p.pp == 1:
        raise LayoutError("vp > 1 needs pp > 1 (virtual stages interleave pipeline ranks)",
                          "set --pp or drop --vp")
    if train is not None:
        # Megatron-Core splits the sequence into 2 × cp chunks for ring attention (rank r
        # holds chunks r and 2·cp − 1 − r, balancing the causal mask:
        # get_batch_on_this_cp_rank); all-to-all (Ulysses) splits it into cp parts
        chunks = 2 * p.cp if p.cp_kind == "ring" else p.cp
        if p.cp > 1 and train.seq_len % chunks:
            split = f"2 × cp = {chunks} chunks" if p.cp_kind == "ring" else f"{chunks} parts"
            raise LayoutError(f"cp={p.cp} ({p.cp_kind}) splits the sequence into {split}, "
                              f"which do not divide seq_len={train.seq_len}",
                              f"choose a sequence length that is a multiple of {chunks}, "
                              "or another cp")
        per_step = train.micro_batch * p.dp
        if train.global_batch % per_step:
            raise LayoutError(
                f"global batch {train.global_batch} is not divisible by micro-batch × dp = "
                f"{train.micro_batch} × {p.dp} = {per_step}",
                "make the global batch a multiple of micro-batch × dp",
            )
        microbatches = train.num_microbatches(p)
        if p.pp > microbatches:
            raise LayoutError(
                f"pp={p.pp} pipeline stages but only {microbatches} micro-batch"
                f"{'es' if microbatches > 1 else ''} per pipeline (global batch "
                f"{train.global_batch} / (micro-batch {train.micro_batch} × dp {p.dp})): "
                "the pipeline never fills",
                f"raise the global batch to at least {p.pp * per_step} or lower pp")
        if p.vp > 1 and train.num_microbatches(p) % p.pp:
            raise LayoutError(
                f"interleaved pipelining needs the {train.num_microbatches(p)} micro-batches "
                f"to be a multiple of pp={p.pp}",
                "adjust the global batch or micro-batch",
            )
        # ZeRO shards over the data-parallel ranks (dp × cp in Megatron's distributed
        # optimizer); with one there is nothing to shard. Stage 1 is Megatron's distributed
        # optimizer and zrt run's default, legal there (a note in the report); asking for
        # gradient or parameter sharding with nothing to shard over is a mistake
        if (train.zero >= 2 or train.fsdp) and p.dp * p.cp == 1:
            what = "FSDP" if train.fsdp else f"ZeRO-{train.zero}"
            raise LayoutError(
                f"{what} shards over the data-parallel ranks, but dp × cp = 1: nothing "
                "would be sharded", "raise dp, or use zero 0 or 1 without fsdp")
        from zrt_core.fsdp import sharding_plan

        sharding_plan(p, train)  # --hsdp / --reshard-after-forward against the layout
    sp = p.sequence_parallel(training=train is not None)
    return evolve(p, sp=sp)


def _divides(degree: int, size: int, name: str, what: str) -> None:
    if size % degree:
        raise LayoutError(
            f"{name}={degree} does not divide the {size} {what}",
            f"choose {name} among the divisors of {size}",
        )
