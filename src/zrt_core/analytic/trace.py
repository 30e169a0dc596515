"""A symbolic tracer for the analytic front-end: aten-level operators on shapes, with the
backward autograd would run, recorded in the form the capture front-end records.

Model code in :mod:`zrt_core.analytic.builder` calls :class:`Tracer` methods named after
the aten operators HuggingFace's modeling code dispatches (``mm``, ``_to_copy``, ``pow``,
``zrt.attention``...). Each call records one :class:`~zrt_core.capture.recorder.RawOp`
(tensors read and written with ids, the module running, attributes) exactly as
:class:`~zrt_core.capture.recorder.OpRecorder` would, and :func:`~zrt_core.capture.graphs.
build_graph` turns them into an :class:`~zrt_core.ir.graph.OpGraph` with the same formulas
and categories. In a training forward each operator whose inputs require a gradient also
creates an autograd node (its ``seq_nr``) holding the rule of its derivative; :meth:`Tracer.
backward` then runs those nodes in descending sequence order, as PyTorch's engine does,
emitting the derivative operators with ``fwd_seq_nr``, the forward module's attribution,
gradient accumulation (``aten.add`` where a tensor receives a second gradient) and the
``AccumulateGrad`` detach of each parameter. The derivative rules follow PyTorch's
``derivatives.yaml`` for the operators used, in the order the engine emits them.

Pure Python: no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zrt_core.capture.recorder import RawOp
from zrt_core.ir.graph import TensorMeta

#: Operators recorded at zero cost, whose outputs alias their input.
VIEW_OPS = frozenset({"aten.view", "aten.t", "aten.transpose", "aten.unsqueeze",
                      "aten.slice", "aten.expand", "aten.alias", "aten.detach", "aten.split",
                      "aten.lift_fresh", "aten.select", "aten.permute", "aten.squeeze"})
#: Zero-cost operators whose output is a fresh tensor (capture's ZERO_COST_OPS).
_FRESH_ZERO_COST = frozenset({"aten._unsafe_view", "aten.empty_like", "aten.empty"})
_OVERLOAD = {"aten.view": "default", "aten.t": "default", "aten.transpose": "int",
             "aten.unsqueeze": "default", "aten.slice": "Tensor", "aten.expand": "default",
             "aten.alias": "default", "aten.detach": "default", "aten.split": "Tensor",
             "aten.lift_fresh": "default", "aten._unsafe_view": "default",
             "aten.empty_like": "default", "aten.mm": "default", "aten.addmm": "default",
             "aten._to_copy": "default", "aten.pow": "Tensor_Scalar", "aten.mean": "dim",
             "aten.add": "Tensor", "aten.rsqrt": "default", "aten.mul": "Tensor",
             "aten.embedding": "default", "aten.arange": "default", "aten.cos": "default",
             "aten.sin": "default", "aten.cat": "default", "aten.neg": "default",
             "aten.silu": "default", "zrt.attention": "default", "aten.sum": "dim_IntList",
             "aten.div": "Scalar", "aten.slice_backward": "default",
             "aten.silu_backward": "default", "aten.embedding_dense_backward": "default",
             "aten.zeros": "default", "zrt.attention_backward": "default",
             "aten._log_softmax": "default", "aten._log_softmax_backward_data": "default",
             "aten.nll_loss_forward": "default", "aten.nll_loss_backward": "default",
             "aten.ones_like": "default", "aten.constant_pad_nd": "default",
             "aten.clone": "default", "aten.native_layer_norm": "default",
             "aten.native_layer_norm_backward": "default", "aten.tanh": "default",
             "aten.tanh_backward": "default", "aten.bernoulli_": "float",
             "aten.div_": "Scalar", "aten._softmax": "default",
             "aten._softmax_backward_data": "default", "aten.topk": "default",
             "zrt.moe_dispatch": "default", "zrt.moe_combine": "default",
             "zrt.moe_dispatch_backward": "default", "zrt.moe_combine_backward": "default",
             "aten._grouped_mm": "default", "aten.new_zeros": "default",
             "aten.scatter": "src", "aten.sigmoid": "default",
             "aten.sigmoid_backward": "default", "aten.gather": "default",
             "aten.sub": "Tensor", "aten.index": "Tensor"}

_INT64_MAX = 9223372036854775807


def op_name(op: str, overload: str | None = None) -> str:
    """``aten.mm`` → ``aten.mm.default`` (the overload the capture records)."""
    return f"{op}.{overload or _OVERLOAD.get(op, 'default')}"


class T:
    """A symbolic tensor: shape, dtype, identity, and the autograd node that made it."""

    __slots__ = ("contiguous", "detached", "dtype", "grad_fn", "is_view", "param",
                 "requires_grad", "shape", "tid")

    def __init__(self, shape: Sequence[int], dtype: str, tid: int, *, param: str | None = None,
                 is_view: bool = False, requires_grad: bool = False,
                 contiguous: bool = True) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.tid = tid
        self.param = param
        self.is_view = is_view
        self.requires_grad = requires_grad
        self.grad_fn: tuple[Fn, int] | None = None
        self.contiguous = contiguous
        # detach / lift_fresh: the schema says alias (the op's output is recorded as a view)
        # but the tensor itself is not a view when an operator reads it
        self.detached = False

    def meta(self, *, as_input: bool = False) -> TensorMeta:
        view = self.is_view and not (as_input and self.detached)
        return TensorMeta(shape=self.shape, dtype=self.dtype, is_view=view,
                          tensor_id=self.tid, param=self.param)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"T{list(self.shape)}:{self.dtype}#{self.tid}"


class Fn:
    """An autograd node: the forward operator's inputs, outputs, scope and derivative."""

    __slots__ = ("attrs", "backward", "inputs", "outputs", "saved", "scope", "seq")

    def __init__(self, seq: int, scope: tuple[str, str, int | None], inputs: Sequence[T],
                 outputs: Sequence[T], attrs: dict[str, Any],
                 backward: Callable[..., list[T | None]], saved: dict[str, Any]) -> None:
        self.seq = seq
        self.scope = scope
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = attrs
        self.backward = backward
        self.saved = saved


