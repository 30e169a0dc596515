"""The search's garbage-collector setting: raised inside, restored on exit (the fusion
engine leaving no reference cycles for it: tests/transforms/test_fusion.py)."""

from __future__ import annotations

import gc

from zrt_core.search.collector import SEARCH_GEN0_THRESHOLD, rare_collections


def test_threshold_raised_inside_and_restored() -> None:
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with rare_collections():
            assert gc.get_threshold() == (SEARCH_GEN0_THRESHOLD, 10, 10)
            # nested: the higher threshold stays
            with rare_collections(5):
                assert gc.get_threshold() == (SEARCH_GEN0_THRESHOLD, 10, 10)
            assert gc.get_threshold() == (SEARCH_GEN0_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        try:
            with rare_collections(2000):
                raise KeyError("x")
        except KeyError:
            pass
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.isenabled()
    finally:
        gc.set_threshold(*old)

