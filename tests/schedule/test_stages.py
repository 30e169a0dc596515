"""plan_stages: Megatron-Core's pipeline splits — even, uneven first/last, the embedding/loss
accounting, layout strings, the records' fallback — with exact layers per stage."""

from __future__ import annotations

import pytest

from zrt_core.errors import LayoutError
from zrt_core.schedule.stages import (
    StageSplit,
    balanced_layout,
    parse_layout,
    plan_stages,
    render_layout,
)


def test_even_split_and_its_refusal() -> None:
    plan = plan_stages(8, 4, 4)
    assert plan.ranges == (range(0, 2), range(2, 4), range(4, 6), range(6, 8))
    assert plan.layout == "Ett|(tt|)*2ttL"
    with pytest.raises(LayoutError, match="pp × vp = 4 does not divide the 7 layers"):
        plan_stages(7, 4, 4)


def test_mtp_layers_join_the_last_stage_by_default() -> None:
    # 8 layers over 2 stages, one MTP depth of 2 captured layers (indices 8, 9)
    plan = plan_stages(8, 2, 2, mtp_depths=1, mtp_layers_per_depth=2)
    assert plan.ranges == (range(0, 4), range(4, 10))
    assert plan.layout == "Etttt|ttttmL"


def test_uneven_first_and_last_ranks_interleaved() -> None:
    # Megatron-Core: 14 layers, pp 4, vp 2, first 2, last 4: middle ranks 8 / 2 = 4 each;
    # per chunk: rank 0 → 1, ranks 1-2 → 2, rank 3 → 2; model order is chunk-major
    plan = plan_stages(14, 8, 4, StageSplit(first_layers=2, last_layers=4))
    assert plan.sizes == (1, 2, 2, 2, 1, 2, 2, 2)
    assert sum(plan.sizes) == 14
    # only the first: 10 layers, pp 3, first 2 (vp 1): the other two ranks take 4 each
    assert plan_stages(10, 3, 3, StageSplit(first_layers=2)).sizes == (2, 4, 4)
    # pp 2 with both given: no middle stage, and none must remain
    assert plan_stages(10, 2, 2, StageSplit(first_layers=3, last_layers=7)).sizes == (3, 7)


@pytest.mark.parametrize(("split", "rule"), [
    (StageSplit(first_layers=3), "not divisible by vp=2"),          # 3 % 2
    (StageSplit(first_layers=2, last_layers=2), "middle pipeline stage are not divisible"),
    (StageSplit(first_layers=4, last_layers=4, layout=None), "middle pipeline stage are not"),
])
def test_uneven_split_refusals_name_megatrons_rule(split: StageSplit, rule: str) -> None:
    # 10 layers, pp 4, vp 2: first 2 / last 2 leave 6 layers = 3 per middle rank, odd for vp 2
    with pytest.raises(LayoutError, match=rule):
        plan_stages(10, 8, 4, split)


def test_uneven_split_mismatch_and_v_schedules_refused() -> None:
    with pytest.raises(LayoutError, match="middle pipeline stages"):
        plan_stages(10, 2, 2, StageSplit(first_layers=3, last_layers=3))  # 4 layers, 0 ranks
    with pytest.raises(LayoutError, match="1F1B-family"):
        plan_stages(8, 4, 2, StageSplit(first_layers=2), rank_major=False)


def test_options_that_megatron_forbids_together() -> None:
    with pytest.raises(LayoutError, match="cannot be combined"):
        StageSplit(first_layers=2, layout="Et|tL")
    with pytest.raises(LayoutError, match="cannot be combined"):
        StageSplit(last_layers=2, embedding_loss=True)


def test_embedding_and_loss_counted_as_layers() -> None:
    # Llama 3.1 405B on pp 8 × vp 8: 126 + 2 = 128 over 64 stages of 2
    plan = plan_stages(126, 64, 8, "embedding-loss")
    assert plan.sizes == (1,) + (2,) * 62 + (1,)
    # MTP is not counted (Megatron-Core): 61 + 2 = 63 does not divide 16
    with pytest.raises(LayoutError, match="63 layers with the embedding and the loss"):
        plan_stages(61, 16, 16, "embedding-loss", mtp_depths=1)
    # a stage may be left without decoder layers (get_num_layers_to_build asserts >= 0)
    assert plan_stages(2, 2, 2, "embedding-loss").sizes == (1, 1)
    assert plan_stages(6, 4, 4, "embedding-loss").sizes == (1, 2, 2, 1)


