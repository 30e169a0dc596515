"""The Megatron-Bridge recipe table: every row validates, every published MoE training record finds
its perf config, and sample rows equal the values read from the recipes' source."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from zrt_core import recipes
from zrt_core.errors import SpecError

PUBLIC = Path(recipes.__file__).parent / "data" / "validation" / "public.yaml"
MOE_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _moe_training_records() -> list[dict]:
    records = yaml.load(PUBLIC.read_text(encoding="utf-8"), Loader=LOADER)
    return [r for r in records if r["id"].startswith("mbridge-") and r["workload"] == "train"
            and any(k in r["model"]["hf_config"] for k in MOE_KEYS)]


def test_every_row_loads_with_known_fields_and_types() -> None:
    rows = recipes.load_rows()
    # 1468 MoE pre-training configs across the nine releases (tools/mbridge_recipes/build.py):
    # 1245 of the eight tagged ones and 223 of 26.06.01, read at 381d0b825.
    assert len(rows) == 1468
    assert sum(r.release == "26.06.01" for r in rows) == 223
    assert {r.release for r in rows} == set(recipes.RELEASES)
    for r in rows:
        assert r.gpu in recipes.GPUS and r.precision in recipes.PRECISIONS
        # the backend is named only when the dispatcher is flex
        assert r.moe_flex_dispatcher_backend is None or r.moe_token_dispatcher_type == "flex"
        assert set(r.recipe_defaults) <= set(recipes.FIELD_TYPES)


def test_loader_rejects_an_unknown_column_and_a_bad_type(tmp_path: Path) -> None:
    data = yaml.load((Path(recipes.__file__).parent / "data" / "recipes"
                      / "megatron_bridge.yaml").read_text(encoding="utf-8"), Loader=LOADER)
    columns, row = data["columns"], data["rows"][0]

    def table(cols: list, values: list) -> Path:
        path = tmp_path / "table.yaml"
        path.write_text(yaml.safe_dump({"columns": cols, "rows": [values]}), encoding="utf-8")
        return path

    assert recipes.load_rows(table(columns, row))[0] == recipes.load_rows()[0]
    with pytest.raises(SpecError, match="unknown keys \\['moe_magic'\\]"):
        recipes.load_rows(table([*columns, "moe_magic"], [*row, 1]))
    ep = columns.index("ep")
    with pytest.raises(SpecError, match=r"rows\[0\]\.ep has type str"):
        recipes.load_rows(table(columns, [*row[:ep], "8", *row[ep + 1:]]))
    kind = columns.index("moe_token_dispatcher_type")
    with pytest.raises(SpecError, match="moe_token_dispatcher_type is 'a2a'"):
        recipes.load_rows(table(columns, [*row[:kind], "a2a", *row[kind + 1:]]))
    with pytest.raises(SpecError, match="must be a list of"):
        recipes.load_rows(table(columns, row[:-1]))


#: records whose published layout no perf config at the release's tag has (the tag's recipe
#: changed after, or differs from, what was measured); lookup must say None, not guess.
UNMATCHED = {
    # v0.3.1 GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2 has EP=64; the table prints EP=8
    "mbridge-26.02.01-pre-training-gpt-oss-120b-b200-64gpu-bf16-gbs1280",
    # v0.3.1 QWEN3_30B_A3B H100 configs are PP=1 EP=16; the table prints PP=2 VP=12 EP=8
    "mbridge-26.02.01-pre-training-qwen3-30b-a3b-h100-16gpu-fp8-gbs1024",
    # v0.2.0 GPT_OSS_120B_B200_BF16_BASE_CONFIG has EP=64; the table prints EP=8
    "mbridge-25.11-pre-training-gpt-oss-120b-b200-64gpu-bf16-gbs512",
    # v0.2.0 QWEN3_235B_A22B_B200_* have VP=4; the table prints VP=2
    "mbridge-25.11-pre-training-qwen3-235b-a22b-b200-64gpu-fp8-mx-gbs1024",
    # v0.2.0 GPT_OSS_120B_H100_BF16_BASE_CONFIG has MBS=1; the table prints MBS=4
    "mbridge-25.11-pre-training-gpt-oss-120b-h100-64gpu-bf16-gbs512",
    # v0.2.0 QWEN3_30B_A3B_H100_* have VP=12, MBS=1; the table prints VP=24, MBS=2
    "mbridge-25.11-pre-training-qwen3-30b-a3b-h100-16gpu-fp8-cs-gbs512",
    # v0.1.0rc4 qwen3_30b_a3b_llm_pretrain.yaml h100 has VP=12; the table prints VP=24
    "mbridge-25.09-pre-training-qwen3-30b-a3b-h100-16gpu-fp8-gbs512",
}


def test_every_moe_training_record_finds_its_perf_config_or_is_listed() -> None:
    records = _moe_training_records()
    assert len(records) == 67
    matched = 0
    for record in records:
        found = recipes.candidates(record)
        recipe = recipes.lookup(record)
        if record["id"] in UNMATCHED:
            assert found == [] and recipe is None, record["id"]
            continue
        # one row, or (25.09 DeepSeek-V3 H100 "FP8") the FP8-CS and FP8-SS rows of one matrix
        # entry, which share every setting; lookup returns the FP8-CS one
        assert len(found) == 1 or {r.precision for r in found} == {"fp8_cs", "fp8_ss"}, record["id"]
        assert recipe is not None, record["id"]
        par = record["parallel"]
        assert recipe.layout == (par["tp"], par["pp"], par["vp"] or 1, par["cp"], par["ep"])
        assert (recipe.num_gpus, recipe.gbs, recipe.mbs) == (
            record["num_gpus"], record["global_batch"], record["micro_batch"])
        matched += 1
    assert matched == 60  # 67 records - 7 listed above


def _only(record_id: str) -> recipes.Recipe:
    record = next(r for r in _moe_training_records() if r["id"] == record_id)
    recipe = recipes.lookup(record)
    assert recipe is not None
    return recipe


def test_26_08_deepseek_v3_gb300_mxfp8_is_full_iteration_graph_hybridep_with_a2a_overlap() -> None:
    # Megatron-Bridge@067f987d src/megatron/bridge/perf_recipes/deepseek/gb300/deepseek_v3.py
    # deepseek_v3_pretrain_256gpu_gb300_fp8mx_config(): PP=2 VP=8 EP=32 MBS=1 GBS=4096,
    # recompute_modules=[], then deepseek/common.py _enable_deepseek_full_iteration_mxfp8():
    # flex + hybridep, cuda_graph_impl="full_iteration", moe_expert_rank_capacity_factor=1.5,
    # overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True, shared-expert overlap off.
    r = _only("mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096")
    assert (r.provenance_tag, r.precision) == ("067f987d", "fp8_mx")
    assert (r.pp, r.vp, r.ep, r.mbs, r.gbs) == (2, 8, 32, 1, 4096)
    assert (r.moe_token_dispatcher_type, r.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert (r.moe_a2a_overlap, r.delay_wgrad_compute, r.moe_shared_expert_overlap) == (
        True, True, False)
    assert (r.cuda_graph_impl, r.cuda_graph_scope) == ("full_iteration", ())
    assert r.moe_expert_rank_capacity_factor == 1.5
    assert (r.recompute_granularity, r.recompute_modules) == ("selective", ())


def test_26_08_fp8_dot_product_attention_follows_each_perf_config() -> None:
    # Megatron-Bridge@067f987d perf_recipes: deepseek/gb300/deepseek_v3.py calls
    # _enable_deepseek_full_iteration_mxfp8(cfg, fp8_dot_product_attention=True, ...); the
    # gb200 config passes only fp8_output_proj, so MixedPrecisionConfig's default False
    # stands; gpt_oss/common.py _apply_gpt_oss_120b_full_iter_fp8mx_configs sets it on both
    fp8 = {gpu: _only(f"mbridge-26.08-pre-training-deepseek-v3-{gpu}-256gpu-mxfp8-gbs4096")
           .fp8_dot_product_attention for gpu in ("gb200", "gb300")}
    assert fp8 == {"gb200": False, "gb300": True}
    for gpu in ("gb200", "gb300"):
        r = _only(f"mbridge-26.08-pre-training-gpt-oss-120b-{gpu}-64gpu-mxfp8-gbs1280")
        assert r.fp8_dot_product_attention is True
    # 25.09's perf matrices are not read for it: unresolved, never guessed
    rows = [r for r in recipes.load_rows() if r.release == "25.09"]
    assert {r.fp8_dot_product_attention for r in rows} == {None}
    assert all("fp8_dot_product_attention" in r.recipe_defaults for r in rows)


def test_26_04_01_deepseek_v3_gb200_bf16_row() -> None:
    # v0.4.2 scripts/performance/configs/deepseek/deepseek_workload_base_configs.py
    # DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_BF16_V1: PP=4 VP=4 EP=64 GBS=2048, hybridep,
    # moe_a2a_overlap=False, TE graphs on attn/moe_router/moe_preprocess, recompute mla_up_proj;
    # utils/overrides.py set_workload_base_configs -> apply_flex_dispatcher_backend (GB200 is
    # compute capability 10, which HybridEP accepts) -> flex, shared-expert overlap off.
    row = next(r for r in recipes.load_rows() if (r.release, r.model, r.gpu, r.precision,
                                                  r.variant) == ("26.04.01", "deepseek_v3", "gb200",
                                                                 "bf16", "v1"))
    assert (row.num_gpus, row.pp, row.vp, row.ep, row.gbs) == (256, 4, 4, 64, 2048)
    assert (row.moe_token_dispatcher_type, row.moe_flex_dispatcher_backend) == ("flex", "hybridep")
    assert (row.moe_a2a_overlap, row.moe_shared_expert_overlap) == (False, False)
    assert row.cuda_graph_impl == "transformer_engine"
    assert row.cuda_graph_scope == ("attn", "moe_router", "moe_preprocess")
    assert row.recompute_modules == ("mla_up_proj",)
    assert row.moe_router_fusion is True  # deepseek_llm_pretrain.py set_deepseek_v3_common_configs


def test_26_04_01_gpt_oss_h100_falls_back_to_alltoall() -> None:
    # v0.4.2 gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2 names no
    # flex backend, so utils/overrides.py set_workload_base_configs sets dispatcher "alltoall".
    r = _only("mbridge-26.04.01-pre-training-gpt-oss-120b-h100-64gpu-bf16-gbs1280")
    assert (r.moe_token_dispatcher_type, r.moe_flex_dispatcher_backend) == ("alltoall", None)
    assert (r.pp, r.ep, r.gbs) == (4, 8, 1280)
    assert r.recompute_modules == ("layernorm", "moe_act")


def test_25_09_deepseek_v3_h100_uses_deepep_and_a2a_overlap() -> None:
    # v0.1.0rc4 scripts/performance/run_script.py main(), deepseek v3 branch: H100 ->
    # enable_deepep (flex + deepep), A2A_1F1B (overlap_moe_expert_parallel_comm and
    # delay_wgrad_compute True, shared-expert overlap False), recompute ["mla_up_proj", "mlp"];
    # configs/deepseek/deepseek_v3_llm_pretrain.yaml perf_matrix.h100.num_gpus_1024: TP=2 PP=8 VP=4
    # EP=64 GBS=8192.
    r = _only("mbridge-25.09-pre-training-deepseek-v3-h100-1024gpu-fp8-gbs8192")
    assert r.precision == "fp8_cs"
    assert (r.moe_token_dispatcher_type, r.moe_flex_dispatcher_backend) == ("flex", "deepep")
    assert (r.moe_a2a_overlap, r.delay_wgrad_compute, r.moe_shared_expert_overlap) == (
        True, True, False)
    assert r.recompute_modules == ("mla_up_proj", "mlp")
    assert (r.tp, r.pp, r.vp, r.ep, r.gbs) == (2, 8, 4, 64, 8192)


def test_26_04_01_gpt_oss_graph_impl_is_the_megatron_core_default() -> None:
    # No perf, recipe or provider code at v0.4.2 sets cuda_graph_impl for GPT-OSS, so it is
    # Megatron-Core's TransformerConfig default at the pinned 3rdparty/Megatron-LM commit 2edffadb:
    # cuda_graph_impl = "none"; the bridge (models/gpt_oss/gpt_oss_bridge.py) sets
    # moe_permute_fusion = True.
    r = _only("mbridge-26.04.01-pre-training-gpt-oss-120b-b200-64gpu-bf16-gbs1280")
    assert r.cuda_graph_impl == "none" and r.moe_permute_fusion is True
    assert ("cuda_graph_impl (Megatron-LM@2edffadb megatron/core/transformer/transformer_config.py)"
            in r.provider_defaults)


def test_lookup_is_none_for_an_unknown_release_model_or_layout() -> None:
    record = next(r for r in _moe_training_records()
                  if r["id"] == "mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096")
    assert recipes.lookup({**record, "source": "NeMo 24.12"}) is None
    assert recipes.lookup({**record, "parallel": {**record["parallel"], "ep": 16}}) is None
    assert recipes.lookup({**record, "model": {"name": "Mixtral 8x7B"}}) is None
    assert recipes.model_key("Qwen3-235B-A22B") == "qwen3_235b_a22b"


@pytest.mark.parametrize(("name", "key"), [
    ("Qwen3-VL-30B-A3B", "qwen3_vl_30b_a3b"), ("Qwen3_VL_30B_a3B", "qwen3_vl_30b_a3b"),
    ("Qwen3-VL-235B-A22B", "qwen3_vl_235b_a22b"), ("Qwen3.5-VL-35B-A3B", "qwen35_vl_35b_a3b"),
    ("Qwen3.5-397B-A17B", "qwen35_vl_397b_a17b"), ("Qwen3-30B-A3B", "qwen3_30b_a3b"),
    # the summaries' spelling and other separators reach the same rows
    ("Qwen3_30B_a3B", "qwen3_30b_a3b"), ("GPT-OSS-120B", "gpt_oss_120b"),
    ("GPT-OSS 120B (117B total, 5.1B active)", "gpt_oss_120b"),
    ("Nemotron-3-Nano", "nemotron_3_nano"), ("Kimi K2", "kimi_k2"),
])
def test_model_names_find_their_rows_whatever_the_separators(name: str, key: str) -> None:
    assert recipes.model_key(name) == key


def test_a_26_08_qwen3_vl_record_finds_its_perf_config() -> None:
    record = {"id": "mbridge-26.08-pre-training-qwen3-vl-30b-a3b-b200-8gpu-bf16-gbs512",
              "source": "NVIDIA Megatron-Bridge performance summary, NeMo 26.08",
              "model": {"name": "Qwen3-VL-30B-A3B"}, "hardware": "nvidia_b200",
              "num_gpus": 8, "global_batch": 512, "micro_batch": 1, "precision": "bf16",
              "parallel": {"tp": 1, "pp": 1, "cp": 1, "ep": 8}}
    r = recipes.lookup(record)
    assert r is not None and r.provenance_config == (
        "qwen3_vl_30b_a3b_pretrain_8gpu_b200_bf16_config()")
    assert r.moe_token_dispatcher_type == "alltoall"


def test_25_11_qwen3_30b_dispatcher_is_the_provider_default() -> None:
    # v0.2.0: QWEN3_30B_A3B_B200_FP8_MX_BASE_CONFIG names no flex backend and v0.2.0's
    # set_workload_base_configs (utils/helpers.py) sets no dispatcher, so the value is the
    # provider class default, src/megatron/bridge/models/qwen/qwen_provider.py
    # moe_token_dispatcher_type: str = "alltoall"; the recipe graphs moe_router + moe_preprocess.
    r = _only("mbridge-25.11-pre-training-qwen3-30b-a3b-b200-8gpu-fp8-mx-gbs512")
    assert (r.moe_token_dispatcher_type, r.moe_flex_dispatcher_backend) == ("alltoall", None)
    assert ("moe_token_dispatcher_type (src/megatron/bridge/models/qwen/qwen_provider.py)"
            in r.provider_defaults)
    assert (r.cuda_graph_impl, r.cuda_graph_scope) == (
        "transformer_engine", ("moe_router", "moe_preprocess"))
    assert r.moe_a2a_overlap is False


def test_a_printed_layout_its_release_does_not_run_is_named_not_replaced() -> None:
    from zrt_core.estimate.training import case_from_record

    record = next(r for r in _moe_training_records()
                  if r["id"] == "mbridge-25.11-pre-training-gpt-oss-120b-b200-64gpu-bf16-gbs512")
    # the 25.11 summary prints EP 8; v0.2.0's only GPT-OSS-120B B200 bf16 config at 64 GPUs
    # and GBS 512 sets EP 64 (GPT_OSS_120B_B200_BF16_BASE_CONFIG), micro-batch 4
    assert recipes.lookup(record) is None
    other = recipes.layout_conflict(record)
    assert other is not None and (other.layout, other.mbs) == ((1, 1, 1, 1, 64), 4)
    case = case_from_record(record)
    assert case.parallel.ep == 8  # priced as printed
    assert any("runs tp 1, pp 1, vp 1, cp 1, ep 64, micro-batch 4" in a
               for a in case.assumptions)
    # a record whose layout its release runs has no such note
    ok = next(r for r in _moe_training_records()
              if r["id"] == "mbridge-26.02-pre-training-gpt-oss-120b-b200-64gpu-bf16-gbs1280")
    assert recipes.lookup(ok) is not None and recipes.layout_conflict(ok) is None


def test_deepseek_v3_16_stage_records_run_the_recipes_pipeline_layout() -> None:
    from zrt_core.estimate.training import case_from_record
    from zrt_core.schedule.stages import StageSplit

    # Megatron-Bridge@067f987d src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py
    # _get_deepseek_v3_pipeline_layout: (4, 4) (and (16, 1), (8, 2)) ->
    # [embedding + 4 decoder] + 14 × [4 decoder] + [decoder, mtp, loss]; the GB300 perf
    # config passes the same layout as the string "Et*4|(t*4|)*14tmL". 4 + 14·4 + 1 = 61
    # decoder layers over pp × vp = 16 virtual stages.
    lists = "Etttt|" + "tttt|" * 14 + "tmL"
    gb200 = _only("mbridge-26.08-pre-training-deepseek-v3-gb200-256gpu-mxfp8-gbs4096")
    gb300 = _only("mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096")
    assert (gb200.pp, gb200.vp, gb200.pipeline_model_parallel_layout) == (4, 4, lists)
    assert (gb300.pp, gb300.vp, gb300.pipeline_model_parallel_layout) == (
        2, 8, "Et*4|(t*4|)*14tmL")
    record = next(r for r in _moe_training_records() if r["id"] ==
                  "mbridge-26.08-pre-training-deepseek-v3-gb200-256gpu-mxfp8-gbs4096")
    case = case_from_record(record)
    assert case.stage_split == StageSplit(layout=lists)
    assert f"pipeline layout {lists} (Megatron-Bridge 067f987d " \
           "deepseek_v3_pretrain_256gpu_gb200_fp8mx_config())" in case.assumptions
    # a recipe without a layout (Qwen3-30B-A3B, pp 1) leaves the record's own split
    q = next(r for r in _moe_training_records()
             if r["id"] == "mbridge-26.08-pre-training-qwen3-30b-a3b-gb200-8gpu-mxfp8-gbs512")
    assert case_from_record(q).stage_split == "even"


def test_a_release_without_a_tag_is_read_at_its_summary_commit() -> None:
    # 26.06.01 has no Megatron-Bridge tag; its summary landed in 381d0b825, whose perf_recipes
    # run Qwen3-30B-A3B on 8 GB300 as 26.08 does: full-iteration CUDA graphs, HybridEP,
    # EP all-to-all overlap, a 1.5x static expert buffer (the summary row: MBS 8, EP 8)
    record = {"source": "NVIDIA Megatron-Bridge performance summary, NeMo 26.06.01 (...)",
              "hardware": "nvidia_gb300_nvl72", "model": {"name": "Qwen3-30B-A3B"},
              "precision": "mxfp8", "num_gpus": 8, "global_batch": 512, "micro_batch": 8,
              "parallel": {"tp": 1, "pp": 1, "vp": None, "cp": 1, "ep": 8}}
    row = recipes.lookup(record)
    assert row is not None and row.release == "26.06.01"
    assert row.provenance_tag == "381d0b825"
    assert (row.cuda_graph_impl, row.moe_flex_dispatcher_backend, row.moe_a2a_overlap,
            row.moe_expert_rank_capacity_factor) == ("full_iteration", "hybridep", True, 1.5)


def test_a_global_batch_no_config_has_runs_the_printed_layouts_config() -> None:
    import attrs

    # Megatron-Bridge's perf launcher overrides the config's global batch
    # (scripts/performance/argument_parser.py, -gb/--global_batch_size): the 26.06 summary
    # prints DeepSeek-V3 on 256 GB300 at GBS 15,360 beside the config's 4,096, same layout
    record = next(r for r in _moe_training_records()
                  if r["id"] == "mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096")
    row = _only(record["id"])
    wide = {**record, "global_batch": 15360}
    assert recipes.candidates(wide) == []
    assert recipes.lookup(wide) == row  # the row keeps its own global batch
    assert row.gbs == 4096
    # two configs of the layout at other batches that agree on everything else: the first
    other = attrs.evolve(row, gbs=2048, variant="v1")
    assert recipes.lookup(wide, (other, row)) == other
    # ... that disagree on a setting: no config (never a guess)
    split = attrs.evolve(row, gbs=2048, moe_a2a_overlap=not row.moe_a2a_overlap)
    assert recipes.lookup(wide, (split, row)) is None
    # another layout at another batch is not the record's config
    assert recipes.lookup({**wide, "parallel": {**record["parallel"], "ep": 16}}) is None


def test_a_batch_override_is_priced_at_the_printed_batch_and_said() -> None:
    from zrt_core.estimate.training import case_from_record

    record = next(r for r in _moe_training_records()
                  if r["id"] == "mbridge-26.08-pre-training-deepseek-v3-gb300-256gpu-mxfp8-gbs4096")
    case = case_from_record({**record, "global_batch": 15360})
    assert case.train.global_batch == 15360
    assert case.parallel.ep_dispatcher == _only(record["id"]).moe_flex_dispatcher_backend
    assert any("(global batch 4096) run at the printed global batch 15360" in a
               for a in case.assumptions)
    plain = case_from_record(record)
    assert not any("run at the printed global batch" in a for a in plain.assumptions)
