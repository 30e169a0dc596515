"""Python's cyclic garbage collector during a search (docs/search.md, "Garbage").

An estimate allocates tens of thousands of short-lived container objects, and a search keeps
the captures, layer graphs and price tables it reuses alive beside them. At Python's
default threshold (a collection every 700 net container allocations, a full one each time
the long-lived objects grow by a quarter) the collector walks that live heap again and
again: 10–15% of a training search's CPU time (Llama-3-70B on 1,024 H100). The estimators
leave no reference cycles of their own, so their garbage goes with reference counting and
the collector finds almost nothing; during a search it runs 1,400 times less often, never
disabled, so a cycle from elsewhere is still freed and memory stays bounded.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: net container allocations between automatic collections during a search (Python's 700)
SEARCH_GEN0_THRESHOLD = 1_000_000


@contextmanager
def rare_collections(gen0: int = SEARCH_GEN0_THRESHOLD) -> Iterator[None]:
    """Raise the youngest generation's threshold to at least ``gen0`` inside the block; the
    previous thresholds are restored on exit (nested blocks keep the highest)."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], gen0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
