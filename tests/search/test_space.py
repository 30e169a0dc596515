"""The layout spaces: exact counts of enumerated and removed layouts (no estimates)."""

from __future__ import annotations

import pytest

from zrt_core.errors import LayoutError, SpecError
from zrt_core.modelinfo import ModelDims
from zrt_core.search.space import (
    ServeSpace,
    TrainSpace,
    enumerate_serve,
    enumerate_train,
    no_layout_error,
    train_space_size,
)

#: GPT-2 shaped: 4 layers, 4 heads (4 KV heads), FFN 256, dense
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}


@pytest.fixture(scope="module")
def dims() -> ModelDims:
    return ModelDims.from_config(TINY)


def test_training_counts_per_rule(dims: ModelDims) -> None:
    space = TrainSpace(gpus=(4,), global_batch=8, seq_len=64, tp=None, cp=(1,),
                       pp=(1, 2, 4), vp=(1, 2), micro_batch=(1, 2), recompute=("none",),
                       sharding=("zero1", "fsdp"), pp_schedule=("1f1b", "interleaved"))
    kept, removed = enumerate_train(space, dims, nvlink_domain=8)
    # tp ∈ {1,2,4,8} (powers of two up to 8) × pp 3 × cp 1 = 12 degree pairs, each with
    # vp 2 × schedule 2 × micro-batch 2 × sharding 2 = 16 recipes: 192 layouts
    assert train_space_size(space, dims) == 192
    # tp·pp does not divide 4 GPUs: (2,4), (4,2), (4,4), (8,·)×3 = 6 pairs × 16
    assert removed["gpus"] == 96
    # pp 4 × vp 2 = 8 stages > 4 layers: pair (tp1, pp4) × 2 schedules × 2 mb × 2 sharding
    assert removed["pp_layers"] == 8
    # vp>1 ⇔ interleaved (and pp>1): the three pp=1 pairs keep 1 of 4 (vp, schedule)
    # combos (3×3×4 = 36), the two pp=2 pairs keep 2 of 4 (2×2×4 = 16), tp1·pp4 (vp 1
    # left) loses interleaved (1×4 = 4): 56
    assert removed["vp_schedule"] == 56
    # FSDP with dp = 1 (pairs tp1·pp4, tp2·pp2, tp4·pp1): 2 + 4 + 2 = 8
    assert removed["sharding_dp"] == 8
    assert removed["batch"] == removed["pipeline_fill"] == removed["tp_heads"] == 0
    # 192 − 96 − 8 − 56 − 8
    assert len(kept) == 24
    assert sum(removed.values()) + len(kept) == 192
    assert {(c.parallel.tp, c.parallel.pp, c.parallel.dp) for c in kept} == {
        (1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)}


def test_batch_and_pipeline_fill(dims: ModelDims) -> None:
    space = TrainSpace(gpus=(8,), global_batch=4, seq_len=64, tp=(1,), cp=(1,), pp=(1, 2, 4),
                       vp=(1,), micro_batch=(1, 2), recompute=("none",), sharding=("zero1",),
                       pp_schedule=("1f1b",))
    kept, removed = enumerate_train(space, dims, nvlink_domain=8)
    # dp = 8, 4, 2 for pp 1, 2, 4; global batch 4 divisible by mb·dp: pp1 (mb·dp 8, 16) no,
    # pp2 (4 yes, 8 no), pp4 (2, 4 yes): batch removes 2 + 1 = 3
    assert removed["batch"] == 3
    # pp2 mb1: 4/4 = 1 micro-batch < 2 stages; pp4 mb1: 2 < 4, mb2: 1 < 4: 3 removed
    assert removed["pipeline_fill"] == 3
    assert kept == []


def test_ring_context_parallel_needs_two_cp_chunks(dims: ModelDims) -> None:
    space = TrainSpace(gpus=(8,), global_batch=8, seq_len=24, tp=(1,), cp=(1, 2, 4, 8),
                       pp=(1,), vp=(1,), micro_batch=(1,), recompute=("none",),
                       sharding=("zero1",), pp_schedule=("1f1b",))
    kept, removed = enumerate_train(space, dims, nvlink_domain=8)
    # ring attention splits the sequence into 2·cp chunks: cp 2 → 4 | 24, cp 4 → 8 | 24,
    # cp 8 → 16 ∤ 24: one removed
    assert removed["cp_seq"] == 1
    assert [c.parallel.cp for c in kept] == [1, 2, 4]


