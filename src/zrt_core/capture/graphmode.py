"""Graph mode: capture each phase through ``torch.compile`` (AOTAutograd's aten graphs).

The model runs under ``torch.compile(fullgraph=True, dynamic=False)`` with a backend built
by ``torch._dynamo.backends.common.aot_autograd`` whose forward, backward and inference
compilers only keep the FX ``GraphModule`` they receive and return it as the callable (so
the compiled model runs the aten graph eagerly, on the same fake tensors, with no
weights). Each time a compiled graph runs, its nodes become :class:`RawOp` values of the
phase then being recorded, so the rest of capture (formulas in
:mod:`zrt_core.capture.graphs`, templates, exporters) is the eager path's, unchanged:

- the operator is the node's ``OpOverload``; shapes and dtypes come from ``meta["val"]``
  (static shapes: ``dynamic=False``); non-tensor arguments are read by schema name as the
  eager recorder reads them;
- the module path and class come from ``meta["nn_module_stack"]`` (forward) or
  ``meta["fwd_nn_module_stack"]`` (backward: AOTAutograd copies the forward node's stack
  onto the backward nodes it produced), so layers, templates and fusion see the same
  attribution; gradient-accumulation adds AOTAutograd inserts carry none;
- :func:`zrt_core.capture.recorder.annotate` enters ``torch.fx.traceback.annotate`` while
  Dynamo traces, and the node's ``meta["custom"]`` (copied to backward nodes too) gives the
  annotations (``group_rows`` of a grouped GEMM...) back;
- dataflow edges are the FX edges; a graph's placeholders take the tensor ids of the
  runtime tensors they receive, so a backward graph's saved activations keep their forward
  ids and parameters keep their names.

``fullgraph=True``: a graph break would run part of the model outside any graph, unseen by
the backend (a ``TorchDispatchMode`` that could see it makes Dynamo skip the frame), so a
model Dynamo cannot trace whole is a :class:`CompileError` that points to eager mode.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from zrt_core.capture.options import CaptureOptions
from zrt_core.capture.phases import PhaseRunner
from zrt_core.capture.recorder import _SKIP as _SKIP_SENTINEL
from zrt_core.capture.recorder import RawOp, _json_scalar, _plan
from zrt_core.errors import ModelError
from zrt_core.ir.graph import Phase, TensorMeta

# the recorders of the phases being captured, innermost last (compiled graphs append to it)
_SINKS: list[GraphRecorder] = []


#: functional ops AOTAutograd emits for an in-place write into a view (``v.copy_(src)`` →
#: ``copy(v, src)`` + ``slice_scatter(base, copy, ...)``), priced as Inductor runs them
#: after its reinplacing pass (torch/_inductor/fx_passes/reinplace.py): the copy writes the
#: slice in place, the scatter moves nothing. (op, zero cost, all outputs views)
REINPLACED: dict[str, tuple[str, bool, bool]] = {
    "aten.copy.default": ("aten.copy_.default", False, False),
    **{f"aten.{kind}_scatter.default": (f"aten.{kind}_scatter.default", True, True)
       for kind in ("slice", "select", "diagonal", "as_strided")},
}


class CompileError(ModelError):
    """``torch.compile`` cannot trace the model (graph break, unsupported op or object)."""


def module_path(stack_entry: str) -> str:
    """Dynamo's module path (``L['self'].model.layers[0]._modules['mlp']``) as a dotted
    path of the model's own modules (``model.layers.0.mlp``).

    >>> module_path("L['args'][0].model.layers[0].self_attn.q_proj")
    'model.layers.0.self_attn.q_proj'
    >>> module_path("L['self']._modules['model']._modules['layers']['3']")
    'model.layers.3'
    >>> module_path("L['self']")
    ''
    """
    import re

    text = re.sub(r"^L\['[^']*'\](\[\d+\])?", "", stack_entry)
    text = re.sub(r"\._modules\['([^']*)'\]", r".\1", text)
    text = re.sub(r"\['([^']*)'\]|\[(\d+)\]", lambda m: "." + (m.group(1) or m.group(2)), text)
    return text.strip(".")


def _class_name(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    return str(value).rsplit(".", 1)[-1].strip("'>")


class _GraphPlan:
    """Per-node facts of one compiled graph, computed once and reused on every run."""

    def __init__(self, gm: Any, kind: str) -> None:
        self.gm = gm
        self.kind = kind
        self.nodes = list(gm.graph.nodes)
        self._paths: dict[str, str] = {}

    def source_node(self, node: Any) -> Any:
        """The node whose module a node belongs to: itself, or for a gradient-accumulation
        add AOTAutograd inserted (no module stack), the first consumer that has one — eager
        autograd sums the gradients in the input buffer of the node that consumes them."""
        if _stack(node) or not node.meta.get("is_gradient_acc"):
            return node
        seen, todo = set(), list(node.users)
        while todo:
            user = todo.pop(0)
            if user in seen:
                continue
            seen.add(user)
            if _stack(user):
                return user
            todo.extend(user.users)
        return node

    def attribution(self, node: Any) -> tuple[str, str]:
        stack = _stack(node)
        if not stack:
            return "", ""
        entry = list(stack.values())[-1]
        raw_path, cls = entry[0], entry[1]
        path = self._paths.get(raw_path)
        if path is None:
            path = self._paths[raw_path] = module_path(raw_path)
        return path, _class_name(cls)


def _stack(node: Any) -> Any:
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")


def make_backend() -> Any:
    """The ``torch.compile`` backend: AOTAutograd with recording compilers."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable[[Any, Any], Any]:
        def compile_fn(gm: Any, _example_inputs: Any) -> Any:
            plan = _GraphPlan(gm, kind)

            def run(args: list[Any]) -> Any:
                sink = _SINKS[-1] if _SINKS else None
                values = list(args)
                args.clear()  # boxed calling convention: the callee owns the inputs
                out = gm(*values)
                if sink is not None:
                    sink.record_graph(plan, values, out)
                return out

            run._boxed_call = True  # type: ignore[attr-defined]
            return run

        return compile_fn

    aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                       inference_compiler=compiler("inference"))

    def backend(gm: Any, example_inputs: Any) -> Any:
        from zrt_core.capture import graphmode_lean

        compiled = aot(gm, example_inputs)
        if graphmode_lean.SKIP_GUARDS:  # the code compiled here runs once (graphmode_lean)
            graphmode_lean.drop_guards()
        return compiled

    return backend


