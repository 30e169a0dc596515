"""Megatron-Bridge MoE pre-training perf-recipe settings by release, read from the recipes' source
(``data/recipes/megatron_bridge.yaml``), and their lookup for a published validation record."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import yaml

from zrt_core.errors import SpecError

#: libyaml's parser where PyYAML has it: the table is ~40k scalars (1 s in C, ~9 s in Python).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

RELEASES = ("25.09", "25.11", "26.02", "26.02.01", "26.04", "26.04.01", "26.06", "26.06.01", "26.08")
GPUS = ("h100", "b200", "b300", "gb200", "gb300")
PRECISIONS = ("bf16", "fp8_cs", "fp8_ss", "fp8_mx", "nvfp4")

#: zrt hardware id -> the GPU name Megatron-Bridge's perf configs use.
HARDWARE_GPU = {"nvidia_h100_sxm": "h100", "nvidia_b200": "b200", "nvidia_b300": "b300",
                "nvidia_gb200_nvl72": "gb200", "nvidia_gb300_nvl72": "gb300"}
#: a record's precision -> the perf-config precisions it can name. The summaries print "FP8" for
#: both current- and sub-channel-scaling configs, so "fp8" names either (see lookup).
RECORD_PRECISION = {"bf16": ("bf16",), "fp8": ("fp8_cs", "fp8_ss"), "mxfp8": ("fp8_mx",),
                    "nvfp4": ("nvfp4",)}
#: record model name (lower case) -> perf-config model key; first match wins.
#: (a separator — hyphen, underscore, space or none — may stand between the name's parts:
#: the summaries print "Qwen3_30B_a3B" where a record may say "Qwen3-30B-A3B")
MODEL_PATTERNS = (
    (r"deepseek[-_ ]?v3", "deepseek_v3"), (r"deepseek[-_ ]?v4[-_ ]?flash", "deepseek_v4_flash"),
    (r"deepseek[-_ ]?v4[-_ ]?pro", "deepseek_v4_pro"), (r"gpt[-_ ]?oss[-_ ]?120b", "gpt_oss_120b"),
    (r"gpt[-_ ]?oss[-_ ]?20b", "gpt_oss_20b"), (r"qwen3[-_ ]?30b[-_ ]?a3b", "qwen3_30b_a3b"),
    (r"qwen3[-_ ]?235b[-_ ]?a22b", "qwen3_235b_a22b"),
    (r"qwen3[-_ ]?next[-_ ]?80b[-_ ]?a3b", "qwen3_next_80b_a3b"),
    (r"nemotron[-_ ]?3[-_ ]?nano", "nemotron_3_nano"),
    (r"nemotron[-_ ]?3[-_ ]?super", "nemotron_3_super"),
    (r"nemotron[-_ ]?3[-_ ]?ultra", "nemotron_3_ultra"),
    (r"nemotron[-_ ]?3\.5[-_ ]?lightning", "nemotron_3_5_lightning"),
    (r"kimi[-_ ]?k2", "kimi_k2"),
    # the vision-language rows (26.08): spelt with or without separators, "VL" optional
    # for Qwen3.5, whose models are multimodal by default
    (r"qwen3[-_ ]?vl[-_ ]?30b[-_ ]?a3b", "qwen3_vl_30b_a3b"),
    (r"qwen3[-_ ]?vl[-_ ]?235b[-_ ]?a22b", "qwen3_vl_235b_a22b"),
    (r"qwen3\.?5[-_ ]?(vl[-_ ]?)?35b[-_ ]?a3b", "qwen35_vl_35b_a3b"),
    (r"qwen3\.?5[-_ ]?(vl[-_ ]?)?122b[-_ ]?a10b", "qwen35_vl_122b_a10b"),
    (r"qwen3\.?5[-_ ]?(vl[-_ ]?)?397b[-_ ]?a17b", "qwen35_vl_397b_a17b"),
)

_INT = (int,)
_OPT_INT = (int, type(None))
_OPT_BOOL = (bool, type(None))
_OPT_STR = (str, type(None))
_OPT_NUM = (int, float, type(None))
_OPT_LIST = (list, type(None))
#: every row field and the value types it may hold (null: left to the library recipe/provider).
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "release": (str,), "model": (str,), "gpu": (str,), "precision": (str,), "variant": (str,),
    "num_gpus": _INT, "tp": _INT, "pp": _INT, "vp": _OPT_INT, "cp": _INT, "ep": _INT,
    "etp": _OPT_INT, "mbs": _INT, "gbs": _INT, "seq_len": _OPT_INT,
    "moe_token_dispatcher_type": _OPT_STR, "moe_flex_dispatcher_backend": _OPT_STR,
    "moe_a2a_overlap": _OPT_BOOL, "delay_wgrad_compute": _OPT_BOOL,
    "moe_shared_expert_overlap": _OPT_BOOL, "cuda_graph_impl": _OPT_STR,
    "cuda_graph_scope": _OPT_LIST, "recompute_granularity": _OPT_STR,
    "recompute_modules": _OPT_LIST, "recompute_num_layers": _OPT_INT,
    "moe_pad_expert_input_to_capacity": _OPT_BOOL, "moe_expert_capacity_factor": _OPT_NUM,
    "moe_expert_rank_capacity_factor": _OPT_NUM, "moe_permute_fusion": _OPT_BOOL,
    "moe_router_fusion": _OPT_BOOL, "cpu_offloading_num_layers": _OPT_INT,
    "offload_modules": _OPT_LIST, "use_megatron_fsdp": (bool,),
    "fp8_dot_product_attention": _OPT_BOOL, "pipeline_model_parallel_layout": _OPT_STR,
    "recipe_defaults": (list,),
    "provider_defaults": (list,),
    "provenance_tag": (str,), "provenance_file": (str,), "provenance_config": (str,),
}
_CHOICES = {"release": RELEASES, "gpu": GPUS, "precision": PRECISIONS,
            "moe_token_dispatcher_type": ("alltoall", "allgather", "flex", None),
            "moe_flex_dispatcher_backend": ("deepep", "hybridep", None)}


def _tuple(value: list[Any] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Recipe:
    """One perf config's effective settings. ``None`` means the code leaves the field to a default
    not resolved here (named in ``recipe_defaults``); ``provider_defaults`` names the fields whose
    value is a model-provider class default, with the provider file it was read from."""

    release: str
    model: str
    gpu: str
    precision: str
    variant: str
    num_gpus: int
    tp: int
    pp: int
    vp: int | None
    cp: int
    ep: int
    etp: int | None
    mbs: int
    gbs: int
    seq_len: int | None
    moe_token_dispatcher_type: str | None
    moe_flex_dispatcher_backend: str | None
    moe_a2a_overlap: bool | None
    delay_wgrad_compute: bool | None
    moe_shared_expert_overlap: bool | None
    cuda_graph_impl: str | None
    cuda_graph_scope: tuple[str, ...] | None = attrs.field(converter=_tuple)
    recompute_granularity: str | None
    recompute_modules: tuple[str, ...] | None = attrs.field(converter=_tuple)
    recompute_num_layers: int | None
    moe_pad_expert_input_to_capacity: bool | None
    moe_expert_capacity_factor: float | None
    moe_expert_rank_capacity_factor: float | None
    moe_permute_fusion: bool | None
    moe_router_fusion: bool | None
    cpu_offloading_num_layers: int | None
    offload_modules: tuple[str, ...] | None = attrs.field(converter=_tuple)
    use_megatron_fsdp: bool
    #: ``MixedPrecisionConfig.fp8_dot_product_attention``: TransformerEngine runs the core
    #: attention (QKᵀ, softmax, PV and their gradients) in fp8 (None: not resolved)
    fp8_dot_product_attention: bool | None
    #: ``model.pipeline_model_parallel_layout`` as Megatron-Core's layout string (``E``
    #: embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` between virtual
    #: stages); None: the recipe sets none (Megatron-Core's own split)
    pipeline_model_parallel_layout: str | None
    recipe_defaults: tuple[str, ...] = attrs.field(converter=tuple)
    provider_defaults: tuple[str, ...] = attrs.field(converter=tuple)
    provenance_tag: str
    provenance_file: str
    provenance_config: str

    @property
    def layout(self) -> tuple[int, int, int, int, int]:
        """(tp, pp, vp, cp, ep) with an unset virtual-pipeline size read as 1."""
        return (self.tp, self.pp, self.vp or 1, self.cp, self.ep)


def _row(data: Any, where: str) -> Recipe:
    if not isinstance(data, Mapping):
        raise SpecError(f"{where} expected a mapping, got {type(data).__name__}")
    keys = set(map(str, data))
    if keys != set(FIELD_TYPES):
        extra, missing = sorted(keys - set(FIELD_TYPES)), sorted(set(FIELD_TYPES) - keys)
        raise SpecError(f"{where} unknown keys {extra}, missing keys {missing}",
                        "the columns must be exactly the fields of zrt_core.recipes.FIELD_TYPES")
    for key, types in FIELD_TYPES.items():
        value = data[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise SpecError(f"{where}.{key} has type {type(value).__name__}, expected "
                            f"{' or '.join(t.__name__ for t in types)}")
        if key in _CHOICES and value not in _CHOICES[key]:
            raise SpecError(f"{where}.{key} is {value!r}, expected one of {_CHOICES[key]}")
    for key in ("cuda_graph_scope", "recompute_modules", "offload_modules", "recipe_defaults",
                "provider_defaults"):
        if data[key] is not None and not all(isinstance(x, str) for x in data[key]):
            raise SpecError(f"{where}.{key} must be a list of strings")
    unknown_default = set(data["recipe_defaults"]) - set(FIELD_TYPES)
    if unknown_default:
        raise SpecError(f"{where}.recipe_defaults names unknown fields {sorted(unknown_default)}")
    return Recipe(**data)


def parse_rows(text: str, name: str) -> tuple[Recipe, ...]:
    """The rows of a table text (``columns:`` names, ``rows:`` lists), validated field by field."""
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise SpecError(f"{name}: is not valid YAML ({str(exc).splitlines()[0]})") from None
    if (not isinstance(data, Mapping) or not isinstance(data.get("columns"), list)
            or not isinstance(data.get("rows"), list)):
        raise SpecError(f"{name}: expected a mapping with 'columns' and 'rows' lists")
    columns = [str(c) for c in data["columns"]]
    out = []
    for i, row in enumerate(data["rows"]):
        where = f"{name}: rows[{i}]"
        if not isinstance(row, list) or len(row) != len(columns):
            raise SpecError(f"{where} must be a list of {len(columns)} values, one per column")
        out.append(_row(dict(zip(columns, row, strict=True)), where))
    return tuple(out)


def load_rows(path: Any = None) -> tuple[Recipe, ...]:
    """Every row of the table (``path`` defaults to the bundled file, read once per process)."""
    if path is None:
        return _bundled()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_rows(text, str(path))


@cache
def _bundled() -> tuple[Recipe, ...]:
    text = (resources.files("zrt_core") / "data" / "recipes" / "megatron_bridge.yaml").read_text(
        encoding="utf-8")
    return parse_rows(text, "megatron_bridge.yaml")


def model_key(name: str) -> str | None:
    """The perf-config model key for a record's model name, or None when none is known."""
    low = name.lower()
    for pattern, key in MODEL_PATTERNS:
        if re.search(pattern, low):
            return key
    return None


