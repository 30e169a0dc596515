"""Which aten ops share a sharding rule: the op families the rules and the engine dispatch on."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


# -- the propagation engine ---------------------------------------------------------------


@cache  # a model has a few hundred op names; the engine asks ~8 times per node
def op_base(op: str) -> str:
    """``aten.mm.default`` → ``mm``; ``zrt.attention.default`` → ``attention``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


_VIEW_LIKE = frozenset({"view", "_unsafe_view", "reshape", "_reshape_alias", "flatten",
                        "unflatten", "view_as"})
_SAME_SHAPE = frozenset({"alias", "detach", "lift_fresh", "lift_fresh_copy", "clone",
                         "contiguous", "_to_copy", "to", "copy"})
_MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm",
                     "_grouped_mm", "_scaled_grouped_mm", "grouped_mm_fallback"})
_REDUCE = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                     "var", "std", "prod", "any", "all", "logsumexp", "norm",
                     "linalg_vector_norm"})
_SOFTMAX = frozenset({"_softmax", "_log_softmax", "softmax", "log_softmax"})
#: Ops through which a partial sum stays a partial sum (linear, no mixing with others).
_PARTIAL_SAFE = frozenset({"view", "_unsafe_view", "reshape", "alias", "detach", "t",
                           "transpose", "permute", "unsqueeze", "squeeze", "expand",
                           "lift_fresh", "flatten", "unflatten", "_reshape_alias"})
#: Ops that read only their input's shape (a dropout mask's ``empty_like``): the output is
#: a fresh tensor shaped like the reduced input, never a partial sum itself.
_SHAPE_ONLY = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                         "randn_like"})
