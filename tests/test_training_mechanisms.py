"""The training estimator's framework mechanisms, each on a tiny graph with exact arithmetic:
the layout search for records without a published layout (docs/training-model.md)."""

from __future__ import annotations

import pytest

from zrt_core.estimate.training import (
    capture_for_training,
    case_from_record,
    default_overlap,
    estimate_case,
    layout_candidates,
)
from zrt_core.modelinfo import ModelDims
from zrt_core.plugins import PluginHost, get_plugin_manager

# h=64, 4 layers of 4 heads, FFN 256, vocab 128, 256 positions
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


def _dims(**changes) -> ModelDims:
    base = {"model_type": "gpt2", "hidden": 64, "layers": 4, "heads": 4, "kv_heads": 4,
            "head_dim": 16, "ffn": 256, "vocab": 128}
    return ModelDims(**{**base, **changes})


def test_layout_candidates_are_the_divisor_layouts_inside_the_nvlink_domain() -> None:
    # 16 GPUs, heads 4 → tp ∈ {1, 2, 4}; layers 4 → pp ∈ {1, 2, 4}; dp = 16 / (tp·pp) must
    # divide the global batch 8 (micro-batch 1): dp ∈ {1, 2, 4, 8}, so tp·pp ≥ 2; and the
    # 8 / dp micro-batches must fill the pp stages: (1, 2, 8) has 1 < 2, (1, 4, 4) 2 < 4
    got = {(p.tp, p.pp, p.dp) for p in layout_candidates(_dims(), 16, 8, 1, 8)}
    assert got == {(2, 1, 8), (2, 2, 4), (2, 4, 2), (4, 1, 4), (4, 2, 2), (4, 4, 1)}
    # an NVLink domain of 2 caps tp at 2 (global batch 16: tp 1, pp 2, dp 8 has 2 micro-batches)
    assert {p.tp for p in layout_candidates(_dims(), 16, 16, 1, 2)} == {1, 2}
    # GQA: 2 KV heads and tp 4 (a multiple of them) is allowed, tp 3 never divides 4 heads
    assert {p.tp for p in layout_candidates(_dims(kv_heads=2), 16, 16, 1, 8)} == {1, 2, 4}


def test_layout_candidates_drop_layouts_whose_states_cannot_fit() -> None:
    # P = 4·(64·(4+8)·16 + 4·16·64 + 2·64·256) + 128·64 = 4·(12288 + 4096 + 32768) + 8192
    #   = 204800 parameters; tp=pp=1, dp=16: P·(2 + 4 + 12/16) = 1382400 bytes
    dims = _dims()
    assert any((p.tp, p.pp) == (1, 1)
               for p in layout_candidates(dims, 16, 16, 1, 8, usable_bytes=1382400))
    assert not any((p.tp, p.pp) == (1, 1)
                   for p in layout_candidates(dims, 16, 16, 1, 8, usable_bytes=1382399))


@pytest.mark.needs("zrt-nvidia")
def test_a_record_without_a_layout_is_estimated_at_the_fastest_feasible_one(host) -> None:
    record = {"id": "t", "workload": "train", "source": "test", "hardware": "nvidia_h100_sxm",
              "num_gpus": 8, "seq_len": 64, "global_batch": 8, "micro_batch": 2,
              "model": {"hf_config": TINY},
              "parallel": {"tp": None, "pp": None, "dp": None, "cp": None, "vp": None}}
    case = case_from_record(record)
    assert case.layout_search
    assert any("layout not published" in a for a in case.assumptions)
    tiny = capture_for_training(TINY, 2, 64, host=host, use_cache=False)
    report = estimate_case(case, host=host, captured=tiny)
    p = report.parallel
    assert p.tp * p.pp * p.dp == 8 and 8 % (2 * p.dp) == 0
    assert report.notes[0].startswith("layout not published: searched")
    # it is the fastest of the candidates it names
    for cand in layout_candidates(case_dims(), 8, 8, 2, 8):
        other = estimate_case(case.__class__(**{**_fields(case), "parallel": cand,
                                                "overlap": default_overlap(cand, case.train),
                                                "layout_search": False}),
                              host=host, captured=tiny)
        assert report.step_time_s <= other.step_time_s + 1e-12


def case_dims() -> ModelDims:
    return ModelDims.from_config(TINY)


def _fields(case) -> dict:
    from attrs import asdict

    return asdict(case, recurse=False)


