"""``zrt_core.capture``: a model config in, one :class:`OpGraph` per phase out.

::

    import zrt_core

    result = zrt_core.capture("deepseek-v3", phases=("prefill", "decode"), batch=1,
                              seq_len=4096)
    g = result.graphs["decode"]
    print(g.totals().flops, result.params.active, result.warnings)

The model is built from its config on fake tensors (no weights, no GPU), every operator is
recorded, and one decoder layer per kind is captured and carried with its count (see
:mod:`zrt_core.capture.templates`). Model patches from every installed plugin
(``zrt_model_patches``) are entered around build and capture and removed afterwards;
formulas come from ``zrt_op_formulas``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.capture.build import ParamCounts
from zrt_core.capture.options import CaptureOptions
from zrt_core.errors import ModelError
from zrt_core.ir.graph import LayerTemplate, OpGraph, Phase, _frozen_mapping
from zrt_core.modelinfo import ModelDims

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost

# A captured phase whose FLOPs differ from the analytic reference by more than this is
# reported in CaptureResult.warnings.
FLOPS_GAP_WARN = 0.10


@frozen
class FlopsCheck:
    """Captured FLOPs of one phase against the analytic reference (whole model).

    :param reference: who counted ``analytic``: ``zrt-core``, or the distribution of the
        plugin whose ``zrt_reference_flops`` described a family the core does not.
    """

    phase: str
    captured: int
    analytic: int
    reference: str = "zrt-core"

    @property
    def gap(self) -> float | None:
        """``(captured − analytic) / analytic``; None without a reference."""
        return (self.captured - self.analytic) / self.analytic if self.analytic else None

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "captured": self.captured, "analytic": self.analytic,
                "gap": self.gap, "reference": self.reference}


@frozen
class CaptureResult:
    """What :func:`capture` returns. Stable: exporters and the CLI read these fields.

    :param model: the display name (bundled key, HF id, directory name or ``"config"``).
    :param model_type: the transformers model type that was built.
    :param source: where the config came from (``"bundled: llama3-8b (zrt-core)"``...).
    :param options: the :class:`CaptureOptions` of the run.
    :param graphs: one :class:`OpGraph` per captured phase, in capture order.
    :param params: total / per-token active parameters of the full model.
    :param dims: :class:`ModelDims` of the config, or None when it cannot be read.
    :param templates: the decoder-layer kinds (:class:`LayerTemplate`), as in each graph.
    :param timings_s: seconds spent: ``build`` (model on fake tensors) and each phase.
    :param flops_checks: captured against analytic FLOPs per phase, where the analytic
        front-end knows the family.
    :param warnings: ops without formulas, FLOPs gaps over 10%, notes on the model.
    :param config: the config mapping that was captured (the user's keys, the family's
        defaults for what they left out; the language model's part of a multimodal config).
    """

    model: str
    model_type: str
    source: str
    options: CaptureOptions
    graphs: Mapping[str, OpGraph] = field(converter=lambda g: dict(g))
    params: ParamCounts
    dims: ModelDims | None
    templates: tuple[LayerTemplate, ...] = field(converter=tuple)
    timings_s: Mapping[str, float] = field(converter=_frozen_mapping)
    flops_checks: Mapping[str, FlopsCheck] = field(converter=lambda c: dict(c))
    warnings: tuple[str, ...] = field(converter=tuple)
    config: Mapping[str, Any] = field(converter=_frozen_mapping)

    def graph(self, phase: str) -> OpGraph:
        try:
            return self.graphs[phase]
        except KeyError:
            raise ModelError(f"phase {phase!r} was not captured",
                             f"captured: {', '.join(self.graphs) or 'none'}") from None

    @property
    def missing_formulas(self) -> tuple[str, ...]:
        ops = set()
        for g in self.graphs.values():
            ops.update(g.missing_formulas)
        return tuple(sorted(ops))


def capture(
    model: str | os.PathLike[str] | Mapping[str, Any] | Any,
    phases: Iterable[str] | str = Phase.CAPTURED,
    batch: int = 1,
    seq_len: int = 2048,
    *,
    host: PluginHost | None = None,
    full_depth: bool = False,
    moe_imbalance: float = 1.0,
    dtype: str = "bfloat16",
    last_token_logits: bool = True,
    graph_mode: bool = False,
) -> CaptureResult:
    """Capture the operator graphs of a model's phases from its config alone.

    :param model: a bundled name (``zrt models``), a path to a ``config.json`` or its
        directory, a HuggingFace id already in the local HF cache, a config mapping, or a
        transformers ``PretrainedConfig``. Remote code is never executed.
    :param phases: any of ``prefill``, ``decode``, ``train_forward``, ``train_backward``.
    :param batch: sequences per step.
    :param seq_len: tokens per sequence (prefill, training); decode attends to a cache of
        ``seq_len`` tokens plus the new one.
    :param host: the plugin host whose model patches and formulas are used; a new one is
        built when None.
    :param full_depth: capture every decoder layer (tests compare it with the templates).
    :param moe_imbalance: busiest expert's load over the mean (1.0 = balanced routing).
    :param dtype: parameter/activation dtype: ``bfloat16``, ``float16`` or ``float32``.
    :param last_token_logits: prefill/decode compute logits for the last position only.
    :param graph_mode: capture through ``torch.compile`` (AOTAutograd's aten graphs, see
        :mod:`zrt_core.capture.graphmode`) instead of recording eager dispatch.
    :raises ModelError: the model cannot be found, parsed or built, a field is missing or
        invalid, an option is out of range, or the model code fails on fake tensors (one
        line each).
    """
    options = CaptureOptions(phases=phases, batch=batch, seq_len=seq_len,
                             full_depth=full_depth, moe_imbalance=moe_imbalance, dtype=dtype,
                             last_token_logits=last_token_logits, graph_mode=graph_mode)
    from zrt_core.capture.build import torch_dtype

    torch_dtype(options.dtype)  # reject a bad dtype before importing models
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    from zrt_core.capture.sources import check_capture_request

    check_capture_request(model, options.phases, options.seq_len, host)
    with _quiet_libraries():
        name, source, raw_config, hf_config = _resolve(model, host)
        return _Capture(name, source, raw_config, hf_config, options, host).run()


def _resolve(model: Any, host: PluginHost) -> tuple[str, str, dict[str, Any], Any]:
    """``(name, source, config mapping, transformers config)`` of what the user passed."""
    from zrt_core.capture.sources import resolve_model, transformers_config

    if hasattr(model, "to_dict") and hasattr(model, "model_type"):  # a PretrainedConfig
        raw = model.to_dict()
        name = str(getattr(model, "name_or_path", "") or raw.get("model_type") or "config")
        resolved = resolve_model({**raw, "_name_or_path": name}, host)
        source = "PretrainedConfig"
    else:
        resolved = resolve_model(model, host)
        source = resolved.source
    config = transformers_config(resolved.config, where=resolved.name, host=host)
    return resolved.name, source, dict(resolved.config), config


@frozen
class _Recorded:
    """What a capture run recorded, before formulas turn it into graphs."""

    session: Any
    templates: tuple[LayerTemplate, ...]
    params: ParamCounts
    num_layers: int
    kv_len: int | None
    timings_s: dict[str, float]


class _Capture:
    """One capture run: patches → build → templates → phases → graphs."""

    def __init__(self, name: str, source: str, raw_config: dict[str, Any], config: Any,
                 options: CaptureOptions, host: PluginHost) -> None:
        self.name = name
        self.source = source
        self.raw_config = raw_config
        self.options = options
        self.host = host
        self.outer_config = config
        self.warnings: list[str] = []

    def run(self) -> CaptureResult:
        from zrt_core.capture import build

        config, note = build.text_config_of(self.outer_config)
        if note:
            self.warnings.append(note)
        # the user's keys win (transformers renames some, e.g. num_experts →
        # num_local_experts); the built config's defaults fill in the rest
        raw = self.raw_config
        if config is not self.outer_config and isinstance(raw.get("text_config"), Mapping):
            raw = dict(raw["text_config"])
        config_dict = {**build.config_mapping(config), **raw}
        dims = self._dims(config_dict)
        recorded = self._record(config, dims)
        graphs = self._graphs(config, recorded)
        for phase, g in graphs.items():
            missing = g.missing_formulas
            if missing:
                self.warnings.append(f"{phase}: no formula for {', '.join(missing)} "
                                     "(counted as 0 FLOPs)")
        checks = self._flops_checks(config_dict, graphs, recorded.kv_len)
        return CaptureResult(
            model=self.name, model_type=str(getattr(config, "model_type", "")),
            source=self.source, options=self.options, graphs=graphs, params=recorded.params,
            dims=dims, templates=recorded.templates, timings_s=recorded.timings_s,
            flops_checks=checks, warnings=self.warnings, config=config_dict,
        )

    def _record(self, config: Any, dims: ModelDims | None) -> _Recorded:
        """Patches entered → fake model built → kinds found → phases run and recorded."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        from zrt_core.capture import build, templates
        from zrt_core.capture.phases import PhaseRunner
        from zrt_core.capture.recorder import CaptureSession, ModuleStack
        from zrt_core.capture.sources import plugin_model_type

        num_experts = dims.experts if dims is not None else 0
        top_k = dims.top_k if dims is not None else 0
        fake_mode = FakeTensorMode()
        timings: dict[str, float] = {}
        with contextlib.ExitStack() as patches:
            for patch in self._patches(config):
                patches.enter_context(patch.context(config, self.options))
            start = time.perf_counter()
            plugin_type = plugin_model_type({"model_type": config.model_type}, self.host)
            model = build.build_fake_model(
                config, self.options.dtype, fake_mode,
                model_class=plugin_type.model_class() if plugin_type is not None else None)
            timings["build"] = time.perf_counter() - start
            params = build.count_params(model, num_experts, top_k)

            num_layers = int(build.config_value(config, "num_hidden_layers", "n_layer",
                                                "num_layers", default=0))
            prefix, layer_list = templates.find_layer_list(model, num_layers)
            kinds: list[templates.LayerKind] = []
            if layer_list is None:
                self.warnings.append(f"{config.model_type}: no decoder-layer list of length "
                                     f"{num_layers} found; capturing every layer")
            else:
                kinds = templates.group_layers(list(layer_list),
                                               getattr(config, "layer_types", None),
                                               num_experts,
                                               getattr(config, "mlp_layer_types", None))

            names = {m: (n, type(m).__name__) for n, m in model.named_modules()}
            param_names = {p: n for n, p in model.named_parameters()}
            session = CaptureSession(param_names, names,
                                     f"{prefix}." if layer_list is not None else None)
            hooks = []
            if layer_list is not None and not self.options.full_depth:
                hooks = templates.install_templates(layer_list, kinds)
            if self.options.graph_mode:
                from zrt_core.capture.graphmode import GraphPhaseRunner, NoModuleStack

                runner: PhaseRunner = GraphPhaseRunner(model, session, NoModuleStack(),
                                                       self.options, self.name)
            else:
                runner = PhaseRunner(model, session, ModuleStack(names), self.options,
                                     self.name)
            try:
                with fake_mode, runner.modules:
                    runner.run()
            finally:
                for h in hooks:
                    h.remove()
        timings.update(runner.timings_s)
        self.warnings.extend(runner.notes)
        return _Recorded(session=session, templates=self._graph_templates(kinds),
                         params=params, num_layers=num_layers, kv_len=runner.kv_len,
                         timings_s=timings)

    def _graphs(self, config: Any, recorded: _Recorded) -> dict[str, OpGraph]:
        import torch
        import transformers

        from zrt_core.capture.graphs import build_graph

        meta_base = {
            "model": self.name, "model_type": str(getattr(config, "model_type", "")),
            "source": self.source, "batch": self.options.batch,
            "seq_len": self.options.seq_len, "dtype": self.options.dtype,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "full_depth": self.options.full_depth, "moe_imbalance": self.options.moe_imbalance,
            "capture_mode": "graph" if self.options.graph_mode else "eager",
            "num_layers": recorded.num_layers,
            "logits_positions": 1 if self.options.last_token_logits else self.options.seq_len,
        }
        graphs: dict[str, OpGraph] = {}
        registry = self.host.formulas
        for phase in self.options.phases:
            meta = dict(meta_base)
            if phase == Phase.DECODE:
                meta["kv_len"] = recorded.kv_len
            if phase.startswith("train"):
                meta["logits_positions"] = self.options.seq_len
            graphs[phase] = build_graph(phase, recorded.session.ops.get(phase, []), registry,
                                        recorded.templates, meta, self.warnings)
        return graphs

    def _dims(self, config_dict: dict[str, Any]) -> ModelDims | None:
        try:
            return ModelDims.from_config(config_dict)
        except ModelError as exc:
            self.warnings.append(f"model dimensions unreadable: {exc}")
            return None

    def _patches(self, config: Any) -> list[Any]:
        out = []
        for patch in self.host.model_patches:
            try:
                applies = bool(patch.applies_to(config))
            except Exception as exc:
                raise ModelError(f"model patch {patch.name!r} failed to decide whether it "
                                 f"applies: {type(exc).__name__}: {exc}",
                                 "fix or disable the plugin that contributes it") from exc
            if applies:
                out.append(patch)
        return out

    def _graph_templates(self, kinds: list[Any]) -> tuple[LayerTemplate, ...]:
        if self.options.full_depth:
            return tuple(LayerTemplate(kind=k.kind, representative=i, indices=(i,))
                         for k in kinds for i in k.indices)
        return tuple(LayerTemplate(kind=k.kind, representative=k.representative,
                                   indices=k.indices) for k in kinds)

    def _flops_checks(self, config_dict: dict[str, Any], graphs: Mapping[str, OpGraph],
                      kv_len: int | None) -> dict[str, FlopsCheck]:
        try:
            from zrt_core.modelmath import flops as analytic
        except ImportError:
            return {}
        checks: dict[str, FlopsCheck] = {}
        for phase, g in graphs.items():
            length = kv_len if phase == Phase.DECODE and kv_len else self.options.seq_len
            try:
                ref, source = analytic.reference_flops(config_dict, phase, self.options.batch,
                                                       length, host=self.host)
            except ModelError as exc:
                self.warnings.append(f"{phase}: no analytic FLOPs to check against ({exc})")
                continue
            check = FlopsCheck(phase=phase, captured=g.totals().flops, analytic=ref.total,
                               reference=source)
            checks[phase] = check
            gap = check.gap
            if gap is not None and abs(gap) > FLOPS_GAP_WARN:
                self.warnings.append(
                    f"{phase}: captured FLOPs {check.captured:.4g} differ from the analytic "
                    f"{check.analytic:.4g} by {gap:+.1%} (the graph follows HF's reference "
                    "code; a model patch may be needed to match production kernels)")
        return checks


#: Library loggers silenced while capturing (transformers has its own verbosity switch).
QUIET_LOGGERS = ("torch._subclasses.fake_tensor", "torch", "huggingface_hub")


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Silence library output while capturing: FakeTensorMode logs a traceback for every
    failed meta kernel, transformers and huggingface_hub log and ``warnings.warn`` about
    config fields and deprecations; zrt reports one line (stderr carries only zrt's).
    Scoped: every logger level, the transformers verbosity and the warning filters are
    restored on exit, so a program that imports zrt keeps its own settings.

    The cyclic garbage collector is paused too: building a model allocates tens of
    thousands of objects, and full collections in the middle cost more than the capture.
    """
    import gc
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [log.level for log in loggers]
    verbosity = hf_logging.get_verbosity()
    gc_was_enabled = gc.isenabled()
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    hf_logging.set_verbosity_error()
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        if gc_was_enabled:
            gc.enable()
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
        hf_logging.set_verbosity(verbosity)
