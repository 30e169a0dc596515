"""An estimate described in one YAML file: a model (a name, a config, or its numbers), a
hardware id, a parallel layout and a training or serving workload (docs/estimate.md).

:meth:`EstimateSpec.from_yaml` reads the file strictly: an unknown key anywhere is a
:class:`~zrt_core.errors.SpecError` naming the file and the key, and so is a missing or
ill-typed value. :func:`config_from_numbers` turns model numbers (``hidden``, ``layers``,
``heads``...) into the HuggingFace config of the family they describe, which the analytic
front-end (:mod:`zrt_core.analytic.builder`) builds graphs from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from zrt_core.errors import SpecError, ZrtError
from zrt_core.strategy import InferSpec, Parallel, TrainSpec

TOP_KEYS = ("model", "hardware", "parallel", "train", "infer", "frontend", "num_gpus",
            "fusion_rules")
NUMBER_KEYS = ("family", "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab",
               "experts", "top_k", "moe_ffn", "dense_layers", "norm_topk", "tie_embeddings",
               "max_positions", "sliding_window")
MODEL_KEYS = ("name", "config")
PARALLEL_KEYS = ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "sp", "cp_kind", "moe_load")
TRAIN_KEYS = ("micro_batch", "global_batch", "seq_len", "recompute", "recompute_modules", "zero",
              "fsdp", "optimizer", "precision", "pp_schedule", "offload_optimizer")
INFER_KEYS = ("input_len", "output_len", "batch", "concurrency", "quant", "kv_dtype", "dtype",
              "engine")
FRONTENDS = ("analytic", "capture")


@frozen
class EstimateSpec:
    """One estimate: exactly one of ``train`` and ``infer`` is set.

    :param model: what the front-end is given: a config mapping, or a bundled name / path.
    :param model_label: how the model was described, for reports.
    :param frontend: ``analytic`` (graphs from the model numbers, no torch) or ``capture``.
    """

    model: Any
    model_label: str
    hardware: str
    parallel: Parallel
    train: TrainSpec | None = None
    infer: InferSpec | None = None
    engine: str = "trtllm"
    frontend: str = "analytic"
    num_gpus: int | None = None
    source: str = ""
    #: a user fusion-rule pack (``--fusion-rules``), relative paths from the spec's folder
    fusion_rules: str | None = None

    @property
    def workload(self) -> str:
        return "train" if self.train is not None else "infer"

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model_label, "hardware": self.hardware,
                "parallel": self.parallel.to_json(), "workload": self.workload,
                "train": self.train.to_json() if self.train else None,
                "infer": self.infer.to_json() if self.infer else None,
                "engine": self.engine if self.infer else None, "frontend": self.frontend,
                "file": self.source, "fusion_rules": self.fusion_rules}

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> EstimateSpec:
        """Read an estimate file (docs/estimate.md).

        :raises SpecError: the file cannot be read or parsed, or holds an unknown key, a
            missing one or a bad value (one line naming the file and the key).
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(f"{p}: not UTF-8 text (byte {exc.start}): not an estimate file",
                            "pass a YAML file as docs/estimate.md describes") from None
        except OSError as exc:
            raise SpecError(f"{p}: cannot read the estimate file ({exc.strerror})",
                            "pass a YAML file as docs/estimate.md describes") from None
        data = load_yaml_text(text, str(p))
        return cls.from_mapping(data, where=str(p), folder=p.parent)

    @classmethod
    def from_mapping(cls, data: Any, *, where: str = "estimate",
                     folder: Path | None = None) -> EstimateSpec:
        """Read a spec mapping; ``fusion_rules`` (a file) only with the ``folder`` of a
        spec file, which relative paths are taken from (a served request names none)."""
        if not isinstance(data, Mapping):
            raise SpecError(f"{where}: expected a mapping with model, hardware, parallel and "
                            "train or infer", "see docs/estimate.md")
        _known(data, TOP_KEYS, where, "")
        for key in ("model", "hardware"):
            if data.get(key) in (None, ""):
                raise SpecError(f"{where}: {key} is missing", "see docs/estimate.md")
        if not isinstance(data["hardware"], str):
            raise SpecError(f"{where}: hardware must be a hardware id (zrt hw list)")
        model, label = _model(data["model"], where)
        parallel = _parallel(data.get("parallel"), where)
        train_raw, infer_raw = data.get("train"), data.get("infer")
        if (train_raw is None) == (infer_raw is None):
            raise SpecError(f"{where}: give exactly one of train and infer",
                            "train: {micro_batch, global_batch, seq_len, ...} or infer: "
                            "{input_len, output_len, ...}")
        frontend = data.get("frontend", "analytic")
        if frontend not in FRONTENDS:
            raise SpecError(f"{where}: frontend must be one of {', '.join(FRONTENDS)}, got "
                            f"{frontend!r}")
        num_gpus = data.get("num_gpus")
        if num_gpus is not None and (not isinstance(num_gpus, int) or num_gpus <= 0):
            raise SpecError(f"{where}: num_gpus must be a positive integer, got {num_gpus!r}")
        rules = data.get("fusion_rules")
        if rules is not None:
            if not isinstance(rules, str) or not rules:
                raise SpecError(f"{where}: fusion_rules must be the path of a rule pack "
                                f"YAML, got {rules!r}", "see docs/fusion.md")
            if folder is None:
                raise SpecError(f"{where}: fusion_rules names a file, which a spec sent as "
                                "data cannot", "run zrt estimate --config FILE locally")
            rules = str(folder / rules)
        common = {"model": model, "model_label": label, "hardware": data["hardware"],
                  "parallel": parallel, "frontend": frontend, "num_gpus": num_gpus,
                  "source": where, "fusion_rules": rules}
        if train_raw is not None:
            return cls(train=_train(train_raw, parallel, where), **common)
        infer, engine = _infer(infer_raw, where)
        return cls(infer=infer, engine=engine, **common)


