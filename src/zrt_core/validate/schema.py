"""The validation file's schema: workloads, metrics, the keys a record may have, the
serving precisions, and the suites zrt ships.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from zrt_core.errors import UnknownNameError

if TYPE_CHECKING:
    pass


SCHEMA_VERSION = 1
WORKLOADS = ("train", "infer", "layer")
FRONTENDS = ("capture", "analytic")

#: Measured quantities zrt predicts, per workload (anything else measured is kept and
#: shown, but has no error).
TRAIN_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "mfu")
INFER_METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "ttft_ms", "tpot_ms")
LAYER_METRICS = ("fwd_ms_per_layer", "bwd_ms_per_layer", "fwd_plus_bwd_ms_per_layer")
#: The quantity a record is ranked by (the first one it measured).
PRIMARY = {
    "train": ("step_time_s", "tokens_per_s_per_gpu", "mfu"),
    "infer": ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "tpot_ms", "ttft_ms"),
    "layer": ("fwd_plus_bwd_ms_per_layer", "fwd_ms_per_layer", "bwd_ms_per_layer"),
}
#: Throughput quantities pooled into the summary's ``mape_throughput``.
THROUGHPUT = ("tokens_per_s_per_gpu", "output_tokens_per_s")
#: ``mfu`` is as each source defined it (often hardware FLOPs): shown, never summarised.
INFORMATIONAL = frozenset({"mfu"})

_COMMON_KEYS = frozenset({"id", "source", "trust", "workload", "model", "hardware", "num_gpus",
                          "parallel", "precision", "measured", "notes"})
_TRAIN_KEYS = frozenset({"recompute", "micro_batch", "global_batch", "seq_len"})
_INFER_KEYS = frozenset({"input_len", "output_len", "concurrency", "max_batch"})
_LAYER_KEYS = frozenset({"recompute", "micro_batch", "seq_len", "layers_measured"})
#: Keys either workload may carry as null (public.yaml gives every record every key).
_KNOWN_KEYS = _COMMON_KEYS | _TRAIN_KEYS | _INFER_KEYS | _LAYER_KEYS
#: ``pipeline_model_parallel_layout`` and ``decoder_first/last_pipeline_num_layers`` give an
#: uneven pipeline split by Megatron's argument names (``STAGE_SPLIT_FIELDS``).
_PARALLEL_KEYS = frozenset({"tp", "pp", "vp", "cp", "ep", "etp", "dp", "sp", "zero", "fsdp",
                            "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
                            "decoder_last_pipeline_num_layers", "ep_dispatcher"})
_MODEL_KEYS = frozenset({"name", "hf_config"})

#: Record precision → (zrt weight/activation quantisation, KV-cache dtype) for serving.
#: The quantised checkpoints the published serving numbers use (NVIDIA ModelOpt FP8 and
#: NVFP4) set ``kv_cache_quant_algo: FP8`` in their ``hf_quant_config.json``.
SERVING_PRECISION = {
    "bf16": ("none", None),
    "fp16": ("none", None),
    "fp8": ("fp8", "fp8"),
    "mxfp8": ("fp8", "fp8"),
    "nvfp4": ("fp4", "fp8"),
}


#: Validation files shipped inside the package (``zrt validate --suite NAME``): ``public``
#: is ``../shared/validation/public.yaml``, the published measured runs with their sources
#: (a test keeps the copy equal to it).
SUITES = {"public": "public.yaml"}
# (zrt_core/data/validation: this module is one package below zrt_core)
SUITE_DIR = Path(__file__).parent.parent / "data" / "validation"


def suite_path(name: str) -> Path:
    """The shipped validation file of a suite.

    :raises UnknownNameError: no such suite.
    """
    if name not in SUITES:
        raise UnknownNameError(f"unknown validation suite {name!r}",
                               f"use one of {', '.join(SUITES)}, or pass a file")
    return SUITE_DIR / SUITES[name]


def _ro(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))