def _settings(recipe: Recipe, *, batch: bool = True) -> tuple[Any, ...]:
    """Every field but the precision label, variant and provenance (and the global batch
    without ``batch``)."""
    skip = {"precision", "variant", "provenance_tag", "provenance_file", "provenance_config",
            *(() if batch else ("gbs",))}
    return tuple(v for f, v in attrs.asdict(recipe, recurse=False).items() if f not in skip)


def _agreed(found: list[Recipe], *, batch: bool = True) -> Recipe | None:
    """The first of ``found`` when they all share their settings, else None."""
    if not found or any(_settings(r, batch=batch) != _settings(found[0], batch=batch)
                        for r in found[1:]):
        return None
    return found[0]


def release_of(source: str) -> str | None:
    """The NeMo release a Megatron-Bridge record's source names ("NeMo 26.04" → "26.04")."""
    found = re.search(r"NeMo (\d\d\.\d\d(?:\.\d\d)?)\b", source)
    return found.group(1) if found else None


def _same_run(record: Mapping[str, Any], rows: tuple[Recipe, ...] | None, *,
              any_batch: bool = False) -> list[Recipe]:
    """Rows of a validation record's release, model, GPU, precision, GPU count and global
    batch (any global batch with ``any_batch``), whatever their layout."""
    rows = _bundled() if rows is None else rows
    release = release_of(str(record.get("source", "")))
    gpu = HARDWARE_GPU.get(str(record.get("hardware")))
    model = model_key(str((record.get("model") or {}).get("name", "")))
    precisions = RECORD_PRECISION.get(str(record.get("precision")), ())
    if release is None or gpu is None or model is None or not precisions:
        return []
    return [r for r in rows
            if r.release == release and r.model == model and r.gpu == gpu
            and r.precision in precisions and r.num_gpus == record.get("num_gpus")
            and (any_batch or r.gbs == record.get("global_batch"))]


