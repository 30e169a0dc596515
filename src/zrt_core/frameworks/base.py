"""What every framework reader and writer shares: the run request (the objects ``zrt run``
builds), what a reader returns, the header a writer puts on top, and argv helpers."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attrs import evolve, field, frozen

from zrt_core.errors import SpecError
from zrt_core.schedule.stages import StageSplit
from zrt_core.strategy import InferSpec, Parallel, TrainSpec, train_spec_defaults

#: the flat field names a reader sets: exactly the ``dest`` of ``zrt run``'s flags
#: (cli/run_cmd.py, cli/run_train.py), plus ``num_gpus`` (the launch's world size) and
#: ``mode`` (``train`` or ``infer``)
PARALLEL_FIELDS = ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "sp", "cp_kind",
                   "ep_dispatcher")
TRAIN_FIELDS = ("micro_batch", "global_batch", "seq_len", "recompute", "recompute_modules",
                "zero", "fsdp",
                "optimizer", "precision", "pp_schedule", "offload_optimizer", "lora_rank",
                "lora_modules", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                "pipeline_model_parallel_layout", "embedding_loss_stages",
                "reshard_after_forward", "hsdp")
INFER_FIELDS = ("batch", "input_len", "output_len", "quant", "kv_dtype", "engine", "dtype")


@frozen
class RunRequest:
    """One ``zrt run`` request as the estimators take it: the layout and the training step
    (``train``, ``stage_split``) or the serving workload (``infer``, ``engine``)."""

    parallel: Parallel
    train: TrainSpec | None = None
    stage_split: StageSplit | None = None
    infer: InferSpec | None = None
    engine: str | None = None
    num_gpus: int | None = None

    @property
    def mode(self) -> str:
        return "train" if self.train is not None else "infer"

    def normalized(self, moe: bool = True) -> RunRequest:
        """Resolved defaults, for comparing two requests that mean the same run: sequence
        parallelism as the estimators resolve it, expert TP explicit, the world size; for a
        model without routed experts (``moe`` false) the expert degrees, which it has no use
        for, are dropped."""
        training = self.train is not None
        p = self.parallel
        if not moe:
            p = evolve(p, ep=1, etp=None)
        p = evolve(p, sp=p.sequence_parallel(training), etp=p.expert_tp)
        split = self.stage_split
        if split == StageSplit():
            split = None
        train = self.train
        if train is not None and train.recompute == "selective":
            # Megatron-Core's default list; an empty list re-runs nothing
            mods = ("core_attn",) if train.recompute_modules is None else \
                train.recompute_modules
            train = evolve(train, recompute="selective" if mods else "none",
                           recompute_modules=mods or None)
        return evolve(self, parallel=p, stage_split=split, num_gpus=p.world_size,
                      train=train)


@frozen
class Imported:
    """What a reader found: ``values`` by ``zrt run`` flag name, the arguments zrt does not
    model (``ignored``, each ``ARG=VALUE (why)``) and how some were read (``notes``)."""

    framework: str
    values: Mapping[str, Any] = field(factory=dict)
    ignored: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        return str(self.values.get("mode", "train"))


@frozen
class Header:
    """The header a writer puts on top: zrt's version, the model, the hardware and the
    predicted figures (name → value, printed in this order)."""

    model: str
    hardware: str
    predicted: Mapping[str, Any] = field(factory=dict)
    version: str = ""
    #: decoder layers of the model (torchtitan's ``pipeline_parallel_layers_per_stage``)
    layers: int | None = None
    #: routed experts of the model; 0 for a dense model, whose expert degrees a writer
    #: leaves out (None: not known, written as given)
    experts: int | None = None

    def lines(self, tool: str) -> list[str]:
        from zrt_core import __version__

        out = [f"{tool} written by zrt {self.version or __version__}",
               f"model: {self.model}", f"hardware: {self.hardware}"]
        figures = ", ".join(f"{k} {_fmt(v)}" for k, v in self.predicted.items()
                            if v is not None)
        if figures:
            out.append(f"predicted: {figures}")
        return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def request_from_values(values: Mapping[str, Any]) -> RunRequest:
    """The :class:`RunRequest` that ``zrt run`` builds from these flag values (the same
    defaults as its flags: tp…dp 1, micro-batch 1, sequence 4096, ZeRO 1, bf16; serving
    1024 in, 256 out, the largest batch that fits)."""
    v = dict(values)
    num_gpus = v.get("num_gpus")
    tp, pp, cp = (int(v.get(k) or 1) for k in ("tp", "pp", "cp"))
    dp = v.get("dp")
    if dp is None:
        dp = dp_from_world(num_gpus, tp, pp, cp) if num_gpus else 1
    parallel = Parallel(tp=tp, pp=pp, vp=int(v.get("vp") or 1), cp=cp,
                        ep=int(v.get("ep") or 1), etp=v.get("etp"), dp=dp, sp=v.get("sp"),
                        cp_kind=v.get("cp_kind") or "ring",
                        ep_dispatcher=v.get("ep_dispatcher") or "alltoall")
    if v.get("mode", "train") == "infer":
        kv = v.get("kv_dtype")
        quant = v.get("quant") or "none"
        if kv is None and quant in ("fp8", "fp4") and "kv_dtype" not in v:
            kv = "fp8"  # zrt run's default: an fp8/fp4 checkpoint's KV cache is fp8
        infer = InferSpec(input_len=int(v.get("input_len") or 1024),
                          output_len=int(v.get("output_len") or 256), batch=v.get("batch"),
                          quant=quant, kv_dtype=kv, dtype=v.get("dtype") or "bfloat16")
        return RunRequest(parallel=parallel, infer=infer, engine=v.get("engine") or "trtllm",
                          num_gpus=num_gpus)
    micro = int(v.get("micro_batch") or 1)
    fields: dict[str, Any] = {
        "micro_batch": micro, "global_batch": int(v.get("global_batch") or micro * dp),
        "seq_len": int(v.get("seq_len") or 4096), "recompute": v.get("recompute") or "none",
        "zero": 1 if v.get("zero") is None else v["zero"], "fsdp": bool(v.get("fsdp")),
        "optimizer": v.get("optimizer") or "adamw", "precision": v.get("precision") or "bf16",
        "offload_optimizer": bool(v.get("offload_optimizer")),
        "lora_rank": int(v.get("lora_rank") or 0),
        "lora_modules": None if v.get("lora_modules") is None else tuple(v["lora_modules"]),
        "reshard_after_forward": v.get("reshard_after_forward"), "hsdp": v.get("hsdp"),
        "grad_reduce_in_fp32": bool(v.get("grad_reduce_in_fp32", True)),
        "quantized_params": bool(v.get("quantized_params", False)),
        "freeze_language_model": bool(v.get("freeze_language_model", False))}
    if v.get("pp_schedule"):
        fields["pp_schedule"] = v["pp_schedule"]
    if v.get("recompute_modules") is not None and fields["recompute"] == "selective":
        fields["recompute_modules"] = tuple(v["recompute_modules"])
    train = train_spec_defaults(parallel, **fields)
    split = StageSplit(first_layers=v.get("decoder_first_pipeline_num_layers"),
                       last_layers=v.get("decoder_last_pipeline_num_layers"),
                       layout=v.get("pipeline_model_parallel_layout"),
                       embedding_loss=bool(v.get("embedding_loss_stages")))
    return RunRequest(parallel=parallel, train=train, stage_split=split, num_gpus=num_gpus)


def dp_from_world(num_gpus: int, tp: int, pp: int, cp: int) -> int:
    """Megatron's data-parallel size: world / (tp × pp × cp), which must be whole."""
    model = tp * pp * cp
    if num_gpus % model:
        raise SpecError(f"the launch has {num_gpus} GPUs, not a multiple of tp × pp × cp = "
                        f"{tp} × {pp} × {cp} = {model}",
                        "fix the world size or the parallel sizes")
    return num_gpus // model


