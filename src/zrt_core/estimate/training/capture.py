"""Training captures: ``train_forward`` and ``train_backward`` of one micro-batch, captured once
per model, micro-batch, sequence and dtype and reused across layouts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.errors import ModelError
from zrt_core.estimate.captures import CapturedGraphs
from zrt_core.ir.graph import (
    OpGraph,
    Phase,
    _frozen_mapping,
    _thaw,
)

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost


# -- captures ---------------------------------------------------------------------------------


@frozen
class TrainingCapture(CapturedGraphs):
    """What the estimator needs from a capture: ``train_forward`` and ``train_backward`` of
    one micro-batch, the config and the model's name; stored as JSON in the capture cache.
    """

    name: str
    model_type: str
    config: Mapping[str, Any] = field(converter=_frozen_mapping)
    graphs: Mapping[str, OpGraph] = field(converter=lambda g: dict(g))
    micro_batch: int
    seq_len: int
    dtype: str = "bfloat16"
    tp_plan: Any = None

    @property
    def model(self) -> str:
        return self.name

    @classmethod
    def from_capture(cls, result: Any) -> TrainingCapture:
        """From a :class:`zrt_core.capture.CaptureResult` holding both training phases."""
        from zrt_core.estimate.captures import config_tp_plan

        missing = [p for p in TRAIN_PHASES if p not in result.graphs]
        if missing:
            raise ModelError(f"the capture has no {', '.join(missing)} graph",
                             "capture with phases=('train_forward', 'train_backward')")
        fwd = result.graphs[Phase.TRAIN_FORWARD]
        return cls(name=result.model, model_type=result.model_type, config=result.config,
                   graphs={p: result.graphs[p] for p in TRAIN_PHASES},
                   micro_batch=int(fwd.meta.get("batch", result.options.batch)),
                   seq_len=int(fwd.meta.get("seq_len", result.options.seq_len)),
                   dtype=result.options.dtype, tp_plan=config_tp_plan(result.model_type))

    def to_json(self) -> dict[str, Any]:
        return {"cache_version": TRAIN_CACHE_VERSION, "name": self.name,
                "model_type": self.model_type, "config": _thaw(self.config),
                "graphs": {k: g.to_json() for k, g in self.graphs.items()},
                "micro_batch": self.micro_batch, "seq_len": self.seq_len,
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingCapture:
        if data.get("cache_version") != TRAIN_CACHE_VERSION:
            raise ValueError("stale cache entry")
        return cls(name=data["name"], model_type=data["model_type"], config=data["config"],
                   graphs={k: OpGraph.from_json(g) for k, g in data["graphs"].items()},
                   micro_batch=int(data["micro_batch"]), seq_len=int(data["seq_len"]),
                   dtype=data.get("dtype", "bfloat16"))


TRAIN_PHASES = (Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD)
TRAIN_CACHE_VERSION = 1
_CAPTURES: dict[tuple[str, int, int, str], TrainingCapture] = {}
_CAPTURE_CACHE_SIZE = 8


def capture_for_training(model: Any, micro_batch: int, seq_len: int, *, dtype: str = "bfloat16",
                         host: PluginHost | None = None, use_cache: bool | None = None,
                         graph_mode: bool = False) -> TrainingCapture:
    """``train_forward`` + ``train_backward`` of one micro-batch, kept in memory and in the
    capture cache on disk (``$ZRT_CACHE_DIR/captures``, keyed like serving captures on the
    config, the options and the installed versions; ``ZRT_NO_CACHE=1`` or
    ``use_cache=False`` turns it off), so a layout search or a second run re-uses it.
    ``graph_mode``: capture through ``torch.compile`` (AOTAutograd's forward and backward
    graphs; its own cache entries)."""
    import os

    from zrt_core.capture.api import capture

    if isinstance(model, TrainingCapture):
        return model
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    key_model = (json.dumps(dict(model), sort_keys=True, default=str)
                 if isinstance(model, Mapping) else str(model))
    key = (key_model, micro_batch, seq_len, dtype) + (("graph",) if graph_mode else ())
    hit = _CAPTURES.get(key)
    if hit is not None:
        return hit
    if use_cache is None:
        use_cache = os.environ.get("ZRT_NO_CACHE", "") not in ("1", "true", "yes")
    path = None
    if use_cache and isinstance(model, str | os.PathLike | Mapping):
        from zrt_core.capture.sources import resolve_model
        from zrt_core.estimate.captures import cache_dir, cache_key

        resolved = resolve_model(model, host, check_model_type=False)
        marked = {**dict(resolved.config), "_zrt_training_micro_batch": micro_batch}
        digest = cache_key(marked, seq_len, dtype, host, graph_mode=graph_mode)
        path = cache_dir() / f"train-{resolved.name.replace('/', '--')[:60]}-{digest}.json"
        if path.is_file():
            try:
                result = TrainingCapture.from_json(json.loads(path.read_text()))
                _remember(key, result)
                return result
            except (ValueError, KeyError, TypeError):
                pass  # stale or damaged: capture again
    raw = capture(model, phases=TRAIN_PHASES, batch=micro_batch, seq_len=seq_len, host=host,
                  dtype=dtype, graph_mode=graph_mode)
    result = TrainingCapture.from_capture(raw)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(result.to_json(), separators=(",", ":")))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: estimation works, only slower next time
    _remember(key, result)
    return result


def _remember(key: tuple[Any, ...], result: TrainingCapture) -> None:
    if len(_CAPTURES) >= _CAPTURE_CACHE_SIZE:
        _CAPTURES.pop(next(iter(_CAPTURES)))
    _CAPTURES[key] = result


def capture_dtype(precision: str) -> str:
    return {"fp16": "float16", "fp32": "float32"}.get(precision, "bfloat16")