def test_tp_beyond_nvlink_and_heads(dims: ModelDims) -> None:
    space = TrainSpace(gpus=(16,), global_batch=16, seq_len=64, tp=(1, 8, 16), cp=(1,),
                       pp=(1,), vp=(1,), micro_batch=(1,), recompute=("none",),
                       sharding=("zero1",), pp_schedule=("1f1b",))
    _, removed = enumerate_train(space, dims, nvlink_domain=8)
    # tp 16 > the 8-GPU NVLink domain; tp 8 does not divide 4 heads
    assert removed["tp_nvlink"] == 1 and removed["tp_heads"] == 1


def test_serving_counts(dims: ModelDims) -> None:
    space = ServeSpace(gpus=(4,), input_len=32, output_len=8, tp=None, dp=None,
                       quant=("none", "fp8", "fp4"), batch=(None, 1))
    kept, removed = enumerate_serve(space, dims, 8, frozenset({"fp8"}))
    # tp ∈ {1,2,4} (powers of two ≤ 4 GPUs) × dp ∈ {1,2,4} × 3 quant × 2 batch = 54;
    # tp·dp = 4: (1,4), (2,2), (4,1) → 6 pairs fail: 36 removed
    assert removed["gpus"] == 36
    # fp4 on hardware without fp4: 3 pairs × 2 batches
    assert removed["quant_hw"] == 6
    assert len(kept) == 12


def test_moe_serving_spreads_experts_over_the_instance() -> None:
    moe = ModelDims(model_type="x", hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16,
                    ffn=128, vocab=64, experts=8, top_k=2, moe_ffn=32, moe_layers=2)
    space = ServeSpace(gpus=(4,), input_len=8, output_len=8, tp=(4,), dp=(1,), quant=("none",),
                       batch=(1,))
    kept, removed = enumerate_serve(space, moe, 8, frozenset())
    assert not removed
    # ep ∈ {1,2,4} (≤ 4 GPUs, ≤ 8 experts); expert tp = 4/ep = 4, 2, 1 divides 32
    assert [(c.parallel.ep, c.parallel.etp) for c in kept] == [(1, 4), (2, 2), (4, 1)]