class Tracer:
    """Records operators phase by phase, sharing tensor ids across phases (one session).

    :param dtype: the model's parameter and activation dtype name.
    """

    def __init__(self, dtype: str = "bfloat16") -> None:
        self.dtype = dtype
        self.ops: dict[str, list[RawOp]] = {}
        self.phase = ""
        self._next_tid = 0
        self._producer: dict[int, int] = {}
        self._scope: tuple[str, str, int | None] = ("", "", None)
        self._params: dict[str, T] = {}
        self._param_scope: dict[str, tuple[str, int | None]] = {}
        self.grad_enabled = False
        self._seq = 0
        self._fns: list[Fn] = []
        self._fwd_seq: int | None = None
        self._layer_of: Callable[[str], int | None] = lambda path: None

    # -- tensors -------------------------------------------------------------------------

    def new_id(self) -> int:
        tid = self._next_tid
        self._next_tid += 1
        return tid

    def tensor(self, shape: Sequence[int], dtype: str | None = None, **kw: Any) -> T:
        """A new tensor; like every tensor, it gets its id when first recorded (inputs
        before outputs, as the capture's recorder numbers them)."""
        return T(shape, dtype or self.dtype, -1, **kw)

    def param(self, name: str, shape: Sequence[int], dtype: str | None = None) -> T:
        """The parameter ``name`` (the same tensor every time it is read)."""
        p = self._params.get(name)
        if p is None:  # its id is handed out when an operator first reads it, as capture does
            p = self._params[name] = T(shape, dtype or self.dtype, -1, param=name,
                                       requires_grad=True)
        elif p.shape != tuple(shape):
            raise AssertionError(f"parameter {name} used with two shapes")
        p.requires_grad = self.grad_enabled
        return p

    def buffer(self, shape: Sequence[int], dtype: str) -> T:
        """A module buffer (no gradient, no parameter name)."""
        return self.tensor(shape, dtype)

    # -- phases and scopes -----------------------------------------------------------------

    def start_phase(self, phase: str, *, grad: bool) -> None:
        """Record into ``phase``; ``grad``: a training forward (autograd nodes are made)."""
        self.phase = phase
        self.ops.setdefault(phase, [])
        self._producer = {}
        self.grad_enabled = grad
        for p in self._params.values():
            p.requires_grad = grad

    def start_backward(self, phase: str) -> None:
        """Record the backward into ``phase`` (gradients flow; no new autograd nodes)."""
        self.phase = phase
        self.ops.setdefault(phase, [])
        self._producer = {}
        self.grad_enabled = False

    def set_layer_rule(self, rule: Callable[[str], int | None]) -> None:
        self._layer_of = rule

    @contextlib.contextmanager
    def module(self, path: str, cls: str) -> Iterator[None]:
        previous = self._scope
        self._scope = (path, cls, self._layer_of(path))
        try:
            yield
        finally:
            self._scope = previous

    # -- recording -------------------------------------------------------------------------

    def record(self, op: str, inputs: Sequence[T], outputs: Sequence[T],
               attrs: dict[str, Any] | None = None, *, overload: str | None = None,
               scope: tuple[str, str, int | None] | None = None) -> None:
        name = op_name(op, overload)
        path, cls, layer = scope or self._scope
        for t in (*inputs, *outputs):
            if t.tid < 0:
                t.tid = self.new_id()
        ops = self.ops[self.phase]
        local_id = len(ops)
        producers = sorted({self._producer[t.tid] for t in inputs if t.tid in self._producer})
        zero = op in VIEW_OPS or op in _FRESH_ZERO_COST
        raw = RawOp(op=name, phase=self.phase, local_id=local_id,
                    inputs=[t.meta(as_input=True) for t in inputs],
                    outputs=[t.meta() for t in outputs],
                    attrs=dict(attrs or {}), module_path=path, module_class=cls,
                    layer_index=layer, zero_cost=zero, is_view_op=op in VIEW_OPS,
                    producers=producers)
        ops.append(raw)
        for t in outputs:
            self._producer[t.tid] = local_id

    def _needs_grad(self, inputs: Sequence[T]) -> bool:
        return self.grad_enabled and any(t.requires_grad for t in inputs)

    def call(self, op: str, inputs: Sequence[T], outputs: Sequence[T],
             attrs: dict[str, Any] | None = None, *,
             backward: Callable[..., list[T | None]] | None = None,
             saved: dict[str, Any] | None = None, overload: str | None = None,
             grad_outputs: Sequence[int] | None = None, seq: int | None = None) -> None:
        """Record a forward operator and, when an input requires a gradient, its autograd
        node (``seq_nr``) with ``backward(tracer, fn, grads) -> input grads``."""
        attrs = dict(attrs or {})
        fn = None
        if backward is not None and self._needs_grad(inputs):
            if seq is None:
                seq = self._seq
                self._seq += 1
            fn = Fn(seq, self._scope, inputs, outputs, dict(attrs), backward,
                    saved if saved is not None else {})
            attrs["seq_nr"] = seq
            for i, t in enumerate(outputs):
                if grad_outputs is None or i in grad_outputs:
                    t.requires_grad = True
                    t.grad_fn = (fn, i)
            self._fns.append(fn)
        if self._fwd_seq is not None:
            attrs["fwd_seq_nr"] = self._fwd_seq
        self.record(op, inputs, outputs, attrs, overload=overload)

    def reserve_seq(self, count: int) -> int:
        """Hand out ``count`` sequence numbers (for operators whose autograd bookkeeping
        records them out of order, like an in-place op's saved clone)."""
        first = self._seq
        self._seq += count
        return first

    # -- the backward engine ---------------------------------------------------------------

    def backward(self, loss: T) -> None:
        """Run every autograd node reachable from ``loss`` (see the module docstring)."""
        ones = self.tensor((), loss.dtype)
        self.record("aten.ones_like", [loss], [ones], {"pin_memory": False},
                    scope=("", "", None))
        pending: dict[int, T] = {loss.tid: ones}
        fns = sorted(self._fns, key=lambda f: -f.seq)
        # a weight read by several operators (a tied embedding and LM head) accumulates its
        # gradients; its AccumulateGrad runs once the last of them has run
        last_use: dict[int, int] = {}
        for fn in fns:
            for inp in fn.inputs:
                if inp.param is not None and inp.grad_fn is None:
                    last_use[inp.tid] = fn.seq
        for fn in fns:
            grads = [pending.pop(o.tid, None) for o in fn.outputs]
            if all(g is None for g in grads):
                continue
            previous_scope, self._scope = self._scope, fn.scope
            self._fwd_seq = fn.seq
            try:
                in_grads = fn.backward(self, fn, grads)
                for inp, g in zip(fn.inputs, in_grads, strict=False):
                    if g is None or not inp.requires_grad:
                        continue
                    if inp.tid in pending:
                        out = self.like(pending[inp.tid])  # the first operand's layout
                        self.call("aten.add", [pending[inp.tid], g], [out])
                        pending[inp.tid] = out
                    else:
                        pending[inp.tid] = g
                    if inp.param is not None and inp.grad_fn is None and \
                            last_use.get(inp.tid) == fn.seq:
                        self._accumulate_param(inp, pending.pop(inp.tid))
            finally:
                self._scope = previous_scope
                self._fwd_seq = None
        self._fns.clear()

    def _accumulate_param(self, param: T, grad: T) -> None:
        path = param.param.rsplit(".", 1)[0] if "." in param.param else ""
        out = T(grad.shape, grad.dtype, self.new_id(), is_view=True)
        out.detached = True
        self.record("aten.detach", [grad], [out], {},
                    scope=(path, "AccumulateGrad", self._layer_of(path)))

    # -- helpers the rules use ---------------------------------------------------------------

    def like(self, t: T, shape: Sequence[int] | None = None, dtype: str | None = None,
             *, view: bool = False, contiguous: bool | None = None) -> T:
        """A fresh tensor like ``t``. Same shape: it keeps ``t``'s memory layout, as
        elementwise kernels do (a gradient of a transposed tensor stays transposed)."""
        same = shape is None or tuple(shape) == t.shape
        if contiguous is None:
            contiguous = t.contiguous if same else True
        return T(shape if shape is not None else t.shape, dtype or t.dtype, -1,
                 is_view=view, contiguous=contiguous)

    def view_of(self, t: T, shape: Sequence[int], *, contiguous: bool = True) -> T:
        return T(shape, t.dtype, -1, param=t.param, is_view=True, contiguous=contiguous)


# -- shapes ------------------------------------------------------------------------------------


def broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def transposed(shape: Sequence[int], d0: int, d1: int) -> tuple[int, ...]:
    s = list(shape)
    d0 %= len(s)
    d1 %= len(s)
    s[d0], s[d1] = s[d1], s[d0]
    return tuple(s)


__all__ = ["VIEW_OPS", "Fn", "T", "Tracer", "broadcast", "op_name", "transposed"]
