"""The search's shared per-layer work (``TrainingReuse``) gives exactly what estimating each
layout alone gives: every report field, bit for bit, over a space that varies tp, pp, vp,
cp, ep, dp, micro-batch, recompute, ZeRO/FSDP and the schedule."""

from __future__ import annotations

import pytest

from zrt_core.estimate.training import _TRANSFORMED, estimate_training
from zrt_core.estimate.training.reuse import TrainingReuse
from zrt_core.modelinfo import ModelDims
from zrt_core.plugins import get_plugin_manager
from zrt_core.search.evaluate import TrainEvaluator, train_spec
from zrt_core.search.space import TrainSpace, enumerate_train

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "tie_word_embeddings": False}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4,
           "num_experts_per_tok": 2}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


def _report_json(report: object) -> dict:
    out = report.to_json()  # type: ignore[attr-defined]
    out.pop("timings_s", None)  # wall-clock times of the estimate's own steps
    return out


def _compare(config: dict, space: TrainSpace, hw: str = "h100",
             shared: TrainingReuse | None = None) -> int:
    host = get_plugin_manager()
    cands, _ = enumerate_train(space, ModelDims.from_config(config), 8)
    ev = TrainEvaluator(config, hw, space.global_batch, space.seq_len, host=host)
    shared = shared if shared is not None else TrainingReuse()
    for cand in cands:
        train = train_spec(cand, space.global_batch, space.seq_len)
        captured = ev.capture(cand.micro_batch, cand.precision)
        fast = estimate_training(config, ev.hw, cand.parallel, train, host=host,
                                 captured=captured, num_gpus=cand.gpus, reuse=shared)
        _TRANSFORMED.clear()  # the full estimate from scratch: no graph made before
        full = estimate_training(config, ev.hw, cand.parallel, train, host=host,
                                 captured=captured, num_gpus=cand.gpus)
        assert _report_json(fast) == _report_json(full), cand
    # the sharded, fused layer graphs were made once per (tp, cp, ep, micro-batch), not
    # once per layout (kept apart from the per-layout entries)
    made = [k for k in shared.layer_groups if k[1][0] == "sharded"]
    assert not [k for k in shared.groups if k[1][0] in ("sharded", "layer")]
    assert len(made) == len({(c.parallel.tp, c.parallel.cp, c.parallel.ep, c.micro_batch)
                             for c in cands}) < len(cands)
    return len(cands)


@pytest.mark.needs("zrt-nvidia")
def test_dense_layouts_equal_their_full_estimates() -> None:
    # 8 GPUs: tp, cp ∈ {1, 2}, pp 2 with vp 1 (1F1B) or 2 (interleaved), ZeRO-1/FSDP:
    # 2 × 2 × 2 × 2 = 16 layouts (dp 4, 2, 2, 1), 16 × 64 tokens
    space = TrainSpace(gpus=(8,), global_batch=16, seq_len=64, tp=(1, 2), pp=(2,),
                       cp=(1, 2), vp=(1, 2), micro_batch=(1,), recompute=("none",),
                       sharding=("zero1", "fsdp"), pp_schedule=("1f1b", "interleaved"))
    assert _compare(LLAMA, space) == 16


@pytest.mark.needs("zrt-nvidia")
def test_zero_stages_share_one_pipeline_simulation() -> None:
    # ZeRO 0 and 1 leave the forward and backward graphs, so the stage times the pipeline
    # simulation reads, as they are; ZeRO-2 reduce-scatters the gradients in every
    # micro-batch's backward (fsdp.py: grads_per_microbatch), other stage times. 8 GPUs,
    # tp 1, pp 2 (1F1B), dp 4, three shardings = 3 layouts, every report equal to its
    # estimate from scratch, 2 simulations made (the reuse's "pipeline" entries)
    space = TrainSpace(gpus=(8,), global_batch=16, seq_len=64, tp=(1,), pp=(2,), cp=(1,),
                       vp=(1,), micro_batch=(1,), recompute=("none",),
                       sharding=("zero0", "zero1", "zero2"), pp_schedule=("1f1b",))
    shared = TrainingReuse()
    assert _compare(LLAMA, space, shared=shared) == 3
    assert len([k for k in shared._values if k[0] == "pipeline"]) == 2


@pytest.mark.needs("zrt-nvidia")
def test_moe_layouts_equal_their_full_estimates() -> None:
    # 4 GPUs, ep ∈ {2, 4} over 4 experts carved out of tp × dp (tp 1: dp 4, 2 (pp 2);
    # tp 2: dp 2, 1), recompute none/selective, ZeRO-1/FSDP; ep 4 needs tp × dp = 4
    space = TrainSpace(gpus=(4,), global_batch=8, seq_len=64, tp=(1, 2), pp=(1, 2), cp=(1,),
                       vp=(1,), ep=(2, 4), micro_batch=(1,),
                       recompute=("none", "selective"), sharding=("zero1", "fsdp"),
                       pp_schedule=("1f1b",))
    assert _compare(MIXTRAL, space) > 8


@pytest.mark.needs("zrt-nvidia")
def test_search_rows_equal_with_and_without_reuse() -> None:
    from zrt_core.search import search

    space = TrainSpace(gpus=(4,), global_batch=8, seq_len=64, tp=(1, 2), pp=(1, 2), cp=(1,),
                       vp=(1,), micro_batch=(1, 2), recompute=("none", "full"),
                       sharding=("zero1", "fsdp"), pp_schedule=("1f1b",))
    # exact: every layout estimated in both runs (the two-tier search's screen needs the
    # reuse's anchors, so without reuse it would estimate more layouts than with it)
    fast = search(LLAMA, "h100", space, full_report=False, exact=True)
    TrainEvaluator.reuse_layers = False
    try:
        _TRANSFORMED.clear()
        full = search(LLAMA, "h100", space, full_report=False, exact=True)
    finally:
        TrainEvaluator.reuse_layers = True
    assert fast.rows == full.rows and fast.ranking == full.ranking


def test_layer_group_entries_outlive_the_per_layout_ones() -> None:
    # a search that comes back to a layer group after more than GROUPS_KEPT per-layout
    # ("transform") entries still finds the group's sharded graphs: they have their own
    # store (made counts the calls of make)
    from zrt_core.estimate.training.reuse import GROUPS_KEPT

    reuse, captured, made = TrainingReuse(), object(), []

    def make(tag: str):
        return lambda notes: made.append(tag) or tag

    reuse.shared(captured, ("sharded", 1), [], make("s"))
    for k in range(GROUPS_KEPT + 1):
        reuse.shared(captured, ("transform", k), [], make("t"))
    assert reuse.shared(captured, ("sharded", 1), [], make("s")) == "s"
    # one sharded make, GROUPS_KEPT + 1 transform makes; the first transform was dropped
    assert made.count("s") == 1 and made.count("t") == GROUPS_KEPT + 1
    reuse.shared(captured, ("transform", 0), [], make("t"))
    assert made.count("t") == GROUPS_KEPT + 2
