"""Record every aten (and custom) operator a model runs, with shapes, modules and dataflow.

:class:`OpRecorder` is a ``TorchDispatchMode``: it sees each operator once, below autograd,
after FakeTensorMode has computed the output shapes. For every operator it records the
overload name, the tensors read and written (schema order), the non-tensor arguments by
schema name, the module that was running (forward) and the autograd sequence number that
ties forward and backward together. ``prim.*`` dispatches (device queries, 40–70% of raw
events under fake tensors) are skipped.

Attribution of backward operators: while autograd runs a backward node,
``torch._C._current_autograd_node()`` is that node and its ``_sequence_nr()`` equals the
sequence number autograd gave the forward operator that created it (read in forward as
``torch.autograd._get_sequence_nr() - 1`` right after the node was created). Each backward
operator therefore inherits the module path and layer of its forward operator — exact,
where module hooks attribute only part of backward.

Tensor ids are handed out per tensor object (a weak identity map), from one counter per
:class:`CaptureSession`, so they are unique across all phases of a capture run, and a
backward node's input produced in forward keeps its forward id.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping
from typing import Any

from attrs import define, field

from zrt_core.ir.graph import Category, TensorMeta

# Operators that move no data and compute nothing: kept in the graph, priced at zero, with
# the category they are listed under. (Ops whose schema says they return views are
# zero-cost views without being listed.)
_ZERO_COST_BY_CATEGORY = {
    Category.VIEW: ("aten._unsafe_view", "aten.lift_fresh", "aten.lift_fresh_copy",
                    "aten._reshape_alias", "aten.set_", "aten.resize_"),
    Category.CREATION: ("aten.empty", "aten.empty_like", "aten.empty_strided",
                        "aten.new_empty", "aten.new_empty_strided", "aten.empty_permuted"),
    Category.OTHER: ("aten._local_scalar_dense", "aten.sym_size", "aten.sym_stride",
                     "aten.sym_numel", "aten.sym_storage_offset", "aten.is_same_size",
                     "aten._assert_async", "aten._assert_tensor_metadata",
                     "aten._assert_scalar", "aten.record_stream",
                     "aten._has_compatible_shallow_copy_type",
                     "aten._functional_assert_async", "aten.is_nonzero", "aten.equal"),
}
ZERO_COST_OPS: Mapping[str, str] = {op: cat for cat, ops in _ZERO_COST_BY_CATEGORY.items()
                                    for op in ops}

_UINT64_MAX = 2**64 - 1

# Extra attrs the current code region attaches to every operator it records (see annotate).
_ANNOTATIONS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "zrt_capture_annotations", default=None)


@contextlib.contextmanager
def annotate(**attrs: Any) -> Iterator[None]:
    """Attach ``attrs`` to every operator recorded inside the block, and to its backward.

    Used by model patches to tell formulas what shapes alone cannot, e.g. the rows each
    expert receives under the routing assumption (``group_rows``) on a grouped GEMM.
    Values must be JSON scalars or lists of them.
    """
    import torch

    if torch.compiler.is_compiling():  # Dynamo tracing (graph mode): FX node meta["custom"]
        with torch.fx.traceback.annotate(dict(attrs)):
            yield
        return
    current = _ANNOTATIONS.get()
    merged = {**(current or {}), **attrs}
    token = _ANNOTATIONS.set(merged)
    try:
        yield
    finally:
        _ANNOTATIONS.reset(token)


@define
class RawOp:
    """One recorded call, before formulas are applied (see :mod:`zrt_core.capture.graphs`)."""

    op: str
    phase: str
    local_id: int
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]
    attrs: dict[str, Any]
    module_path: str
    module_class: str
    layer_index: int | None
    zero_cost: bool
    is_view_op: bool
    producers: list[int] = field(factory=list)


@define
class _OpPlan:
    """What the recorder needs from an operator's schema, computed once per overload."""

    name: str
    namespace: str
    args: list[tuple[str, str, bool]]  # (name, kind, is_written)
    out_is_view: list[bool]
    all_outputs_view: bool
    zero_cost: bool