class GraphRecorder:
    """Stands in for :class:`OpRecorder` in graph mode: while open, every compiled graph
    that runs records its nodes into the session under :attr:`phase`."""

    def __init__(self, session: Any, phase: str, _modules: Any = None) -> None:
        self.session = session
        self.phase = phase

    def __enter__(self) -> GraphRecorder:
        _SINKS.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _SINKS.remove(self)

    def record_graph(self, plan: _GraphPlan, args: list[Any], out: Any) -> None:
        import torch

        session = self.session
        phase = self.phase
        ops = session.ops.setdefault(phase, [])
        # value of each node: a TensorMeta, a list of them (multi-output), or None
        env: dict[Any, Any] = {}
        producer_of: dict[int, int] = {}  # tensor id -> local op id (this graph)
        placeholders = 0
        for node in plan.nodes:
            if node.op == "placeholder":
                value = args[placeholders] if placeholders < len(args) else None
                placeholders += 1
                if isinstance(value, torch.Tensor):
                    env[node] = TensorMeta(shape=tuple(value.shape),
                                           dtype=_dtype(value.dtype), is_view=value._is_view(),
                                           tensor_id=session.tensor_id(value),
                                           param=session.param_name(value))
                continue
            if node.op == "get_attr":
                value = getattr(plan.gm, node.target, None)
                if isinstance(value, torch.Tensor):
                    env[node] = TensorMeta(shape=tuple(value.shape), dtype=_dtype(value.dtype),
                                           is_view=False, tensor_id=session.tensor_id(value))
                continue
            if node.op == "output":
                self._link_outputs(node, env, out)
                continue
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                parent, index = node.args
                value = env.get(parent)
                env[node] = value[index] if isinstance(value, list) and index < len(value) \
                    else None
                continue
            raw = self._raw(plan, node, env, phase, len(ops))
            producers = set()
            for meta in raw.inputs:
                local = producer_of.get(meta.tensor_id)
                if local is not None:
                    producers.add(local)
                else:
                    src = session._producer.get(meta.tensor_id)
                    if src is not None and src[0] == phase:
                        producers.add(src[1])
            raw.producers = sorted(producers)
            for meta in raw.outputs:
                producer_of[meta.tensor_id] = raw.local_id
                session._producer[meta.tensor_id] = (phase, raw.local_id)
            ops.append(raw)

    def _raw(self, plan: _GraphPlan, node: Any, env: dict[Any, Any], phase: str,
             local_id: int) -> RawOp:
        import torch

        target = node.target
        is_overload = isinstance(target, torch._ops.OpOverload)
        op_plan = _plan(target) if is_overload else None
        inputs: list[TensorMeta] = []
        attrs: dict[str, Any] = {}
        source_param = None

        def take(value: Any, name: str | None) -> None:
            nonlocal source_param
            if isinstance(value, torch.fx.Node):
                meta = env.get(value)
                if isinstance(meta, TensorMeta):
                    inputs.append(meta)
                    source_param = source_param or meta.param
            elif isinstance(value, list | tuple) and any(isinstance(v, torch.fx.Node)
                                                         for v in value):
                for v in value:
                    take(v, None)
            elif name is not None:
                js = _json_scalar(value)
                if js is not _SKIP_SENTINEL and js is not None:
                    attrs[name] = js

        if op_plan is not None:
            n_pos = len(node.args)
            for i, (name, _kind, _written) in enumerate(op_plan.args):
                if i < n_pos:
                    take(node.args[i], name)
                elif name in node.kwargs:
                    take(node.kwargs[name], name)
        else:
            for a in node.args:
                take(a, None)
            for k, v in node.kwargs.items():
                take(v, k)

        val = node.meta.get("val")
        results = val if isinstance(val, list | tuple) else (val,)
        views = op_plan.out_is_view if op_plan is not None else []
        outputs: list[TensorMeta] = []
        values: list[Any] = []
        for j, r in enumerate(results):
            if not isinstance(r, torch.Tensor):
                values.append(None)
                continue
            is_view = views[j] if j < len(views) else (views[-1] if views else False)
            meta = TensorMeta(shape=tuple(int(s) for s in r.shape), dtype=_dtype(r.dtype),
                              is_view=is_view, tensor_id=self.session.fresh_tensor_id(),
                              param=source_param if is_view else None)
            outputs.append(meta)
            values.append(meta)
        env[node] = values if isinstance(val, list | tuple) else values[0]

        source = plan.source_node(node)
        path, cls = plan.attribution(source)
        seq = source.meta.get("seq_nr")
        if isinstance(seq, int):
            attrs["fwd_seq_nr" if plan.kind == "backward" else "seq_nr"] = seq
        custom = node.meta.get("custom")
        if custom:
            for key, value in custom.items():
                js = _json_scalar(value)
                if js is not _SKIP_SENTINEL:
                    attrs[key] = js
            attrs["annotated"] = sorted(custom)
        if node.meta.get("is_gradient_acc"):
            attrs["gradient_accumulation"] = True
        name = op_plan.name if op_plan is not None else _target_name(target)
        zero_cost = op_plan.zero_cost if op_plan is not None else False
        all_view = op_plan.all_outputs_view if op_plan is not None else False
        if name == "aten.clone.default" and _is_dropout(node):
            # dropout outside training: torch's decomposition returns input.clone(), eager
            # returns the input itself (no kernel), and Inductor fuses the copy away
            zero_cost = all_view = True
            attrs["identity_dropout"] = True
        if name in REINPLACED:
            # functionalization's form of an in-place write into a view: Inductor's reinplace
            # pass writes the slice in place again, as eager's copy_ does
            name, zero_cost, all_view = REINPLACED[name]
            attrs["reinplaced"] = True
        return RawOp(op=name, phase=phase, local_id=local_id, inputs=inputs, outputs=outputs,
                     attrs=attrs, module_path=path, module_class=cls,
                     layer_index=self.session.layer_of(path) if path else None,
                     zero_cost=zero_cost, is_view_op=all_view)

    def _link_outputs(self, node: Any, env: dict[Any, Any], out: Any) -> None:
        """Give the runtime outputs the ids of the graph values they are, so the next graph
        (the backward's saved activations) reads them under those ids."""
        import torch

        returned = node.args[0] if node.args else ()
        returned = returned if isinstance(returned, list | tuple) else (returned,)
        results = out if isinstance(out, list | tuple) else (out,)
        for value, tensor in zip(returned, results, strict=False):
            meta = env.get(value) if isinstance(value, torch.fx.Node) else None
            if isinstance(meta, TensorMeta) and isinstance(tensor, torch.Tensor):
                self.session.bind_tensor_id(tensor, meta.tensor_id)