def candidates(record: Mapping[str, Any], rows: tuple[Recipe, ...] | None = None
               ) -> list[Recipe]:
    """Rows matching a validation record's release, model, GPU, precision, GPU count, global
    batch, micro batch and published layout (tp, pp, vp, cp, ep; etp when the record gives it)."""
    return _printed_layout(record, _same_run(record, rows))


def _printed_layout(record: Mapping[str, Any], rows: list[Recipe]) -> list[Recipe]:
    par = record.get("parallel") or {}
    layout = (par.get("tp") or 1, par.get("pp") or 1, par.get("vp") or 1, par.get("cp") or 1,
              par.get("ep") or 1)
    return [r for r in rows
            if r.mbs == record.get("micro_batch") and r.layout == layout
            and (par.get("etp") is None or r.etp == par.get("etp"))]


def layout_conflict(record: Mapping[str, Any], rows: tuple[Recipe, ...] | None = None
                    ) -> Recipe | None:
    """A config of the record's release, model, GPU, precision, GPU count and global batch
    whose layout or micro batch differs from what the record prints, when no config has the
    printed one and every such config agrees (else None). The summaries sometimes print a
    layout their release's config does not run (GPT-OSS-120B on B200 in 25.11 prints EP 8;
    v0.2.0's ``GPT_OSS_120B_B200_BF16_BASE_CONFIG`` sets EP 64): a reader should know."""
    if candidates(record, rows):
        return None
    same = _same_run(record, rows)
    if not same or any((r.layout, r.mbs) != (same[0].layout, same[0].mbs) for r in same[1:]):
        return None
    return same[0]


