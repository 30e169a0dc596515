"""Layout search and hardware comparison: ``zrt_core.search(...)`` and
``zrt_core.compare(...)`` (docs/search.md); ``zrt search`` and ``zrt compare`` print them.

The package is callable (``zrt_core.search(model, hw, space)`` is :func:`search`), so the API
the issue names works while the package keeps its modules (space, evaluate, pareto, run,
compare, outputs).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from zrt_core.search.compare import CompareResult, compare, load_groups, parse_prices
from zrt_core.search.pareto import pareto_front
from zrt_core.search.run import SearchResult, search
from zrt_core.search.space import ServeSpace, TrainSpace

__all__ = ["CompareResult", "SearchResult", "ServeSpace", "TrainSpace", "compare",
           "load_groups", "pareto_front", "parse_prices", "search"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> SearchResult:
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