def _plan(func: Any) -> _OpPlan:
    schema = func._schema
    args = []
    for a in schema.arguments:
        t = str(a.type)
        if t in ("Tensor", "Optional[Tensor]", "Tensor?"):
            kind = "tensor"
        elif t in ("List[Tensor]", "Tensor[]", "List[Optional[Tensor]]", "Tensor?[]"):
            kind = "tensor_list"
        else:
            kind = "scalar"
        written = bool(a.alias_info is not None and a.alias_info.is_write)
        args.append((a.name, kind, written))
    out_is_view = [bool(r.alias_info is not None and not r.alias_info.is_write)
                   for r in schema.returns]
    name = str(func)
    packet = name.rsplit(".", 1)[0] if name.count(".") >= 2 else name
    all_view = bool(out_is_view) and all(out_is_view)
    return _OpPlan(name=name, namespace=func.namespace, args=args, out_is_view=out_is_view,
                   all_outputs_view=all_view,
                   zero_cost=all_view or packet in ZERO_COST_OPS or name in ZERO_COST_OPS)


def _json_scalar(value: Any) -> Any:
    """A JSON-safe form of a schema argument, or ``_SKIP``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple):
        items = [_json_scalar(v) for v in value]
        return _SKIP if any(i is _SKIP for i in items) else items
    name = type(value).__name__
    if name == "dtype":
        return str(value).removeprefix("torch.")
    return _SKIP


_SKIP = object()


class CaptureSession:
    """State shared by every phase of one capture run: tensor ids, parameter names.

    :param param_names: parameter tensor → qualified name (the model's original paths).
    :param module_names: module → (path, class name).
    :param layer_prefix: the path of the decoder-layer list plus ``"."`` (``"model.layers."``).
    """

    def __init__(self, param_names: Mapping[Any, str], module_names: Mapping[Any, tuple[str, str]],
                 layer_prefix: str | None) -> None:
        from torch.utils.weak import WeakIdKeyDictionary

        self._tensor_ids: Any = WeakIdKeyDictionary()
        self._param_of: Any = WeakIdKeyDictionary()
        for tensor, name in param_names.items():
            self._param_of[tensor] = name
        self.module_names = module_names
        self.layer_prefix = layer_prefix
        self._next_tensor_id = 0
        self.ops: dict[str, list[RawOp]] = {}
        # tensor id -> (phase, local op id) of the op that last wrote it
        self._producer: dict[int, tuple[str, int]] = {}
        # storage key -> (phase, local op id) of the last in-place write into it
        self._storage_writer: dict[int, tuple[str, int]] = {}
        # forward sequence number -> the forward op that created the autograd node
        self.forward_by_seq: dict[int, RawOp] = {}
        self._layer_cache: dict[str, int | None] = {}

    def tensor_id(self, t: Any) -> int:
        tid = self._tensor_ids.get(t)
        if tid is None:
            tid = self._next_tensor_id
            self._next_tensor_id += 1
            self._tensor_ids[t] = tid
        return tid

    def fresh_tensor_id(self) -> int:
        """An id for a tensor that exists only as a graph value (graph mode)."""
        tid = self._next_tensor_id
        self._next_tensor_id += 1
        return tid

    def bind_tensor_id(self, t: Any, tid: int) -> None:
        """Give a runtime tensor the id of the graph value it is (graph mode)."""
        self._tensor_ids[t] = tid

    def param_name(self, t: Any) -> str | None:
        return self._param_of.get(t)

    def layer_of(self, path: str) -> int | None:
        """The decoder-layer index a module path lies in (``model.layers.3.mlp`` → 3)."""
        if self.layer_prefix is None:
            return None
        cached = self._layer_cache.get(path, -1)
        if cached != -1:
            return cached
        index = None
        if path.startswith(self.layer_prefix):
            head = path[len(self.layer_prefix):].split(".", 1)[0]
            if head.isdigit():
                index = int(head)
        self._layer_cache[path] = index
        return index


class ModuleStack:
    """Which module is running: global forward hooks installed on enter, removed on exit."""

    def __init__(self, names: Mapping[Any, tuple[str, str]]) -> None:
        self._names = names
        self.stack: list[tuple[str, str]] = []
        self._handles: list[Any] = []

    def __enter__(self) -> ModuleStack:
        from torch.nn.modules import module as nn_module

        def pre(module: Any, _args: Any) -> None:
            name = self._names.get(module)
            if name is not None:
                self.stack.append(name)

        def post(module: Any, _args: Any, _out: Any) -> None:
            if module in self._names and self.stack:
                self.stack.pop()

        self._handles = [nn_module.register_module_forward_pre_hook(pre),
                         nn_module.register_module_forward_hook(post, always_call=True)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()

    @property
    def current(self) -> tuple[str, str]:
        return self.stack[-1] if self.stack else ("", "")


class OpRecorder:
    """Records operators into a :class:`CaptureSession` while active (a context manager).

    :param phase: the phase name the operators belong to; change :attr:`phase` between a
        forward and its backward.
    """

    def __init__(self, session: CaptureSession, phase: str, modules: ModuleStack) -> None:
        self.session = session
        self._phase = phase
        self.modules = modules
        self._mode: Any = None
        self._plans: dict[Any, _OpPlan] = {}
        self._last_seq = 0
        # the last forward in-place op and the tensors it wrote: autograd creates (or
        # re-bases) their node after the kernel returns, so it is read at the next op
        self._pending: tuple[RawOp, list[Any]] | None = None

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._finish_pending()
        self._phase = value

    def __enter__(self) -> OpRecorder:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self._last_seq = torch.autograd._get_sequence_nr()

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if func.namespace != "prim":
                    recorder._record(func, args, kwargs, out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finish_pending()
        self._mode.__exit__(*exc)
        self._mode = None

    def _finish_pending(self) -> set[int]:
        """Attribute the autograd node of the last in-place op (see ``_pending``).

        For ``x.div_(y)`` autograd creates ``DivBackward0`` after the kernel; for a write
        into a view (``q[..., :32].copy_(...)``) it wraps the base's history in a
        ``CopySlices`` node. Either way the base tensor's ``grad_fn`` now carries the
        sequence number backward will report.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return set()
        raw, written = pending
        seqs = set()
        for t in written:
            base = t._base if t._is_view() and t._base is not None else t
            grad_fn = base.grad_fn
            if grad_fn is not None:
                seqs.add(grad_fn._sequence_nr())
        for seq in sorted(seqs):
            raw.attrs["seq_nr"] = seq
            self.session.forward_by_seq[seq] = raw
        return seqs

    # -- recording ----------------------------------------------------------------------

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        import torch

        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = _plan(func)
        session = self.session
        phase = self.phase
        ops = session.ops.setdefault(phase, [])
        local_id = len(ops)

        inputs: list[TensorMeta] = []
        attrs: dict[str, Any] = {}
        written_inputs: list[Any] = []
        read_tensors: list[Any] = []
        n_pos = len(args)
        for i, (name, kind, is_written) in enumerate(plan.args):
            value = args[i] if i < n_pos else kwargs.get(name, _SKIP)
            if value is _SKIP or value is None:
                continue
            if kind == "tensor":
                if isinstance(value, torch.Tensor):
                    inputs.append(self._meta(value, value._is_view()))
                    read_tensors.append(value)
                    if is_written:
                        written_inputs.append(value)
            elif kind == "tensor_list":
                for v in value:
                    if isinstance(v, torch.Tensor):
                        inputs.append(self._meta(v, v._is_view()))
                        read_tensors.append(v)
                        if is_written:
                            written_inputs.append(v)
            else:
                if isinstance(value, torch.Tensor):  # a Scalar passed as a 0-d tensor
                    inputs.append(self._meta(value, False))
                    read_tensors.append(value)
                    continue
                js = _json_scalar(value)
                if js is not _SKIP and js is not None:
                    attrs[name] = js

        outputs: list[TensorMeta] = []
        results = out if isinstance(out, tuple | list) else (out,)
        views = plan.out_is_view
        for j, r in enumerate(results):
            if isinstance(r, torch.Tensor):
                is_view = views[j] if j < len(views) else (views[-1] if views else False)
                outputs.append(self._meta(r, is_view, source=read_tensors if is_view else None))

        # module and autograd attribution
        backward_node = torch._C._current_autograd_node()
        if backward_node is None:
            path, cls = self.modules.current
            layer = session.layer_of(path)
            # a functional op's node is created before its kernel runs: it is the last
            # sequence number handed out, unless that belongs to the previous in-place op
            claimed = self._finish_pending() if self._pending is not None else ()
            cur = torch.autograd._get_sequence_nr()
            if cur > self._last_seq and (cur - 1) not in claimed:
                attrs["seq_nr"] = cur - 1
            self._last_seq = cur
        else:
            path, cls, layer = "", "", None
            seq = backward_node._sequence_nr()
            fwd = session.forward_by_seq.get(seq) if seq != _UINT64_MAX else None
            if fwd is not None:
                path, cls, layer = fwd.module_path, fwd.module_class, fwd.layer_index
                attrs["fwd_seq_nr"] = seq
                for key in fwd.attrs.get("annotated", ()):
                    attrs[key] = fwd.attrs[key]
            else:
                variable = getattr(backward_node, "variable", None)
                pname = session.param_name(variable) if variable is not None else None
                if pname is not None:  # AccumulateGrad of a parameter
                    path = pname.rsplit(".", 1)[0] if "." in pname else ""
                    layer = session.layer_of(path)
                    cls = "AccumulateGrad"
        notes = _ANNOTATIONS.get()
        if notes and backward_node is None:
            attrs.update(notes)
            attrs["annotated"] = sorted(notes)

        raw = RawOp(op=plan.name, phase=phase, local_id=local_id, inputs=inputs,
                    outputs=outputs, attrs=attrs, module_path=path, module_class=cls,
                    layer_index=layer, zero_cost=plan.zero_cost,
                    is_view_op=plan.all_outputs_view)

        # dataflow: the op that last produced each input (same phase only)
        producers: set[int] = set()
        producer = session._producer
        storage_writer = session._storage_writer
        for meta, t in zip(inputs, read_tensors, strict=True):
            src = producer.get(meta.tensor_id)
            if src is not None and src[0] == phase:
                producers.add(src[1])
            if storage_writer:
                w = storage_writer.get(_storage_key(t))
                if w is not None and w[0] == phase and w[1] != local_id:
                    producers.add(w[1])
        raw.producers = sorted(producers)
        for meta in outputs:
            producer[meta.tensor_id] = (phase, local_id)
        if storage_writer and not plan.all_outputs_view:
            # a fresh output owns a fresh storage: forget writes into a freed storage
            # whose address it reuses
            tensors = [r for r in results if isinstance(r, torch.Tensor)]
            for r, meta in zip(tensors, outputs, strict=True):
                if not meta.is_view:
                    storage_writer.pop(_storage_key(r), None)
        for t in written_inputs:
            producer[session.tensor_id(t)] = (phase, local_id)
            storage_writer[_storage_key(t)] = (phase, local_id)

        ops.append(raw)
        if backward_node is None:
            if "seq_nr" in attrs:
                session.forward_by_seq.setdefault(attrs["seq_nr"], raw)
            if written_inputs:
                self._pending = (raw, written_inputs)

    def _meta(self, t: Any, is_view: bool, source: list[Any] | None = None) -> TensorMeta:
        session = self.session
        param = session.param_name(t)
        if param is None and source:
            for s in source:  # a view of a weight is still that weight
                param = session.param_name(s)
                if param is not None:
                    session._param_of[t] = param
                    break
        return TensorMeta(shape=tuple(t.shape), dtype=_dtype_name(t.dtype), is_view=is_view,
                          tensor_id=session.tensor_id(t), param=param)


def _storage_key(t: Any) -> int:
    try:
        return t.untyped_storage()._cdata
    except Exception:  # tensors without storage (sparse, nested): identity is enough
        return id(t)


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def fallback_category(op: str, raw: RawOp) -> str:
    """The category of an op no formula names: views, creation, or other."""
    if raw.is_view_op:
        return Category.VIEW
    packet = op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
    return ZERO_COST_OPS.get(packet, ZERO_COST_OPS.get(op, Category.OTHER))
