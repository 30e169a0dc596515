"""Fusion: patterns of ops inside one module scope become one fused op.

A :class:`FusionRulePack` (YAML, contributed through the ``zrt_fusion_rules`` hook) holds
:class:`FusionRule` values for one platform (``cuda``, ``ascend`` or ``generic``). The
:class:`Fusion` transform applies the packs of the context's platform, then the generic
packs, rule after rule, to one graph. Each rule names a module scope (a class or path
pattern), the phases it applies to, and an op pattern:

- ``match: sequence`` — a contiguous run of the scope's ops (views skipped) matching the
  tokens in order; a token may carry ``?``, ``*`` or ``+``;
- ``match: connected`` — each maximal connected set of the scope's ops drawn from the
  tokens (dataflow through views, or a shared input), holding every ``requires`` token.

The matched ops, plus the zero-cost views that only serve them, become one node whose
``fused_from`` lists them. Its FLOPs are their sum. Its bytes are those crossing the
region's boundary: each member keeps its formula's count, less what it reads from
another member (or re-reads of an outside tensor already read) and less the outputs that
no node outside consumes — so an outside tensor is read once and an output consumed
outside (or by nothing in the graph: gradients, caches, saved values) written once.

The engine imports no torch and never mutates its input; re-running it on a fused graph
changes nothing.
"""

# Every name the module had is importable from here as before: the package re-exports
# each submodule's top-level names (private ones too, for the tests and other modules).
from __future__ import annotations

from zrt_core._data import (  # noqa: F401  (the old module's imported names)
    Fields,
    load_yaml,
)
from zrt_core.errors import (  # noqa: F401  (the old module's imported names)
    SpecError,
)
from zrt_core.ir.graph import (  # noqa: F401  (the old module's imported names)
    Category,
    OpGraph,
    OpNode,
    Phase,
    TensorMeta,
)
from zrt_core.transforms.fusion.engine import (  # noqa: F401
    _Engine,
    _layer_path,
    _max_id,
    _relative_path,
)
from zrt_core.transforms.fusion.rules import (  # noqa: F401
    _CATEGORY_PREFIX,
    _NAME_RE,
    _OP_RE,
    MATCH_MODES,
    PHASE_GROUPS,
    PLATFORMS,
    FusionRule,
    FusionRulePack,
    OpToken,
    Scope,
    _phases,
    _scope,
    _str_list,
    packs_for_platform,
)
from zrt_core.transforms.fusion.transform import (  # noqa: F401
    Fusion,
    fuse,
)
from zrt_core.transforms.fusion.units import (  # noqa: F401
    _Group,
    _is_alias,
    _Unit,
)
