"""Captures for estimation: one per model and prompt length, reused across layouts, batches
and output lengths, and kept on disk so a second run needs no torch at all.

:func:`load_or_capture` captures ``prefill`` and ``decode`` at batch 1 and the prompt
length; everything that depends on the layout, the batch or the KV length is derived from
those two graphs by transforms (:mod:`zrt_core.transforms.parallel`,
:class:`zrt_core.estimate.serving.Rescale`), which re-price each node exactly.

The disk cache lives in ``$ZRT_CACHE_DIR`` (default ``~/.cache/zrt``)/``captures``. Its key
covers the config, the capture options, and the versions of zrt-core, torch, transformers
and every installed zrt plugin, so a change to any of them captures again.
``ZRT_NO_CACHE=1`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.errors import ModelError
from zrt_core.ir.graph import OpGraph, _frozen_mapping, _thaw
from zrt_core.modelinfo import ModelDims
from zrt_core.transforms.parallel import TPPlan

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost

CACHE_VERSION = 1
PHASES = ("prefill", "decode")


class CapturedGraphs:
    """What the serving and the training captures share: the model's dimensions from its
    config and a phase's graph by name (subclasses are attrs classes with ``config`` and
    ``graphs``)."""

    __slots__ = ()
    config: Mapping[str, Any]
    graphs: Mapping[str, OpGraph]

    @property
    def dims(self) -> ModelDims:
        return ModelDims.from_config(dict(_thaw(self.config)))

    def graph(self, phase: str) -> OpGraph:
        try:
            return self.graphs[phase]
        except KeyError:
            raise ModelError(f"phase {phase!r} was not captured",
                             f"captured: {', '.join(self.graphs)}") from None


@frozen
class CapturedModel(CapturedGraphs):
    """What estimation needs from a capture: the graphs, dimensions, parameter counts and
    the config's tensor-parallel plan.

    :param graphs: ``prefill`` (batch 1, ``seq_len`` tokens) and ``decode`` (batch 1, one
        token against a cache of ``seq_len``).
    :param total_params: parameters of the whole model.
    :param tp_plan: the config class's ``base_model_tp_plan`` (empty when it has none).
    """

    name: str
    model_type: str
    config: Mapping[str, Any] = field(converter=_frozen_mapping)
    graphs: Mapping[str, OpGraph] = field(converter=lambda g: dict(g))
    total_params: int
    active_params: int
    seq_len: int
    dtype: str = "bfloat16"
    tp_plan: TPPlan = field(factory=TPPlan)
    warnings: tuple[str, ...] = field(default=(), converter=tuple)
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"cache_version": CACHE_VERSION, "name": self.name,
                "model_type": self.model_type, "config": _thaw(self.config),
                "graphs": {k: g.to_json() for k, g in self.graphs.items()},
                "total_params": self.total_params, "active_params": self.active_params,
                "seq_len": self.seq_len, "dtype": self.dtype,
                "tp_plan": {"entries": [list(e) for e in self.tp_plan.entries],
                            "source": self.tp_plan.source},
                "warnings": list(self.warnings), "source": self.source}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapturedModel:
        plan = data.get("tp_plan") or {}
        return cls(name=data["name"], model_type=data["model_type"], config=data["config"],
                   graphs={k: OpGraph.from_json(g) for k, g in data["graphs"].items()},
                   total_params=int(data["total_params"]),
                   active_params=int(data["active_params"]), seq_len=int(data["seq_len"]),
                   dtype=data.get("dtype", "bfloat16"),
                   tp_plan=TPPlan(entries=tuple(tuple(e) for e in plan.get("entries", ())),
                                  source=plan.get("source", "module-name rules")),
                   warnings=data.get("warnings", ()), source=data.get("source", ""))

    @classmethod
    def from_capture(cls, result: Any, tp_plan: TPPlan | None = None) -> CapturedModel:
        """From a :class:`zrt_core.capture.CaptureResult` holding prefill and decode."""
        missing = [p for p in PHASES if p not in result.graphs]
        if missing:
            raise ModelError(f"the capture has no {', '.join(missing)} graph",
                             "capture with phases=('prefill', 'decode')")
        prefill = result.graphs["prefill"]
        return cls(name=result.model, model_type=result.model_type, config=result.config,
                   graphs={p: result.graphs[p] for p in PHASES},
                   total_params=result.params.total, active_params=result.params.active,
                   seq_len=int(prefill.meta.get("seq_len", result.options.seq_len)),
                   dtype=result.options.dtype,
                   tp_plan=tp_plan if tp_plan is not None else config_tp_plan(
                       result.model_type),
                   warnings=result.warnings, source=result.source)


def config_tp_plan(model_type: str) -> TPPlan:
    """``base_model_tp_plan`` of the transformers config class of ``model_type``.

    Read only when transformers is already imported (a capture just ran): estimation never
    imports torch for it. Otherwise the module-name rules apply, which agree with the
    plans of the families zrt ships (tests hold them to it).
    """
    if "transformers" not in sys.modules:
        return TPPlan()
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        plan = getattr(CONFIG_MAPPING[model_type], "base_model_tp_plan", None)
    except Exception:
        return TPPlan()
    return TPPlan.from_mapping(plan, f"{model_type} base_model_tp_plan (transformers)")


def cache_dir() -> Path:
    root = os.environ.get("ZRT_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "zrt"
    return base / "captures"


def _versions(host: PluginHost | None) -> dict[str, str]:
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in ("zrt-core", "torch", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "?"
    del host
    # editable installs keep their version while the capture code changes: key on it too
    root = Path(__file__).resolve().parents[1]  # the zrt_core package directory
    stats = []
    for sub in ("capture", "formulas"):
        for f in sorted((root / sub).glob("*.py")):
            st = f.stat()
            stats.append(f"{sub}/{f.name}:{st.st_size}:{int(st.st_mtime)}")
    out["zrt-core-capture"] = hashlib.sha256("|".join(stats).encode()).hexdigest()[:16]
    try:
        for ep in metadata.entry_points(group="zrt"):
            dist = ep.dist
            if dist is not None:
                out[f"plugin:{ep.name}"] = (f"{dist.metadata['Name']}=={dist.version}"
                                            f"@{_package_stamp(ep.module)}")
    except Exception:  # listing plugins must not break estimation
        pass
    return out


def _package_stamp(module: str) -> str:
    """Sizes and times of the Python files of a plugin's top-level package: an editable
    plugin's patches and formulas change what a capture records without a new version."""
    import importlib.util

    spec = importlib.util.find_spec(module.split(".")[0])
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    stats = []
    for root in roots:
        for f in sorted(Path(root).rglob("*.py")):
            st = f.stat()
            stats.append(f"{f.relative_to(root)}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha256("|".join(stats).encode()).hexdigest()[:16]


def cache_key(config: Mapping[str, Any], seq_len: int, dtype: str,
              host: PluginHost | None, *, graph_mode: bool = False) -> str:
    payload = {"v": CACHE_VERSION, "config": config, "phases": PHASES, "batch": 1,
               "seq_len": seq_len, "dtype": dtype, "versions": _versions(host)}
    if graph_mode:  # torch.compile captures differ from eager ones (docs/graph-mode.md)
        payload["capture_mode"] = "graph"
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_or_capture(model: Any, seq_len: int, *, host: PluginHost, dtype: str = "bfloat16",
                    use_cache: bool | None = None, graph_mode: bool = False
                    ) -> CapturedModel:
    """The prefill and decode graphs of ``model`` at batch 1 and ``seq_len`` tokens.

    :param model: anything :func:`zrt_core.capture` accepts, or a :class:`CapturedModel`.
    :param use_cache: read and write the disk cache (default: unless ``ZRT_NO_CACHE=1``).
    :param graph_mode: capture through ``torch.compile`` (its own cache entries).
    """
    if isinstance(model, CapturedModel):
        return model
    if use_cache is None:
        use_cache = os.environ.get("ZRT_NO_CACHE", "") not in ("1", "true", "yes")
    path = None
    if use_cache and (isinstance(model, str | os.PathLike) or isinstance(model, Mapping)):
        from zrt_core.capture.sources import resolve_model

        resolved = resolve_model(model, host, check_model_type=False)
        key = cache_key(resolved.config, seq_len, dtype, host, graph_mode=graph_mode)
        path = cache_dir() / f"{resolved.name.replace('/', '--')[:60]}-{key}.json"
        if path.is_file():
            try:
                return CapturedModel.from_json(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError):
                pass  # a stale or damaged entry: capture again
    from zrt_core.capture.api import capture

    result = capture(model, phases=PHASES, batch=1, seq_len=seq_len, host=host, dtype=dtype,
                     graph_mode=graph_mode)
    captured = CapturedModel.from_capture(result)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(captured.to_json(), separators=(",", ":")))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: estimation still works, only slower next time
    return captured