def test_layout_string_grammar() -> None:
    assert parse_layout("Et*3|(tt|)*2,m|L") == ["Ettt", "tt", "tt", "m", "L"]
    assert render_layout(["Et", *["tt"] * 30, "mL"]) == "Et|(tt|)*30mL"
    assert parse_layout(render_layout(["Ett", "t" * 6, "t" * 6, "tL"])) == \
        ["Ett", "t" * 6, "t" * 6, "tL"]
    with pytest.raises(LayoutError, match="unknown characters 'x'"):
        parse_layout("Ex|tL")


def test_deepseek_v3_layouts_from_megatron() -> None:
    # Megatron-Core's docstring example on pp 8 × vp 4 (32 stages): MTP alone in stage 30,
    # the loss alone in stage 31 (ranges: 3 + 29·2 = 61 decoder layers, then MTP index 61)
    plan = plan_stages(61, 32, 8, StageSplit(layout="Et*3|(tt|)*29,m|L"), mtp_depths=1)
    assert plan.sizes == (3,) + (2,) * 29 + (1, 0)
    assert plan.ranges[30] == range(61, 62) and plan.ranges[31] == range(62, 62)
    # Megatron-Bridge's H100 recipe for the same layout: Et|(tt|)*30mL
    bridge = plan_stages(61, 32, 8, StageSplit(layout="Et|(tt|)*30mL"), mtp_depths=1)
    assert bridge.sizes == (1,) + (2,) * 30 + (1,)
    assert bridge.ranges[-1] == range(61, 62)  # no decoder layer: the MTP layer and the loss


@pytest.mark.parametrize(("layout", "rule"), [
    ("Et|(tt|)*30L", "0 MTP layers"),
    ("Et|(tt|)*29ttmL", "31 stages"),
    ("tE|(tt|)*30mL", "embedding"),
    ("Et|(tt|)*30Lm", "loss"),
    ("Et|(tt|)*29tmt|L", "before the MTP"),
    ("Et|(ttt|)*19tttm|(|)*10L", "last virtual stage of their pipeline rank"),
])
def test_layout_refusals_name_the_rule(layout: str, rule: str) -> None:
    with pytest.raises(LayoutError, match=rule):
        plan_stages(61, 32, 8, StageSplit(layout=layout), mtp_depths=1)


def test_records_fallback_balances_layout_entries() -> None:
    # DeepSeek-V3, 61 layers + MTP on pp 8 × vp 4: neither 61 nor 63 divide 32; the 64
    # entries E + 61 t + m + L do, two per stage: Megatron-Bridge's H100 layout exactly
    plan = plan_stages(61, 32, 8, "auto", mtp_depths=1)
    assert plan.layout == "Et|(tt|)*30mL"
    assert "Megatron-Core refuses 61 layers" in plan.note
    # on 16 stages: four entries each, first 3 decoder layers, last 2 + MTP
    assert plan_stages(61, 16, 16, "auto", mtp_depths=1).sizes == (3,) + (4,) * 14 + (3,)
    # Megatron-Core's own accounting wins when it divides: 94 + 2 = 96 over 32
    plan = plan_stages(94, 32, 8, "auto")
    assert plan.sizes == (2,) + (3,) * 30 + (2,)
    assert "account_for_embedding" in plan.note
    # and an even split needs no note
    assert plan_stages(64, 64, 8, "auto").note is None
    with pytest.raises(LayoutError, match="refuses it without a pipeline layout"):
        plan_stages(7, 4, 4, "auto")


def test_balanced_layout_spreads_entries_with_the_extra_ones_in_the_middle() -> None:
    # DeepSeek-V2: 60 layers + embedding + loss = 62 entries over 16 stages: 62 = 16·3 + 14,
    # so the 14 middle stages hold 4 entries and the two ends 3 ("Ett" and "ttL")
    layout = balanced_layout(60, 16)
    stages = parse_layout(layout)
    assert [len(s) for s in stages] == [3] + [4] * 14 + [3]
    assert stages[0] == "Ett" and stages[-1] == "ttL"
    plan = plan_stages(60, 16, 16, StageSplit(layout=layout))
    assert [len(r) for r in plan.ranges] == [2] + [4] * 14 + [2]
    # one MTP depth: 63 entries = 16·3 + 15, the middle stages take 14 extra entries and the
    # first the 15th; the last keeps 3 entries: one decoder layer, the MTP layer and the loss
    stages = parse_layout(balanced_layout(60, 16, mtp_depths=1))
    assert [len(s) for s in stages] == [4] * 15 + [3] and stages[-1] == "tmL"
    assert balanced_layout(2, 8) is None  # 4 entries cannot fill 8 stages
