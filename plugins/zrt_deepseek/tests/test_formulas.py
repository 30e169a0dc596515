"""The closed-form pair counts against brute-force masks of the kernels' reference code."""

from __future__ import annotations

import itertools

import pytest
from zrt_deepseek import formulas, ops


def test_capped_floor_sum_matches_brute_force():
    for lo, hi, m, cap in itertools.product(range(0, 7), range(0, 30, 3), (1, 3, 4, 8),
                                            (1, 2, 5, 100)):
        expected = sum(min(cap, x // m) for x in range(lo, hi + 1))
        assert formulas.capped_floor_sum(lo, hi, m, cap) == expected, (lo, hi, m, cap)


@pytest.mark.parametrize(("q_len", "keys", "ratio", "start"),
                         [(16, 16, 1, 0), (1, 17, 1, 16), (5, 12, 1, 7), (16, 4, 4, 0),
                          (1, 5, 4, 20), (9, 3, 4, 3)])
def test_indexer_pairs_match_the_visibility_mask(q_len, keys, ratio, start):
    visible = ops.indexer_visible(q_len, keys, ratio, start)
    assert formulas.indexer_pairs(q_len, keys, ratio, start) == int(visible.sum())


@pytest.mark.parametrize(("q_len", "window_keys", "window", "ratio", "start", "entries"),
                         [(16, 16, 8, 0, 0, 0), (16, 16, 8, 8, 0, 2), (1, 8, 8, 8, 16, 2),
                          (1, 5, 8, 4, 4, 1), (3, 10, 8, 4, 7, 2), (20, 20, 128, 4, 0, 5)])
def test_v4_pairs_match_the_visibility_mask(q_len, window_keys, window, ratio, start, entries):
    visible = ops.v4_visible(q_len, window_keys + entries, window_keys, window, ratio, start,
                             None, 1)
    pairs = formulas.window_pairs(q_len, window_keys, window, start)
    if ratio:
        pairs += formulas.compressed_pairs(q_len, entries, ratio, start, entries)
    assert pairs == int(visible.sum())


def test_top_k_pairs_match_what_the_indexer_selects():
    """``min(visible, K)`` per query is what the reference indexer hands the attention."""
    import torch

    torch.manual_seed(0)
    b, s, t, heads, dim, topk = 2, 7, 12, 2, 8, 4
    q = torch.randn(b, s, heads, dim)
    k = torch.randn(b, t, dim)
    w = torch.rand(b, s, heads)
    indices = ops.lightning_indexer_reference(q, k, w, topk, 1, t - s, 1.0)
    visible = ops.mla_visible(s, t, indices, True, b)
    # queries at positions 5..11 see 6..12 keys, each capped at 4: 7 · 4 per sequence
    assert int(visible.sum()) == b * 28
    assert int(visible.sum()) == b * sum(min(p + 1, topk) for p in range(t - s, t))