class NoModuleStack:
    """Graph mode reads modules from node meta: no global module hooks for Dynamo to trace."""

    current = ("", "")

    def __enter__(self) -> NoModuleStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class GraphPhaseRunner(PhaseRunner):
    """:class:`PhaseRunner` with the model called through ``torch.compile``."""

    recorder_class = GraphRecorder

    def __init__(self, model: Any, session: Any, modules: Any, options: CaptureOptions,
                 model_name: str) -> None:
        import torch

        super().__init__(model, session, modules, options, model_name)
        torch._dynamo.reset()  # nothing compiled by an earlier capture is reused
        self._compiled = torch.compile(model, backend=make_backend(), fullgraph=True,
                                       dynamic=False)

    def run(self) -> None:
        import torch

        from zrt_core.capture.graphmode_lean import lean_tracing

        try:
            with lean_tracing(self.model):
                super().run()
        finally:
            torch._dynamo.reset()

    def _call(self, phase: str, **kwargs: Any) -> Any:
        import torch

        from zrt_core.capture import graphmode_lean
        from zrt_core.capture.compat import cache_keyword
        from zrt_core.capture.graphmode_lean import DYNAMO_CONFIG, prefill_cache

        if graphmode_lean.SKIP_GUARDS:
            # compiled code without guards would match any later call: each phase compiles
            # on an empty Dynamo cache, so none is ever looked up again
            torch._dynamo.reset()
        keyword = cache_keyword(self.model)
        if phase == Phase.PREFILL and kwargs.get("use_cache") and kwargs.get(keyword) is None:
            cache = prefill_cache(self.model)  # the model's own empty cache, built untraced
            if cache is not None:
                kwargs[keyword] = cache
        try:
            # model code logs and warns (transformers' warning_once...): capture silences
            # them anyway, and under fullgraph each would be a graph break
            with torch._dynamo.config.patch(ignore_logging_functions=_logging_functions(),
                                            **DYNAMO_CONFIG):
                return self._compiled(**kwargs)
        except ModelError:
            raise
        except Exception as exc:
            raise compile_error(self.model_name, phase, exc) from exc