@pytest.mark.needs("zrt-nvidia")
def test_fp8_amax_reduction_blocks_each_stage_forward_and_backward(host) -> None:
    from zrt_core.cost.collectives import collective_cost
    from zrt_core.estimate.training import estimate_training
    from zrt_core.strategy import Parallel, TrainSpec

    tiny = capture_for_training(TINY, 2, 64, host=host, use_cache=False)
    par = Parallel(tp=2, dp=2)
    train = TrainSpec(micro_batch=2, global_batch=8, seq_len=64, precision="fp8")
    kw = dict(host=host, captured=tiny)
    none = estimate_training(TINY, "nvidia_h100_sxm", par, train, amax_reduction="none", **kw)
    both = estimate_training(TINY, "nvidia_h100_sxm", par, train, amax_reduction="dp_tp", **kw)
    tp = estimate_training(TINY, "nvidia_h100_sxm", par, train, amax_reduction="tp", **kw)
    # 4 layers × 4 linear GEMMs, 3 fp32 amaxes each; over dp × tp = 4 ranks (or tp = 2)
    hw = host.hardware_spec("nvidia_h100_sxm")
    one = collective_cost("all_reduce", 3 * 4 * 16, 4, 4, hw).time_s
    one_tp = collective_cost("all_reduce", 3 * 4 * 16, 2, 2, hw).time_s
    m = 8 // (2 * 2)  # micro-batches per replica, one stage: each runs a forward and a backward
    assert both.step_time_s - none.step_time_s == pytest.approx(2 * m * one, rel=1e-9)
    assert tp.step_time_s - none.step_time_s == pytest.approx(2 * m * one_tp, rel=1e-9)
    assert both.exposed_comm_s["dp"] - none.exposed_comm_s.get("dp", 0.0) == \
        pytest.approx(2 * m * one, rel=1e-9)


@pytest.mark.needs("zrt-nvidia")
def test_fp8_current_scaling_reads_each_cast_tensor_twice_and_reduces_no_amax(host) -> None:
    from zrt_core.estimate.training import estimate_training
    from zrt_core.ir.graph import TensorMeta
    from zrt_core.strategy import Parallel, TrainSpec
    from zrt_core.transforms.training.precision import Precision, precision_plan

    hw = host.hardware_spec("nvidia_h100_sxm")
    delayed, current = precision_plan("fp8", hw), precision_plan("fp8_cs", hw)
    assert (delayed.recipe, current.recipe) == ("fp8", "fp8")  # same GEMMs and formats
    assert (delayed.amax_pass, current.amax_pass) == (False, True)
    t = TensorMeta(shape=(128, 64), dtype="bfloat16")
    consumer = _gemm_node()
    d = Precision(delayed)._cast(0, consumer, t, "float8_e4m3fn")
    c = Precision(current)._cast(0, consumer, t, "float8_e4m3fn")
    # 128·64 = 8192 bf16 values: the cast reads 8192·2 = 16384 bytes, current scaling's amax
    # pass reads them once more (32768); both write row- and column-wise fp8 copies, 2·8192
    assert (d.bytes_read, c.bytes_read) == (16384, 32768)
    assert d.bytes_written == c.bytes_written == 16384
    # a tensor a norm or an activation kernel wrote: its amax came with it, one read
    fused = Precision(current)._cast(0, consumer, t, "float8_e4m3fn", amax_fused=True)
    assert fused.bytes_read == 16384
    tiny = capture_for_training(TINY, 2, 64, host=host, use_cache=False)
    par = Parallel(tp=2, dp=2)
    train = TrainSpec(micro_batch=2, global_batch=8, seq_len=64, precision="fp8_cs")
    kw = dict(host=host, captured=tiny)
    # no amax history, so no blocking reduction of it whatever the group
    none = estimate_training(TINY, "nvidia_h100_sxm", par, train, amax_reduction="none", **kw)
    both = estimate_training(TINY, "nvidia_h100_sxm", par, train, amax_reduction="dp_tp", **kw)
    assert both.step_time_s == none.step_time_s
    assert not any("amax all-reduce" in n for n in both.notes)


def _gemm_node():
    from zrt_core.ir.graph import Category, OpNode

    return OpNode(id=1, op="aten.mm", category=Category.MATMUL, phase="train_forward",
                  inputs=(), outputs=(), module_path="m", module_class="Linear",
                  layer_index=0, layer_kind="layer", flops=0, bytes_read=0, bytes_written=0,
                  formula="mm")