#: Deepest nesting of mappings and lists a spec or validation file may have: a real one has
#: five levels; PyYAML recurses per level and would overflow the stack on 100,000.
MAX_YAML_DEPTH = 64


def load_yaml_text(text: str, where: str) -> Any:
    """``yaml.safe_load`` of a file's text, every failure one :class:`SpecError` naming the
    file: bad syntax (line, column), nesting deeper than :data:`MAX_YAML_DEPTH`, an integer
    longer than Python converts (4,300 digits), a value YAML cannot construct."""
    import yaml

    depth = _nesting(text)
    if depth > MAX_YAML_DEPTH:
        raise SpecError(f"{where}: nested {depth} levels deep (more than {MAX_YAML_DEPTH})",
                        "a spec file is a few levels of mappings; check the file")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{where}:{at} is not valid YAML", "fix the YAML syntax") from None
    except (ValueError, RecursionError, OverflowError) as exc:
        detail = " ".join(str(exc).split())[:120]
        raise SpecError(f"{where}: a value cannot be read ({type(exc).__name__}: {detail})",
                        "numbers in a spec are a few digits long") from None


def _nesting(text: str) -> int:
    """An upper bound on the flow-style nesting of YAML text: the deepest run of open
    brackets (block nesting is bounded by indentation, which PyYAML handles iteratively)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _known(data: Mapping[str, Any], keys: tuple[str, ...], where: str, prefix: str) -> None:
    unknown = [str(k) for k in data if k not in keys]
    if unknown:
        raise SpecError(f"{where}: unknown key {prefix + unknown[0]!r}",
                        f"known keys{' of ' + prefix.rstrip('.') if prefix else ''}: "
                        f"{', '.join(keys)}")


def _section(value: Any, keys: tuple[str, ...], where: str, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: {name} must be a mapping, got {type(value).__name__}",
                        "see docs/estimate.md")
    _known(value, keys, where, f"{name}.")
    return {k: v for k, v in value.items() if v is not None}


def _build(cls: type, fields: dict[str, Any], where: str, name: str) -> Any:
    try:
        return cls(**fields)
    except ZrtError as exc:
        raise type(exc)(f"{where}: bad {name}: {exc.message}",
                        exc.hint or "see docs/estimate.md") from None
    except (TypeError, ValueError) as exc:
        detail = " ".join(str(exc).split())
        raise SpecError(f"{where}: bad {name}: {detail[:160]}",
                        "see docs/estimate.md for the values each key takes") from None


def _parallel(value: Any, where: str) -> Parallel:
    return _build(Parallel, _section(value, PARALLEL_KEYS, where, "parallel"), where,
                  "parallel")


def _train(value: Any, parallel: Parallel, where: str) -> TrainSpec:
    fields = _section(value, TRAIN_KEYS, where, "train")
    for key in ("micro_batch", "seq_len"):
        if key not in fields:
            raise SpecError(f"{where}: train.{key} is missing", "see docs/estimate.md")
    from zrt_core.checks import check_count

    micro = check_count(fields["micro_batch"], f"{where}: train.micro_batch", "batch")
    fields.setdefault("global_batch", micro * parallel.dp)
    if parallel.vp > 1 and "pp_schedule" not in fields:
        fields["pp_schedule"] = "interleaved"  # Megatron: virtual stages interleave
    return _build(TrainSpec, fields, where, "train")


def _infer(value: Any, where: str) -> tuple[InferSpec, str]:
    fields = _section(value, INFER_KEYS, where, "infer")
    for key in ("input_len", "output_len"):
        if key not in fields:
            raise SpecError(f"{where}: infer.{key} is missing", "see docs/estimate.md")
    engine = str(fields.pop("engine", "trtllm"))
    if fields.get("quant") in ("fp8", "fp4") and "kv_dtype" not in fields:
        fields["kv_dtype"] = "fp8"  # quantised checkpoints keep an fp8 KV cache
    return _build(InferSpec, fields, where, "infer"), engine


def _model(value: Any, where: str) -> tuple[Any, str]:
    """``(what the front-end is given, a label)`` from the ``model`` entry."""
    if isinstance(value, str):
        return value, value
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: model must be a name, a path or a mapping",
                        "see docs/estimate.md")
    if "config" in value or "name" in value:
        _known(value, MODEL_KEYS, where, "model.")
        if "config" in value:
            cfg = value["config"]
            if not isinstance(cfg, Mapping):
                raise SpecError(f"{where}: model.config must be a config.json mapping")
            label = str(value.get("name") or cfg.get("_name_or_path") or
                        cfg.get("model_type") or "config")
            return {**dict(cfg), "_name_or_path": label}, label
        return str(value["name"]), str(value["name"])
    _known(value, NUMBER_KEYS, where, "model.")
    cfg = config_from_numbers(value, where=where)
    return cfg, cfg["_name_or_path"]


def _positive(numbers: Mapping[str, Any], key: str, where: str, *, required: bool = True
              ) -> int | None:
    v = numbers.get(key)
    if v is None:
        if required:
            raise SpecError(f"{where}: model.{key} is missing",
                            "model numbers need hidden, layers, heads, ffn and vocab")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SpecError(f"{where}: model.{key} must be a positive integer, got {v!r}")
    return v


def config_from_numbers(numbers: Mapping[str, Any], *, where: str = "model") -> dict[str, Any]:
    """The HuggingFace config of the family that model numbers describe.

    ``family`` (default ``llama``, or ``qwen3_moe`` when ``experts`` is given) is any
    family the analytic front-end builds. ``ffn`` is the dense MLP width; with experts,
    ``moe_ffn`` is one expert's (default ``ffn``), ``top_k`` the experts per token (default
    2), ``dense_layers`` how many first layers stay dense (``qwen3_moe``), ``norm_topk``
    whether the top-k weights are renormalised.

    :raises SpecError: a missing or bad number, or a family the analytic front-end lacks.
    """
    from zrt_core.analytic.builder import FAMILIES

    experts = _positive(numbers, "experts", where, required=False) or 0
    family = str(numbers.get("family") or ("qwen3_moe" if experts else "llama"))
    if family not in FAMILIES:
        raise SpecError(f"{where}: model.family {family!r} has no analytic model",
                        f"use one of {', '.join(sorted(FAMILIES))}, or give model.config")
    hidden = _positive(numbers, "hidden", where)
    layers = _positive(numbers, "layers", where)
    heads = _positive(numbers, "heads", where)
    ffn = _positive(numbers, "ffn", where)
    vocab = _positive(numbers, "vocab", where)
    kv_heads = _positive(numbers, "kv_heads", where, required=False) or heads
    head_dim = _positive(numbers, "head_dim", where, required=False)
    label = f"{family} h{hidden} L{layers}" + (f" E{experts}" if experts else "")
    if family == "gpt2":
        if experts:
            raise SpecError(f"{where}: gpt2 has no experts", "drop model.experts")
        cfg: dict[str, Any] = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers,
                               "n_head": heads, "n_inner": ffn, "vocab_size": vocab,
                               "n_positions": numbers.get("max_positions") or 2048}
    else:
        cfg = {"model_type": family, "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv_heads,
               "intermediate_size": ffn, "vocab_size": vocab}
        # qwen3's config class defaults head_dim to 128; numbers mean hidden / heads
        cfg["head_dim"] = head_dim or hidden // heads
        if numbers.get("max_positions"):
            cfg["max_position_embeddings"] = numbers["max_positions"]
        if numbers.get("sliding_window"):
            cfg["sliding_window"] = numbers["sliding_window"]
            if family in ("qwen2", "qwen3", "qwen3_moe"):
                cfg["use_sliding_window"] = True
                cfg["max_window_layers"] = 0
        if experts:
            top_k = _positive(numbers, "top_k", where, required=False) or 2
            moe_ffn = _positive(numbers, "moe_ffn", where, required=False) or ffn
            if family == "mixtral":
                cfg.update(num_local_experts=experts, num_experts_per_tok=top_k,
                           intermediate_size=moe_ffn)
            elif family == "qwen3_moe":
                dense = numbers.get("dense_layers") or 0
                if isinstance(dense, bool) or not isinstance(dense, int) or \
                        not 0 <= dense <= layers:
                    raise SpecError(f"{where}: model.dense_layers must be an integer in "
                                    f"0..{layers} (the layers), got {dense!r}")
                cfg.update(num_experts=experts, num_experts_per_tok=top_k,
                           moe_intermediate_size=moe_ffn, mlp_only_layers=list(range(dense)),
                           norm_topk_prob=bool(numbers.get("norm_topk", True)))
            else:
                raise SpecError(f"{where}: model.family {family!r} has no experts",
                                "use family mixtral or qwen3_moe")
    if numbers.get("tie_embeddings") is not None:
        cfg["tie_word_embeddings"] = bool(numbers["tie_embeddings"])
    cfg["_name_or_path"] = label
    return cfg


__all__ = ["EstimateSpec", "config_from_numbers"]
