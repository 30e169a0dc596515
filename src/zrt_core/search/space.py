"""The layouts a search tries: the dimensions of a training or a serving space, and the
validity rules that remove candidates before anything is estimated (each counted by name).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from attrs import field, frozen

from zrt_core.errors import LayoutError, SpecError
from zrt_core.modelinfo import ModelDims
from zrt_core.strategy import PP_SCHEDULES, PRECISIONS, QUANT, RECOMPUTE, Parallel

#: Degrees a dimension takes when the user fixes nothing: powers of two (every published
#: Megatron-Core and TensorRT-LLM layout uses them for tp, cp, ep and vp).
POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: Largest tensor-parallel degree tried by default (TP inside one 8-GPU board, as every
#: Megatron-Bridge recipe keeps it; ``--max-tp`` raises it on a larger NVLink domain).
DEFAULT_MAX_TP = 8
#: Largest context-parallel degree tried by default.
DEFAULT_MAX_CP = 8
#: Largest virtual-stage count tried by default.
DEFAULT_MAX_VP = 8
#: Micro-batches tried by default.
DEFAULT_MICRO_BATCHES = (1, 2, 4)
#: Sharding recipes: (name, ZeRO stage, FSDP). ``zero1`` is Megatron's distributed optimizer.
SHARDING = {"zero0": (0, False), "zero1": (1, False), "zero2": (2, False),
            "zero3": (3, False), "fsdp": (3, True)}
DEFAULT_SHARDING = ("zero1", "fsdp")
DEFAULT_SCHEDULES = ("1f1b", "interleaved")

#: The rules of a training space, in the order they are applied: a candidate is counted
#: against the first rule it breaks.
TRAIN_RULES = (
    ("gpus", "tp × cp × pp × dp equals the GPU count (tp × cp × pp divides it)"),
    ("tp_nvlink", "tp within the NVLink domain"),
    ("tp_heads", "tp divides the attention heads, the KV heads (or is a multiple), the FFN"),
    ("ep_experts", "ep divides the routed experts (1 for a dense model)"),
    ("ep_ranks", "ep × expert tp divides tp × cp × dp"),
    ("pp_layers", "Megatron-Core splits the layers over pp × vp stages: evenly, or with the "
                  "embedding, the MTP layers and the loss counted as layers (zrt run's "
                  "--stage-split auto)"),
    ("vp_schedule", "vp > 1 exactly when the schedule is interleaved (and pp > 1)"),
    ("cp_seq", "2 × cp divides the sequence (ring attention's balanced chunks)"),
    ("batch", "micro-batch × dp divides the global batch"),
    ("pipeline_fill", "at least pp micro-batches per step (a multiple of pp when "
                      "interleaved)"),
    ("sharding_dp", "ZeRO-2/3 or FSDP needs dp × cp > 1"),
)
SERVE_RULES = (
    ("gpus", "tp × dp equals the GPU count"),
    ("tp_nvlink", "tp within the NVLink domain"),
    ("tp_heads", "tp divides the attention heads, the KV heads (or is a multiple), the FFN"),
    ("ep_experts", "ep divides the routed experts (1 for a dense model)"),
    ("ep_ranks", "ep divides tp × dp, and the expert tp (tp × dp / ep) the expert FFN"),
    ("quant_hw", "the hardware runs the quantization's matmul precision"),
)


def _ints(values: Any, what: str) -> tuple[int, ...] | None:
    if values is None:
        return None
    out = tuple(int(v) for v in values)
    if not out or any(v < 1 for v in out):
        raise SpecError(f"{what} must be positive integers, got {list(values)}",
                        f"give {what} as e.g. 1,2,4 or 1-8")
    return tuple(sorted(set(out)))


def _names(values: Any, allowed: tuple[str, ...] | dict, what: str) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(str(v) for v in values))
    bad = [v for v in out if v not in allowed]
    if bad or not out:
        raise SpecError(f"unknown {what} {', '.join(bad) or '(none)'}",
                        f"use some of {', '.join(allowed)}")
    return out


@frozen
class TrainSpace:
    """A training search space. ``None`` for a degree means every power of two up to its
    bound; a tuple fixes the values tried."""

    gpus: tuple[int, ...] = field(converter=lambda v: _ints(v, "--gpus"))
    global_batch: int
    seq_len: int
    tp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--tp"))
    pp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--pp"))
    vp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--vp"))
    cp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--cp"))
    ep: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--ep"))
    etp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--etp"))
    micro_batch: tuple[int, ...] = field(default=DEFAULT_MICRO_BATCHES,
                                         converter=lambda v: _ints(v, "--micro-batch"))
    recompute: tuple[str, ...] = field(default=("none", "selective", "full"),
                                       converter=lambda v: _names(v, RECOMPUTE, "recompute"))
    sharding: tuple[str, ...] = field(default=DEFAULT_SHARDING,
                                      converter=lambda v: _names(v, SHARDING, "sharding"))
    pp_schedule: tuple[str, ...] = field(
        default=DEFAULT_SCHEDULES, converter=lambda v: _names(v, PP_SCHEDULES, "schedule"))
    precision: tuple[str, ...] = field(default=("bf16",),
                                       converter=lambda v: _names(v, PRECISIONS, "precision"))
    #: bounds on the degrees tried when the dimension is not fixed (None: the defaults)
    max_tp: int | None = None
    max_pp: int | None = None
    max_cp: int | None = None
    max_vp: int | None = None
    #: the run's gradient buffer and weight storage (:class:`~zrt_core.strategy.TrainSpec`'s
    #: fields of those names), the same for every candidate
    grad_reduce_in_fp32: bool = True
    quantized_params: bool = False
    #: multi-token prediction modules every candidate trains (``zrt run --mtp N``: the
    #: config's MTP at N depths, on the last pipeline stage); 0: none
    mtp: int = 0

    def __attrs_post_init__(self) -> None:
        if self.mtp < 0:
            raise SpecError(f"--mtp {self.mtp} is negative", "give 0 or more MTP depths")
        if self.global_batch < 1 or self.seq_len < 1:
            raise SpecError("--global-batch and --seq-len must be positive",
                            "give both as positive integers")
        for name in ("tp", "pp", "cp", "vp"):
            fixed, bound = getattr(self, name), getattr(self, f"max_{name}")
            if fixed is not None and bound is not None and min(fixed) > bound:
                raise SpecError(f"--{name} {','.join(map(str, fixed))} contradicts "
                                f"--max-{name} {bound}", "drop one of the two flags")


@frozen
class ServeSpace:
    """A serving search space: tp, ep and attention data parallelism (dp replicas of the
    attention, experts shared), quantization, and the batch (None: the largest that fits)."""

    gpus: tuple[int, ...] = field(converter=lambda v: _ints(v, "--gpus"))
    input_len: int
    output_len: int
    tp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--tp"))
    ep: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--ep"))
    dp: tuple[int, ...] | None = field(default=None, converter=lambda v: _ints(v, "--dp"))
    quant: tuple[str, ...] = field(default=("none", "fp8"),
                                   converter=lambda v: _names(v, QUANT, "quantization"))
    batch: tuple[int | None, ...] = (None, 1, 4, 16, 64, 256)
    max_tp: int = 64


def _degrees(fixed: tuple[int, ...] | None, bound: int) -> tuple[int, ...]:
    if fixed is not None:
        return fixed
    return tuple(v for v in POWERS_OF_TWO if v <= bound)


def _tp_fits(dims: ModelDims, tp: int) -> bool:
    if dims.heads % tp or (dims.kv_heads % tp and tp % dims.kv_heads):
        return False
    return not (dims.ffn and dims.ffn % tp)


def _ep_values(dims: ModelDims, fixed: tuple[int, ...] | None, gpus: int) -> tuple[int, ...]:
    if fixed is not None:
        return fixed
    if not dims.is_moe:
        return (1,)
    return tuple(v for v in POWERS_OF_TWO if v <= min(gpus, dims.experts))


@frozen
class TrainCandidate:
    """One training layout: the parallel degrees and the recipe (JSON-able)."""

    gpus: int
    parallel: Parallel
    micro_batch: int
    recompute: str
    sharding: str
    pp_schedule: str
    precision: str
    grad_reduce_in_fp32: bool = True
    quantized_params: bool = False

    def key(self) -> tuple[Any, ...]:
        p = self.parallel
        return (self.gpus, p.tp, p.pp, p.vp, p.cp, p.ep, p.etp, p.dp, self.micro_batch,
                self.recompute, self.sharding, self.pp_schedule, self.precision)

    def to_json(self) -> dict[str, Any]:
        p = self.parallel
        return {"gpus": self.gpus, "tp": p.tp, "pp": p.pp, "vp": p.vp, "cp": p.cp,
                "ep": p.ep, "etp": p.etp if p.etp is not None else p.tp, "dp": p.dp,
                "micro_batch": self.micro_batch, "recompute": self.recompute,
                "sharding": self.sharding, "pp_schedule": self.pp_schedule,
                "precision": self.precision}


@frozen
class ServeCandidate:
    """One serving layout (JSON-able)."""

    gpus: int
    parallel: Parallel
    quant: str
    batch: int | None

    def key(self) -> tuple[Any, ...]:
        p = self.parallel
        return (self.gpus, p.tp, p.ep, p.dp, self.quant, self.batch or 0)

    def to_json(self) -> dict[str, Any]:
        p = self.parallel
        return {"gpus": self.gpus, "tp": p.tp, "ep": p.ep, "dp": p.dp, "quant": self.quant,
                "batch": self.batch if self.batch is not None else "max"}


def enumerate_train(space: TrainSpace, dims: ModelDims, nvlink_domain: int | None
                    ) -> tuple[list[TrainCandidate], Counter[str]]:
    """Every candidate of ``space`` that passes :data:`TRAIN_RULES`, and how many each rule
    removed (a candidate counts against the first rule it breaks)."""
    removed: Counter[str] = Counter()
    kept: list[TrainCandidate] = []
    for cand, rule in _walk_train(space, dims, nvlink_domain):
        if rule is None:
            kept.append(cand)
        else:
            removed[rule] += 1
    return kept, removed


def _walk_train(space: TrainSpace, dims: ModelDims, nvlink_domain: int | None
                ) -> Iterator[tuple[Any, str | None]]:
    """Yield ``(candidate, None)`` or ``(None, rule)`` for the full product of the space's
    dimensions (the product is what ``--json``'s ``enumerated`` counts)."""
    for n in space.gpus:
        tps, cps, pps, vps = _train_degrees(space, dims, n)
        eps = _ep_values(dims, space.ep, n)
        for tp in tps:
            for cp in cps:
                for pp in pps:
                    for ep in eps:
                        etps = space.etp if space.etp is not None else (None,)
                        for etp in etps:
                            yield from _walk_recipes(space, dims, nvlink_domain, n, tp, cp,
                                                     pp, ep, etp, vps)


def _walk_recipes(space: TrainSpace, dims: ModelDims, nvlink_domain: int | None, n: int,
                  tp: int, cp: int, pp: int, ep: int, etp: int | None,
                  vps: tuple[int, ...]) -> Iterator[tuple[Any, str | None]]:
    inner = (len(vps) * len(space.pp_schedule) * len(space.micro_batch)
             * len(space.recompute) * len(space.sharding) * len(space.precision))
    # rules that depend on the degrees alone remove the whole inner product at once
    rule = None
    if n % (tp * cp * pp):
        rule = "gpus"
    elif nvlink_domain is not None and tp > nvlink_domain:
        rule = "tp_nvlink"
    elif not _tp_fits(dims, tp):
        rule = "tp_heads"
    elif (dims.is_moe and dims.experts % ep) or (not dims.is_moe and ep > 1):
        rule = "ep_experts"
    if rule is not None:
        for _ in range(inner):
            yield None, rule
        return
    dp = n // (tp * cp * pp)
    expert_tp = etp if etp is not None else tp
    ep_ok = not dims.is_moe or ((tp * cp * dp) % (ep * expert_tp) == 0
                                and not (dims.moe_ffn and dims.moe_ffn % expert_tp))
    for vp in vps:
        for schedule in space.pp_schedule:
            for mb in space.micro_batch:
                for recompute in space.recompute:
                    for sharding in space.sharding:
                        for precision in space.precision:
                            rule = _recipe_rule(space, dims, ep_ok, tp, cp, pp, dp, vp,
                                                schedule, mb, sharding)
                            if rule is not None:
                                yield None, rule
                                continue
                            par = Parallel(tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp, dp=dp)
                            yield TrainCandidate(n, par, mb, recompute, sharding, schedule,
                                                 precision, space.grad_reduce_in_fp32,
                                                 space.quantized_params), None


@lru_cache(maxsize=4096)
def _splits(layers: int, pp: int, vp: int, mtp: int) -> bool:
    """Whether Megatron-Core runs ``layers`` decoder layers (and ``mtp`` MTP depths) over pp ×
    vp stages with the split the search's estimates use (``stage_split="auto"``: even, else
    the embedding and the loss counted as layers, else the balanced layout)."""
    from zrt_core.schedule.stages import auto_splits

    return auto_splits(layers, pp, vp, mtp)


def _recipe_rule(space: TrainSpace, dims: ModelDims, ep_ok: bool, tp: int, cp: int, pp: int,
                 dp: int, vp: int, schedule: str, mb: int, sharding: str) -> str | None:
    if not ep_ok:
        return "ep_ranks"
    if not _splits(dims.layers, pp, vp, space.mtp):
        return "pp_layers"
    if (vp > 1) != (schedule == "interleaved") or (vp > 1 and pp == 1):
        return "vp_schedule"
    if cp > 1 and space.seq_len % (2 * cp):
        return "cp_seq"
    if space.global_batch % (mb * dp):
        return "batch"
    m = space.global_batch // (mb * dp)
    if m < pp or (vp > 1 and m % pp):
        return "pipeline_fill"
    zero, fsdp = SHARDING[sharding]
    if (zero >= 2 or fsdp) and dp * cp == 1:
        return "sharding_dp"
    return None


def _train_degrees(space: TrainSpace, dims: ModelDims, n: int
                   ) -> tuple[tuple[int, ...], ...]:
    """tp, cp, pp and vp values tried for ``n`` GPUs."""
    return (_degrees(space.tp, space.max_tp or DEFAULT_MAX_TP),
            _degrees(space.cp, space.max_cp or DEFAULT_MAX_CP),
            _degrees(space.pp, min(space.max_pp or dims.layers, dims.layers, n)),
            # any vp whose stages split the layers (Megatron's 70B recipes run vp 5)
            space.vp or tuple(range(1, (space.max_vp or DEFAULT_MAX_VP) + 1)))


def train_space_size(space: TrainSpace, dims: ModelDims) -> int:
    """The size of the full product :func:`enumerate_train` walks."""
    total = 0
    for n in space.gpus:
        tps, cps, pps, vps = _train_degrees(space, dims, n)
        total += (len(tps) * len(cps) * len(pps) * len(_ep_values(dims, space.ep, n))
                  * len(space.etp or (None,)) * len(vps) * len(space.pp_schedule)
                  * len(space.micro_batch) * len(space.recompute) * len(space.sharding)
                  * len(space.precision))
    return total


def enumerate_serve(space: ServeSpace, dims: ModelDims, nvlink_domain: int | None,
                    low_precisions: frozenset[str]) -> tuple[list[ServeCandidate],
                                                             Counter[str]]:
    """Every serving candidate passing :data:`SERVE_RULES` and the count each rule removed.

    :param low_precisions: the matmul precisions the hardware lists (``fp8``, ``int8``,
        ``fp4``...): a quantization whose precision the hardware lacks is removed."""
    removed: Counter[str] = Counter()
    kept: list[ServeCandidate] = []
    need = {"none": None, "int8": None, "int4": None, "fp8": "fp8", "fp4": "fp4"}
    for n in space.gpus:
        tps = _degrees(space.tp, min(space.max_tp, n))
        dps = _degrees(space.dp, n)
        eps = _ep_values(dims, space.ep, n)
        for tp in tps:
            for dp in dps:
                for ep in eps:
                    for quant in space.quant:
                        for batch in space.batch:
                            rule = None
                            if tp * dp != n:
                                rule = "gpus"
                            elif nvlink_domain is not None and tp > nvlink_domain:
                                rule = "tp_nvlink"
                            elif not _tp_fits(dims, tp):
                                rule = "tp_heads"
                            elif (dims.is_moe and dims.experts % ep) or \
                                    (not dims.is_moe and ep > 1):
                                rule = "ep_experts"
                            elif dims.is_moe and ((tp * dp) % ep or (
                                    dims.moe_ffn and dims.moe_ffn % (tp * dp // ep))):
                                rule = "ep_ranks"
                            elif need[quant] is not None and need[quant] not in low_precisions:
                                rule = "quant_hw"
                            if rule is not None:
                                removed[rule] += 1
                                continue
                            # TensorRT-LLM's MoE layout: moe_tp × moe_ep = tp × dp (the
                            # experts span every GPU of the instance; as
                            # strategy.serving_expert_tp gives an unset etp)
                            etp = (tp * dp) // ep if dims.is_moe else None
                            kept.append(ServeCandidate(
                                n, Parallel(tp=tp, ep=ep, dp=dp, etp=etp), quant, batch))
    return kept, removed


def no_layout_error(removed: Counter[str], rules: tuple[tuple[str, str], ...],
                    memory: int = 0) -> LayoutError:
    """The one line for a space with no valid layout: the rule that removed the most."""
    counts = Counter(removed)
    if memory:
        counts["memory"] = memory
    if not counts:
        return LayoutError("the search space is empty", "widen the filters")
    # the most candidates; a tie goes to the later hurdle (targets, then memory, then the
    # estimator's checks), which the layouts passing every rule before it still met
    stage = {"latency_targets": 3, "memory": 2}
    rule, count = max(counts.items(), key=lambda kv: (
        kv[1], stage.get(kv[0], 1 if kv[0].startswith("estimator") else 0)))
    what = dict(rules).get(rule, "the layout does not fit in device memory")
    hint = {"memory": "add GPUs, allow recompute/fsdp, or a smaller micro-batch",
            "gpus": "choose a GPU count the degrees divide (e.g. a power of two)",
            "batch": "choose a global batch that is a multiple of micro-batch × dp",
            "pipeline_fill": "raise the global batch or allow smaller pp",
            "latency_targets": "relax --ttft-ms/--tpot-ms, or allow more GPUs or "
                               "quantization"}.get(
        rule, "relax the filters on that dimension")
    return LayoutError(f"no valid layout: the rule '{rule}' ({what}) removed {count} of "
                       f"{sum(counts.values())} candidates", hint)


#: What each kind of search reads from a request (``zrt search``'s flags, a service body).
TRAIN_KEYS = ("tp", "pp", "vp", "cp", "ep", "etp", "micro_batch", "recompute", "sharding",
              "pp_schedule", "precision", "max_tp", "max_pp", "max_cp", "max_vp", "mtp")
SERVE_KEYS = ("tp", "ep", "dp", "quant", "batch")


def space_from_values(values: Any, *, name: Any = None) -> TrainSpace | ServeSpace:
    """The space of a search request — ``zrt search``'s flags or a ``POST /v1/search`` body,
    by the same keys (``mode``, ``gpus``, ``global_batch``, ``tp``, ``ttft_ms``, ...); a key
    missing or None keeps the space's default. What belongs to the other kind of search is
    refused, not ignored. ``name`` renders a key in a message (default: its flag,
    ``--global-batch``)."""
    show = name or (lambda key: "--" + key.replace("_", "-"))
    v = {k: x for k, x in dict(values).items() if x is not None}
    if v.get("mode", "infer") == "train":
        if "global_batch" not in v:
            raise SpecError(f"a training search needs {show('global_batch')}",
                            "give the sequences per step")
        targets = [k for k in ("ttft_ms", "tpot_ms", "rate") if k in v]
        if targets:
            raise SpecError(f"{', '.join(map(show, targets))}: serving targets",
                            "drop them from a training search, or search serving")
        if "dp" in v:
            raise SpecError(f"{show('dp')} is what is left of the GPUs in a training layout",
                            f"fix {show('tp')}/{show('pp')}/{show('cp')} instead, or give "
                            f"{show('gpus')}")
        return TrainSpace(gpus=v["gpus"], global_batch=v["global_batch"],
                          seq_len=v.get("seq_len", 4096),
                          **{k: v[k] for k in TRAIN_KEYS if k in v})
    for key in ("pp", "vp", "cp", "mtp"):
        if key in v:
            raise SpecError(f"{show(key)} is not a serving dimension",
                            "serving searches tp, ep, dp, quant and batch")
    return ServeSpace(gpus=v["gpus"], input_len=v.get("input_len", 1024),
                      output_len=v.get("output_len", 256), max_tp=v.get("max_tp", 64),
                      **{k: v[k] for k in SERVE_KEYS if k in v})
