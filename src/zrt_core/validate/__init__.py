"""``zrt validate``: predict every published measurement of a validation file and compare.

A validation file is a YAML list of records in the format of
``../shared/validation/SCHEMA.md`` (version 1): a model (a HuggingFace config mapping), a
machine, a parallel layout, a workload and what was measured. :func:`validate` predicts
each record with :func:`~zrt_core.estimate.training.estimate_training` (``workload:
train``), :func:`~zrt_core.estimate.estimate_inference` (``workload: infer``) or, for the
per-layer records of ``layer_micro.yaml`` (``layers_measured``, no ``workload``), the
training estimator's per-layer timelines, and reports ``(predicted − measured) /
measured`` for every measured quantity that zrt predicts.

The file is read strictly but tolerantly: a file that is not a list of mappings is an
error (exit 2); a record with an unknown key, a missing field, an unsupported model type,
a layout that does not divide the model or anything else zrt cannot predict becomes a
``status: error`` row with a one-line reason, and the run goes on.

Fields a source did not publish are ``null``; :func:`training_case`,
:func:`inference_case` and :func:`layer_case` take the defaults the named framework uses
(docs/validation.md lists them), and every default taken is listed in the record's
``assumptions``.

Captures are shared across records (one per model config, micro-batch, sequence and dtype
for training; per config and prompt length for serving) and kept on disk by the
estimators' capture caches (``$ZRT_CACHE_DIR``, see :mod:`zrt_core.estimate.captures`), so
a second run needs no torch. ``frontend="analytic"`` builds the graphs from the model numbers instead
(:mod:`zrt_core.analytic.builder`): no torch at all.
"""

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core.checks import (  # noqa: F401  (the old module's imported names)
    check_infer_request,
    check_train_request,
)
from zrt_core.errors import (  # noqa: F401  (the old module's imported names)
    ModelError,
    SpecError,
    UnknownNameError,
    ZrtError,
)
from zrt_core.ir.graph import (  # noqa: F401  (the old module's imported names)
    Phase,
)
from zrt_core.source_flops import (  # noqa: F401  (the old module's imported names)
    published_model_flops,
)
from zrt_core.validate.cases import (
    InferenceCase,
    inference_case,
    layer_case,
    training_case,
)
from zrt_core.validate.records import (  # noqa: F401
    Record,
    _need_int,
    _workload_of,
    check_record,
    load_records,
    records_from_data,
)
from zrt_core.validate.results import (  # noqa: F401
    RecordResult,
    ValidationRun,
    _mape,
)
from zrt_core.validate.run import (  # noqa: F401
    Validator,
    _key,
    _notes,
    _one_line,
    _per_layer_s,
    validate,
)
from zrt_core.validate.schema import (  # noqa: F401
    _COMMON_KEYS,
    _INFER_KEYS,
    _KNOWN_KEYS,
    _LAYER_KEYS,
    _MODEL_KEYS,
    _PARALLEL_KEYS,
    _TRAIN_KEYS,
    FRONTENDS,
    INFER_METRICS,
    INFORMATIONAL,
    LAYER_METRICS,
    PRIMARY,
    SCHEMA_VERSION,
    SERVING_PRECISION,
    SUITE_DIR,
    SUITES,
    THROUGHPUT,
    TRAIN_METRICS,
    WORKLOADS,
    _ro,
    suite_path,
)

__all__ = [
    "FRONTENDS",
    "INFER_METRICS",
    "LAYER_METRICS",
    "SERVING_PRECISION",
    "SUITES",
    "TRAIN_METRICS",
    "InferenceCase",
    "Record",
    "RecordResult",
    "ValidationRun",
    "Validator",
    "check_record",
    "inference_case",
    "layer_case",
    "load_records",
    "records_from_data",
    "suite_path",
    "training_case",
    "validate",
]
