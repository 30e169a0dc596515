"""MoE parallel folding as Megatron-Core builds its groups (``parallel_state.
initialize_model_parallel``): expert TP × EP carved out of TP × CP × DP, the expert data-parallel
size ``world / (etp × ep × pp)``, each group's size and the ranks it spans — checked against an
independent enumeration of Megatron's rank generator."""

from __future__ import annotations

import pytest

from zrt_core.errors import LayoutError
from zrt_core.modelinfo import ModelDims
from zrt_core.strategy import Parallel, check_layout

# 8 experts top-2 of width 256, 48 heads (8 KV), FFN 32768: a Grok-like MoE
DIMS = ModelDims.from_config({
    "model_type": "mixtral", "hidden_size": 6144, "intermediate_size": 32768,
    "num_hidden_layers": 64, "num_attention_heads": 48, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 131072})


def megatron_groups(sizes: dict[str, int], order: str, members: str) -> list[list[int]]:
    """Megatron's ``RankGenerator``: ranks laid out over ``order`` (first dimension fastest);
    a group holds the ranks that differ only in the dimensions ``members`` names."""
    dims = order.split("-")
    world = 1
    for d in dims:
        world *= sizes[d]
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(world):
        coords, rest = {}, rank
        for d in dims:
            coords[d] = rest % sizes[d]
            rest //= sizes[d]
        key = tuple(coords[d] for d in dims if d not in members.split("-"))
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


def size_and_span(groups: list[list[int]]) -> tuple[int, int]:
    """Members per group, and the block of consecutive ranks a group's stride covers
    (``last − first + stride``); a one-rank group spans nothing (None)."""
    sizes = {len(g) for g in groups}
    spans = {g[-1] - g[0] + (g[1] - g[0]) if len(g) > 1 else None for g in groups}
    assert len(sizes) == 1 and len(spans) == 1
    return sizes.pop(), spans.pop()


def zrt_group(p: Parallel, group: str) -> tuple[int, int | None]:
    size, span = p.span(group)
    return size, span if size > 1 else None


LAYOUTS = [
    # the dgxc Grok-1 run: tp 4, cp 2, dp 8, pp 8 (512 GPUs), ep 8, etp 1: expert DP 8
    Parallel(tp=4, pp=8, cp=2, ep=8, etp=1, dp=8),
    # ep larger than dp: tp 4 × dp 2 = 8 ranks per stage hold 8 experts, expert DP 1
    Parallel(tp=4, pp=2, ep=8, etp=1, dp=2),
    # expert TP 2 inside TP 4: etp × ep = 8 of tp × dp = 16, expert DP 2
    Parallel(tp=4, pp=2, ep=4, etp=2, dp=4),
]


@pytest.mark.parametrize("p", LAYOUTS, ids=[p.describe() for p in LAYOUTS])
def test_groups_are_megatrons(p: Parallel) -> None:
    assert check_layout(p, DIMS) is not None
    edp = p.world_size // (p.expert_tp * p.ep * p.pp)  # world / (etp × ep × pp)
    assert p.expert_dp == edp
    dense = {"tp": p.tp, "cp": p.cp, "dp": p.dp, "pp": p.pp}
    expert = {"etp": p.expert_tp, "ep": p.ep, "edp": edp, "pp": p.pp}
    assert size_and_span(megatron_groups(dense, "tp-cp-dp-pp", "tp")) == zrt_group(p, "tp")
    assert size_and_span(megatron_groups(dense, "tp-cp-dp-pp", "cp")) == zrt_group(p, "cp")
    assert size_and_span(megatron_groups(dense, "tp-cp-dp-pp", "dp")) == zrt_group(p, "dp")
    assert size_and_span(megatron_groups(dense, "tp-cp-dp-pp", "cp-dp")) == zrt_group(p, "dp_cp")
    # the expert generator: order tp-ep-dp-pp with expert TP, EP and expert DP
    assert size_and_span(megatron_groups(expert, "etp-ep-edp-pp", "ep")) == zrt_group(p, "ep")
    assert size_and_span(megatron_groups(expert, "etp-ep-edp-pp", "etp")) == zrt_group(p, "etp")
    assert size_and_span(megatron_groups(expert, "etp-ep-edp-pp", "edp")) == zrt_group(p, "edp")


def test_exact_group_sizes_of_the_grok_run() -> None:
    p = LAYOUTS[0]
    # EP all-to-all over 8 consecutive ranks (etp 1); expert gradients reduce over
    # 4 · 2 · 8 / 8 = 8 ranks strided by 8, spanning the stage's 64 ranks
    assert (p.span("ep"), p.span("edp"), p.span("dp_cp")) == ((8, 8), (8, 64), (16, 64))


def test_megatron_refuses_what_does_not_fold() -> None:
    # tp 2 × dp 3 = 6 ranks per stage cannot hold ep 4 (world % (etp·ep·pp) != 0)
    with pytest.raises(LayoutError, match="must divide tp × cp × dp = 6"):
        check_layout(Parallel(tp=2, ep=4, etp=1, dp=3, pp=1), DIMS)
    with pytest.raises(LayoutError, match="ep=3 does not divide the 8 routed experts"):
        check_layout(Parallel(tp=1, ep=3, etp=1, dp=3), DIMS)