# -- argv ---------------------------------------------------------------------------------


def split_argv(text: str, where: str) -> list[str]:
    """Shell words of a command line or an arguments file (``#`` comments and line
    continuations dropped)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")  # line continuations
    lex = shlex.shlex(text, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return [w for w in lex if w.strip()]  # '\\ ' before a newline: an empty word
    except ValueError as exc:
        raise SpecError(f"{where}: cannot split into arguments ({exc})",
                        "quote each argument as a shell would") from None


def parse_flags(words: Iterable[str], where: str, *, flags: Mapping[str, int],
                aliases: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """``--name value`` / ``--name=value`` / ``--switch`` words into ``{name: value}``.

    ``flags`` gives each known flag's arity (0 a switch, 1 one value, -1 one or more, 2 an
    optional value: None when absent);
    ``aliases`` maps short forms to long ones. Unknown flags take the words up to the next
    flag as their value and come back in the ignored list as ``--flag VALUE``. A flag given
    twice with different values is a contradiction (:class:`SpecError`)."""
    aliases = aliases or {}
    out: dict[str, Any] = {}
    ignored: list[str] = []
    words = list(words)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or word in ("-", "--"):
            ignored.append(word)
            continue
        name, eq, inline = word.partition("=")
        name = aliases.get(name, name)
        values: list[str] = [inline] if eq else []
        arity = flags.get(name)
        if not eq:
            while i < len(words) and not _is_flag(words[i]) and (arity is None or arity != 0):
                values.append(words[i])
                i += 1
                if arity in (1, 2):
                    break
        if arity is None:
            ignored.append(" ".join([name, *values]))
            continue
        if arity == 0 and values:
            raise SpecError(f"{where}: {name} takes no value, got {' '.join(values)!r}",
                            f"write {name} alone")
        if arity not in (0, 2) and not values:
            raise SpecError(f"{where}: {name} needs a value", f"write {name} VALUE")
        value: Any = (True if arity == 0 else tuple(values) if arity == -1
                      else values[0] if values else None)
        if name in out and out[name] != value:
            raise SpecError(f"{where}: {name} is given twice, as {out[name]!r} and {value!r}",
                            "keep one")
        out[name] = value
    return out, ignored


def _is_flag(word: str) -> bool:
    if not word.startswith("-") or word == "-":
        return False
    try:  # a negative number is a value, not a flag
        float(word)
    except ValueError:
        return True
    return False


def as_int(value: Any, name: str, where: str, *, minimum: int = 1) -> int:
    """An integer argument, or one line naming the argument."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: {name} must be an integer, got {value!r}",
                        f"give {name} a whole number")
    try:
        number = int(str(value), 10) if not isinstance(value, int) else value
    except ValueError:
        raise SpecError(f"{where}: {name} must be an integer, got {value!r}",
                        f"give {name} a whole number") from None
    if number < minimum:
        raise SpecError(f"{where}: {name} must be at least {minimum}, got {number}",
                        f"give {name} a whole number ≥ {minimum}")
    return number


def as_bool(value: Any, name: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise SpecError(f"{where}: {name} must be true or false, got {value!r}",
                    f"give {name} true or false")


def choice(value: Any, name: str, where: str, table: Mapping[str, Any]) -> Any:
    """``table[value]``, or one line naming the argument and the values zrt reads."""
    key = str(value)
    if key not in table:
        raise SpecError(f"{where}: {name} {value!r} is not one zrt models",
                        f"use one of {', '.join(map(str, table))}")
    return table[key]


def agree(values: dict[str, Any], key: str, value: Any, where: str, what: str) -> None:
    """Set ``values[key]``; two arguments that set it differently are a contradiction."""
    if key in values and values[key] != value:
        raise SpecError(f"{where}: {what} says {key}={value!r} but another argument says "
                        f"{key}={values[key]!r}", "remove one of the two")
    values[key] = value


Reader = Callable[[str, str, Mapping[str, Any]], Imported]
Writer = Callable[[RunRequest, Header], str]