def lookup(record: Mapping[str, Any], rows: tuple[Recipe, ...] | None = None) -> Recipe | None:
    """The perf config a record was measured with, or None when no row, or several rows with
    different settings, match (never a guess). Rows differing only in precision label (the
    summaries' "FP8" can be FP8-CS or FP8-SS) with equal settings give the first (FP8-CS).
    Without a row at the record's global batch, :func:`batch_override`."""
    found = candidates(record, rows)
    return _agreed(found) if found else batch_override(record, rows)


def batch_override(record: Mapping[str, Any], rows: tuple[Recipe, ...] | None = None
                   ) -> Recipe | None:
    """The config of the record's release, model, GPU, precision, GPU count, micro batch and
    printed layout at another global batch, when every such config agrees on everything but
    the global batch (else None). Megatron-Bridge's perf launcher takes the global batch on
    its command line (``-gb/--global_batch_size``, ``scripts/performance/argument_parser.py``
    at v0.5.1) over the config's, and the summaries print such runs: DeepSeek-V3 on 256 GB300
    in 26.06 at GBS 15,360 beside the config's 4,096, the same layout and 1.3% more tokens a
    second. The row keeps its own ``gbs``; the record's global batch is what is priced."""
    return _agreed(_printed_layout(record, _same_run(record, rows, any_batch=True)),
                   batch=False)