def test_nemotronh_bridge_recipes_run_without_tp_userbuffers() -> None:
    # tp 2 with SP: Megatron-Core's default hides (tp − 1)/tp = 1/2 of each forward TP/SP
    # collective under its GEMM (TE userbuffers). Megatron-Bridge's nemotronh perf recipes set
    # no comm_overlap, so a record naming one gets 0: the forward collectives block.
    base = {"id": "t", "workload": "train", "hardware": "nvidia_gb200_nvl72",
            "source": "NVIDIA Megatron-Bridge performance summary", "num_gpus": 4,
            "seq_len": 64, "global_batch": 8, "micro_batch": 1,
            "model": {"hf_config": TINY}, "parallel": {"tp": 2, "pp": 1}}
    assert case_from_record(base).overlap.tp_comm_overlap == 0.5
    named = {**base, "notes": "recipe: src/megatron/bridge/perf_recipes/nemotronh/gb200/"
                              "nemotronh.py:nemotron_3_super_pretrain_64gpu_gb200_fp8mx_config()"}
    case = case_from_record(named)
    assert case.overlap.tp_comm_overlap == 0.0
    assert case.overlap.tp_backward_async  # TE's backward gathers still run beside the GEMMs
    assert any("no TP userbuffer overlap" in a for a in case.assumptions)
    # a record whose release's config is found (26.04 Nemotron 3 Super on 64 GB200, TP 2):
    # v0.4.0's perf config starts from _pretrain_common (comm_overlap=None), whatever the notes
    found = {**base, "source": "NVIDIA Megatron-Bridge performance summary, NeMo 26.04 (...)",
             "model": {"name": "Nemotron 3 Super 120B-A12B", "hf_config": TINY},
             "precision": "mxfp8", "num_gpus": 64, "global_batch": 512,
             "parallel": {"tp": 2, "pp": 1, "cp": 1, "ep": 64}}
    assert case_from_record(found).overlap.tp_comm_overlap == 0.0


