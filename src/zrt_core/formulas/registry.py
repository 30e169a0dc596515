"""FLOP and byte formulas per operator, as pure functions of shapes.

Modelled on ``torch.utils.flop_counter``: a formula is registered once per operator name
(``aten.mm`` covers every overload, ``aten.mm.default`` one overload, which wins over the
packet), a second registration of the same name is an error, and an operator with no
formula is reported by the graph (``OpGraph.missing_formulas``), never guessed.

A formula receives an :class:`OpCall`: the tensors read and written (shape, dtype) and the
operator's non-tensor arguments by schema name (``is_causal``, ``scale``, ``dim``...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from attrs import field, frozen

from zrt_core.errors import PluginError, SpecError
from zrt_core.ir.graph import TensorMeta, _frozen_mapping

FlopFn = Callable[["OpCall"], int]
BytesFn = Callable[["OpCall"], tuple[int, int]]


@frozen
class OpCall:
    """One call of an operator, as a formula sees it."""

    op: str
    inputs: tuple[TensorMeta, ...] = field(converter=tuple)
    outputs: tuple[TensorMeta, ...] = field(converter=tuple)
    attrs: Mapping[str, Any] = field(factory=dict, converter=_frozen_mapping)


def default_bytes(call: OpCall) -> tuple[int, int]:
    """Bytes read and written: every non-view input once, every non-view output once.

    A view aliases memory it does not move; an op that writes into a view (``copy_`` into a
    slice) still writes its bytes, which the op's own formula accounts for.
    """
    read = sum(t.nbytes for t in call.inputs)
    written = sum(t.nbytes for t in call.outputs if not t.is_view)
    return read, written


#: The layout rules an :class:`OpFormula` may name (``transforms.parallel.LAYOUT_RULES``).
FORMULA_LAYOUTS = ("attention", "leading", "gradients", "indexer")


@frozen
class OpFormula:
    """FLOPs (and optionally bytes and category) of one operator name.

    :param op: ``namespace.name`` for every overload, or ``namespace.name.overload``.
    :param flops: FLOPs of one call (multiply-add = 2).
    :param bytes: ``(read, written)`` bytes of one call; None uses :func:`default_bytes`.
    :param category: the :class:`zrt_core.ir.Category` of the op; None leaves it to the
        capture's category table.
    :param layout: how the parallel and rescale transforms carry a split of the inputs to
        the outputs, for an op the core has no rule for (a plugin's kernel): one of
        :data:`zrt_core.transforms.parallel.LAYOUT_RULES` — ``attention`` (outputs
        ``[b, s_q, h, d]`` and ``[b, h, s_q]`` follow the query ``[b, h, s_q, d]``, input
        0), ``leading`` (every output's leading axes follow input 0's axes but its last),
        ``gradients`` (each output follows the last input of its shape), ``indexer``
        (top-k indices ``[b, s_q, k]``: batch and queries follow input 0, ``k = min(
        attrs["topk"], rows of input 1's axis 1)``); None: matched by axis sizes, which
        size-1 axes (batch 1, one decode token) can mislead.
    :param derived_attrs: attrs that follow from the call's shapes and other attrs
        (``call -> {name: value}``), recomputed whenever a transform changes the node's
        shapes or attrs (a rescaled batch or cache length); None: attrs as captured.
    """

    op: str
    flops: FlopFn
    bytes: BytesFn | None = None
    category: str | None = None
    layout: str | None = None
    derived_attrs: Callable[[OpCall], Mapping[str, Any]] | None = None

    def __attrs_post_init__(self) -> None:
        if self.layout is not None and self.layout not in FORMULA_LAYOUTS:
            raise SpecError(f"op formula {self.op!r}: unknown layout {self.layout!r}",
                            f"use one of {', '.join(FORMULA_LAYOUTS)}, or None")


class FormulaRegistry:
    """Formulas by operator name, each remembering which distribution registered it."""

    def __init__(self) -> None:
        self._formulas: dict[str, OpFormula] = {}
        self._dist: dict[str, str] = {}

    def register(self, formula: OpFormula, distribution: str = "<local>") -> None:
        if formula.op in self._formulas:
            raise PluginError(
                f"op formula {formula.op!r} is registered twice: by "
                f"{self._dist[formula.op]!r} and by {distribution!r}",
                "remove one registration; override per call with FormulaRegistry.merged()",
            )
        self._formulas[formula.op] = formula
        self._dist[formula.op] = distribution

    def lookup(self, op: str) -> OpFormula | None:
        """The formula for an overload name (``aten.mm.default``): exact, then its packet."""
        found = self._formulas.get(op)
        if found is not None:
            return found
        packet = op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
        return self._formulas.get(packet)

    def merged(self, overrides: Iterable[OpFormula]) -> FormulaRegistry:
        """A new registry where ``overrides`` replace same-named formulas; self is unchanged."""
        out = FormulaRegistry()
        out._formulas = dict(self._formulas)
        out._dist = dict(self._dist)
        for f in overrides:
            out._formulas[f.op] = f
            out._dist[f.op] = "<override>"
        return out

    def distribution_of(self, op: str) -> str:
        return self._dist[op]

    def __contains__(self, op: object) -> bool:
        return isinstance(op, str) and self.lookup(op) is not None

    def __len__(self) -> int:
        return len(self._formulas)

    def names(self) -> list[str]:
        return sorted(self._formulas)

    def evaluate(self, call: OpCall) -> tuple[int, int, int, str | None]:
        """``(flops, bytes_read, bytes_written, formula name)`` of a call.

        With no formula the FLOPs are 0 and the name None (the caller reports it); bytes
        still follow :func:`default_bytes`, since moving data is certain even when the
        arithmetic is unknown.
        """
        formula = self.lookup(call.op)
        if formula is None:
            read, written = default_bytes(call)
            return 0, read, written, None
        flops = int(formula.flops(call))
        read, written = (formula.bytes or default_bytes)(call)
        return flops, int(read), int(written), formula.op