def test_every_serving_layout_is_what_zrt_run_prices_for_its_flags() -> None:
    from attrs import evolve

    from zrt_core.strategy import serving_expert_tp

    moe = ModelDims(model_type="x", hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16,
                    ffn=128, vocab=64, experts=8, top_k=2, moe_ffn=32, moe_layers=2)
    space = ServeSpace(gpus=(4,), input_len=8, output_len=8, tp=None, dp=None,
                       quant=("none",), batch=(1,))
    kept, _ = enumerate_serve(space, moe, 8, frozenset())
    # tp × dp = 4 over tp ∈ {1, 2, 4} and ep ∈ {1, 2, 4}: with dp > 1 and no EP too, the
    # experts span the 4 GPUs (vLLM's DP × TP expert group): `zrt run --tp T --dp D --ep E`
    # without --etp takes the same expert TP the search priced
    assert {(c.parallel.tp, c.parallel.dp, c.parallel.ep, c.parallel.etp) for c in kept} == {
        (tp, 4 // tp, ep, 4 // ep) for tp in (1, 2, 4) for ep in (1, 2, 4)}
    for c in kept:  # an unset expert TP is the attention TP (Megatron's default): tp=4, dp=1
        run = serving_expert_tp(evolve(c.parallel, etp=None), moe=True)
        assert (run.etp or run.tp) == c.parallel.etp


def test_dense_model_has_no_expert_parallelism(dims: ModelDims) -> None:
    space = TrainSpace(gpus=(2,), global_batch=2, seq_len=64, tp=(1,), cp=(1,), pp=(1,),
                       vp=(1,), ep=(1, 2), micro_batch=(1,), recompute=("none",),
                       sharding=("zero1",), pp_schedule=("1f1b",))
    _, removed = enumerate_train(space, dims, 8)
    assert removed["ep_experts"] == 1


def test_bad_spaces_are_one_line_errors() -> None:
    with pytest.raises(SpecError, match="contradicts --max-tp 8"):
        TrainSpace(gpus=(8,), global_batch=8, seq_len=64, tp=(16,), max_tp=8)
    with pytest.raises(SpecError, match="unknown recompute bogus"):
        TrainSpace(gpus=(8,), global_batch=8, seq_len=64, recompute=("bogus",))
    with pytest.raises(SpecError, match="--gpus must be positive"):
        TrainSpace(gpus=(0,), global_batch=8, seq_len=64)


def test_no_layout_names_the_rule_that_removed_most() -> None:
    from collections import Counter

    err = no_layout_error(Counter({"gpus": 5, "batch": 9}), (("gpus", "g"), ("batch", "b")))
    assert isinstance(err, LayoutError)
    assert "the rule 'batch' (b) removed 9 of 14 candidates" in str(err)
    err = no_layout_error(Counter({"gpus": 5}), (("gpus", "g"),), memory=7)
    assert "'memory'" in str(err) and "removed 7 of 12" in str(err)


def test_parallelism_families(dims: ModelDims) -> None:
    from zrt_core.search.strategies import family_layouts

    fam = family_layouts(dims, 8, 16, 8)
    # 4 heads: TP's largest degree is 4 (8 does not divide the heads), dp 8 / 4 = 2
    assert fam["TP"][0].tp == 4 and fam["TP"][0].dp == 2 and fam["TP"][0].sp is False
    assert fam["SP"][0].sp is True
    # PP: 4 layers, 16 sequences over dp 2 leave 8 ≥ 4 micro-batches: pp 4
    assert (fam["PP"][0].pp, fam["PP"][0].dp) == (4, 2)
    # 3D: tp 2 (8 / 2 = 4 GPUs left for pp 2 × dp 2)
    assert (fam["3D"][0].tp, fam["3D"][0].pp, fam["3D"][0].dp) == (2, 2, 2)
    assert fam["DDP"] == (fam["DDP"][0], "zero0") and fam["FSDP"][1] == "fsdp"
    assert fam["EP"] == "a dense model has no experts"


def test_uneven_layers_split_as_megatron_core_does() -> None:
    # 6 layers over pp 4: not evenly (6 % 4), but with the embedding and the loss counted
    # as layers, 8 = 4 × 2 (Megatron-Core's account_for_embedding/loss_in_pipeline_split):
    # stages of 1, 2, 2, 1 layers. 5 layers over pp 2: neither 5 nor 5 + 2 = 7 splits in
    # two; with one MTP depth the layout E, 5 × t, m, L has 8 entries, 4 a stage.
    from zrt_core.search.space import _splits

    assert _splits(6, 4, 1, 0) and not _splits(6, 16, 1, 0)  # 16 stages for 8 entries
    assert not _splits(5, 2, 1, 0) and _splits(5, 2, 1, 1)
    six = ModelDims.from_config({**TINY, "n_layer": 6})
    space = TrainSpace(gpus=(8,), global_batch=8, seq_len=64, tp=(1,), cp=(1,),
                       pp=(1, 2, 4, 8), vp=(1,), micro_batch=(1,), recompute=("none",),
                       sharding=("zero1",), pp_schedule=("1f1b",))
    kept, removed = enumerate_train(space, six, nvlink_domain=8)
    # pp 1, 2 (even), 4 (embedding/loss); pp 8: 8 stages for 8 entries E, 6 × t, L — the
    # balanced layout, one entry a stage
    assert sorted(c.parallel.pp for c in kept) == [1, 2, 4, 8]
    assert removed["pp_layers"] == 0
    with pytest.raises(SpecError, match="negative"):
        TrainSpace(gpus=(8,), global_batch=8, seq_len=64, mtp=-1)