def test_a_deepseek_report_record_takes_the_reports_schedule_dispatch_and_overlap() -> None:
    # The DeepSeek-V3 report's run (HAI-LLM): DualPipe, its node-limited dispatch (DeepEP),
    # the all-to-all hidden under paired chunks, RMSNorm and MLA up-projection recomputed;
    # none of which the schema has a column for. A Megatron run of the same model (a
    # Megatron-Bridge row) keeps Megatron's defaults.
    moe = {**TINY, "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 256,
           "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2}
    base = {"id": "t", "workload": "train", "hardware": "nvidia_h800", "num_gpus": 8,
            "seq_len": 64, "global_batch": 16, "micro_batch": 1, "recompute": None,
            "model": {"hf_config": moe}, "parallel": {"tp": 1, "pp": 2, "ep": 4}}
    case = case_from_record({**base, "source": "DeepSeek-V3 Technical Report, section 3.2"})
    assert case.train.pp_schedule == "dualpipe"
    assert case.parallel.ep_dispatcher == "deepep"
    assert case.overlap.ep_batch_overlap
    assert (case.train.recompute, case.train.recompute_modules) == (
        "selective", ("layernorm", "mla_up_proj"))
    # DualPipe feeds half the micro-batches from each end: pp 3 cannot run it (16 / 1 / 2 = 8
    # micro-batches on a 2-wide dp would be even, the pp is not), so 1F1B is priced
    odd = case_from_record({**base, "num_gpus": 6, "parallel": {"tp": 1, "pp": 3, "ep": 2},
                            "source": "DeepSeek-V3 Technical Report, section 3.2"})
    assert odd.train.pp_schedule == "1f1b"
    assert any("not the report's DualPipe" in a for a in odd.assumptions)
    v2 = case_from_record({**base, "source": "DeepSeek-V2 (arXiv 2405.04434), section 3.1.4"})
    assert (v2.train.pp_schedule, v2.parallel.ep_dispatcher) == ("zb-h1", "alltoall")
    assert v2.overlap.ep_async and not v2.overlap.ep_batch_overlap
    bridge = case_from_record({**base, "source": "NVIDIA Megatron-Bridge performance summary, "
                                                 "NeMo 26.02 (...) / Model: DeepSeekV3"})
    assert (bridge.train.pp_schedule, bridge.parallel.ep_dispatcher) == ("1f1b", "alltoall")
    assert not bridge.overlap.ep_batch_overlap and bridge.train.recompute == "none"


def test_mlperf_records_take_nvidias_submission_settings() -> None:
    # NVIDIA's MLPerf Training configs (mlcommons/training_results_v3.1 ... v5.1): NVLS off
    # in every round's config_common.sh; from v4.1 the fused loss and TP-only amax reduction;
    # v5.1's NVFP4 Llama 3.1 405B keeps no layer in bf16 (first_last_layers_bf16 off)
    base = {"id": "t", "workload": "train", "hardware": "nvidia_gb200_nvl72", "num_gpus": 8,
            "seq_len": 64, "global_batch": 16, "micro_batch": 1,
            "model": {"hf_config": TINY}, "parallel": {"tp": 2, "pp": 1}}
    v51 = case_from_record({**base, "precision": "nvfp4",
                            "source": "MLPerf Training v5.1 closed, Llama 3.1 405B, NVIDIA"})
    assert (v51.bf16_layers, v51.cross_entropy, v51.amax_reduction, v51.nvls) == (
        (0, 0), "fused", "tp", False)
    v31 = case_from_record({**base, "precision": "fp8",
                            "source": "MLPerf Training v3.1 closed, GPT-3 175B, NVIDIA"})
    assert (v31.cross_entropy, v31.amax_reduction, v31.nvls) == ("megatron", "dp_tp", False)
    # another source's nvfp4 run: NVIDIA's NVFP4 paper keeps the last ~16% in bf16
    # (4 layers · 14/88 = 0.64, rounded to 1)
    other = case_from_record({**base, "precision": "nvfp4", "source": "a paper"})
    assert other.bf16_layers == (0, 1) and other.nvls


def test_megatron_bridge_kimi_k2_records_train_with_muon() -> None:
    # Megatron-Bridge's Kimi K2 perf configs default to optimizer_type="muon" (dist_muon);
    # the summaries note it under the table. Other models keep AdamW.
    base = {"id": "t", "workload": "train", "hardware": "nvidia_gb300_nvl72", "num_gpus": 8,
            "seq_len": 64, "global_batch": 16, "micro_batch": 1,
            "source": "NVIDIA Megatron-Bridge performance summary, NeMo 26.06 (...)",
            "model": {"name": "Kimi K2", "hf_config": TINY}, "parallel": {"tp": 1}}
    assert case_from_record(base).train.optimizer == "muon"
    other = {**base, "model": {"name": "Qwen3-30B-A3B", "hf_config": TINY}}
    assert case_from_record(other).train.optimizer == "adamw"


def test_ep_batch_overlap_hides_min_of_all_to_all_and_compute_for_paired_microbatches():
    from types import SimpleNamespace

    from zrt_core.estimate.training import _ep_batch_overlap
    from zrt_core.schedule.scheduler import OverlapRules

    ft = SimpleNamespace(exposed_comm_s={"ep": 3.0}, compute_s=4.0)
    bt = SimpleNamespace(exposed_comm_s={"ep": 1.0}, compute_s=8.0)
    on = OverlapRules(ep_batch_overlap=True)
    # A = 3 + 1 = 4 s under C = 12 s: all of it hides for the paired micro-batches,
    # (m - pp) / m = (10 - 2) / 10 = 0.8 of them -> 3.2 s, split 3:1 -> (2.4, 0.8)
    assert _ep_batch_overlap(on, ft, bt, 2, 10) == pytest.approx((2.4, 0.8), rel=1e-12)
    # compute shorter than the all-to-all: C = 2 s hides, (m - 1)/m = 0.5 -> 1 s, 3:1
    short_f = SimpleNamespace(exposed_comm_s={"ep": 3.0}, compute_s=1.0)
    short_b = SimpleNamespace(exposed_comm_s={"ep": 1.0}, compute_s=1.0)
    assert _ep_batch_overlap(on, short_f, short_b, 1, 2) == pytest.approx((0.75, 0.25))
    # off by default, and nothing to pair with one micro-batch
    assert _ep_batch_overlap(OverlapRules(), ft, bt, 1, 10) == (0.0, 0.0)
    assert _ep_batch_overlap(on, ft, bt, 1, 1) == (0.0, 0.0)