def compile_error(model: str, phase: str, exc: BaseException) -> CompileError:
    """One line naming what Dynamo/AOTAutograd could not trace, pointing to eager mode."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    explained = [ln for ln in lines[1:4] if ln.startswith("Explanation:")]
    if explained:  # Dynamo's Unsupported: the first line is generic, the next says what
        text = f"{text} ({explained[0].removeprefix('Explanation:').strip()})"
    if len(text) > 300:
        text = text[:297] + "..."
    return CompileError(f"{model}: torch.compile cannot trace {phase}: "
                        f"{type(exc).__name__}: {text}",
                        "capture in eager mode (drop --graph-mode)")


def _is_dropout(node: Any) -> bool:
    """Whether a node comes from a dropout call: its innermost module is a ``*Dropout`` or
    the source line that made it calls ``dropout(`` (BLOOM's ``dropout_add``)."""
    stack = _stack(node)
    if stack and _class_name(list(stack.values())[-1][1]).endswith("Dropout"):
        return True
    lines = (node.meta.get("stack_trace") or "").strip().splitlines()
    return bool(lines) and "dropout(" in lines[-2 if len(lines) > 1 else -1].lower()


def _logging_functions() -> set[Any]:
    import logging
    import warnings

    names = ("debug", "info", "warning", "warn", "error", "warning_once", "info_once")
    found = {getattr(logging.Logger, n) for n in names if hasattr(logging.Logger, n)}
    return found | {warnings.warn}


def _target_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    module = getattr(target, "__module__", "") or ""
    return f"{module}.{name}" if module and not str(name).startswith(module) else str(name)


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
