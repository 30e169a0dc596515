"""zrt_core.validate: records read strictly but tolerantly, the defaults for null fields, one
train and one infer record predicted on tiny configs, failures reported per record, and the
JSON in SCHEMA.md's shape."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from zrt_core.errors import SpecError
from zrt_core.plugins import PluginHost, get_plugin_manager
from zrt_core.validate import (
    RecordResult,
    ValidationRun,
    Validator,
    inference_case,
    layer_case,
    load_records,
    records_from_data,
    training_case,
    validate,
)

# GPT-2 of h=64, 2 layers, 4 heads, FFN 256, vocab 128, 128 positions
TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256,
             "vocab_size": 128, "n_positions": 128}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128, "max_position_embeddings": 256}

TRAIN = {
    "id": "tiny-train", "source": "made up for tests", "trust": "low", "workload": "train",
    "model": {"name": "tiny gpt2", "hf_config": TINY_GPT2},
    "hardware": "nvidia_h100_sxm", "num_gpus": 4,
    "parallel": {"tp": 2, "pp": 1, "vp": None, "cp": 1, "ep": None, "etp": None, "dp": None,
                 "sp": None, "zero": None, "fsdp": None},
    "recompute": None, "micro_batch": None, "global_batch": 8, "seq_len": 32,
    "precision": None,
    "measured": {"step_time_s": 0.01, "tokens_per_s_per_gpu": 6400.0, "mfu": 0.4},
    "notes": "",
}
INFER = {
    "id": "tiny-infer", "source": "made up for tests", "trust": "low", "workload": "infer",
    "model": {"name": "tiny llama", "hf_config": TINY_LLAMA},
    "hardware": "nvidia_h100_sxm", "num_gpus": 2, "parallel": {"tp": 2},
    "input_len": 32, "output_len": 8, "concurrency": 4, "max_batch": None,
    "precision": "fp8",
    "measured": {"output_tokens_per_s": 1000.0, "tpot_ms": 1.0},
    "notes": "",
}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


def _record(raw):
    return records_from_data([raw])[0]


# -- reading ---------------------------------------------------------------------------------


def test_a_file_that_is_not_a_list_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text("id: one\n")
    with pytest.raises(SpecError, match="expected a list of records"):
        load_records(path)
    path.write_text("- [1, 2]\n")
    with pytest.raises(SpecError, match="record 1 is a list"):
        load_records(path)
    path.write_text("- id: [unclosed\n")
    with pytest.raises(SpecError, match="line 2, column 1 is not valid YAML"):
        load_records(path)


BAD_FIELDS = [
    (TRAIN, "micro_batch", "x",
     "record tiny-train: micro_batch must be a positive integer or null, got 'x' — null "
     "takes the default (SCHEMA.md)"),
    (TRAIN, "micro_batch", 0,
     "record tiny-train: micro_batch must be a positive integer or null, got 0 — null "
     "takes the default (SCHEMA.md)"),
    (TRAIN, "precision", "int3",
     "record tiny-train: precision 'int3' is not one zrt models for training — use one of "
     "fp32, bf16, fp16, fp8, fp8_cs, mxfp8, nvfp4, or null"),
    (TRAIN, "recompute", "some",
     "record tiny-train: recompute 'some' is not one zrt models for training — use one of "
     "none, selective, full, op, or null"),
    (INFER, "concurrency", -1,
     "record tiny-infer: concurrency must be a positive integer or null, got -1 — null "
     "takes the default (SCHEMA.md)"),
    (INFER, "max_batch", "x",
     "record tiny-infer: max_batch must be a positive integer or null, got 'x' — null "
     "takes the default (SCHEMA.md)"),
]


@pytest.mark.parametrize(("base", "key", "value", "message"), BAD_FIELDS,
                         ids=[f"{b['workload']}-{k}-{v!r}" for b, k, v, _ in BAD_FIELDS])
def test_a_bad_field_is_one_line_saying_what_to_do(host, base, key, value, message) -> None:
    """Six fields that once reached a constructor and came back as raw exception text
    ("bad value: ValueError: invalid literal for int()...", attrs' validator repr)."""
    result = Validator(host).run([_record({**base, key: value})]).results[0]
    assert (result.status, result.message) == ("error", message)


def test_workload_of_a_per_layer_record_is_layer() -> None:
    raw = {**TRAIN, "measured": {"fwd_ms_per_layer": 1.0}, "layers_measured": 1}
    del raw["workload"]
    assert _record(raw).workload == "layer"


# -- defaults --------------------------------------------------------------------------------


def test_training_defaults_for_null_fields() -> None:
    case = training_case(_record(TRAIN))
    # dp = 4 GPUs / (tp 2 × pp 1 × cp 1) = 2; SP on with tp > 1; ZeRO-1; micro-batch 1
    assert (case.parallel.tp, case.parallel.dp, case.parallel.vp) == (2, 2, 1)
    assert case.parallel.sp is None and case.parallel.sequence_parallel(training=True)
    assert case.train.zero == 1
    assert case.train.micro_batch == 1
    assert case.train.recompute == "none"
    assert case.train.precision == "bf16"
    assert case.train.pp_schedule == "1f1b"
    assert any(a.startswith("dp=2") for a in case.assumptions)


def test_an_unpublished_cp_is_what_the_published_degrees_leave() -> None:
    # 8 GPUs with tp 2, pp 1 and dp 2 published and cp left out: cp = 8 / (2 · 1 · 2) = 2
    # (cp 1 would refuse the record: 2 · 1 · 1 · 2 = 4 GPUs, not 8)
    raw = {**TRAIN, "num_gpus": 8, "parallel": {"tp": 2, "pp": 1, "dp": 2}}
    case = training_case(_record(raw))
    assert (case.parallel.cp, case.parallel.dp) == (2, 2)
    assert "cp=2 (GPUs / (tp × pp × dp))" in case.assumptions
    # the degrees already multiply out: cp 1, as not published
    raw = {**TRAIN, "num_gpus": 4, "parallel": {"tp": 2, "pp": 1, "dp": 2}}
    case = training_case(_record(raw))
    assert case.parallel.cp == 1 and "cp=1 (not published)" in case.assumptions


def test_interleaved_schedule_when_vp_is_given() -> None:
    raw = {**TRAIN, "num_gpus": 4, "parallel": {"tp": 1, "pp": 2, "vp": 2, "dp": 2}}
    assert training_case(_record(raw)).train.pp_schedule == "interleaved"


@pytest.mark.parametrize(("source", "kernel"), [
    ("made up for tests", "flash"),
    ("MosaicML llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16", "flash1"),
    ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1", "flash2"),
    ("Narayanan et al. 2021, Table 1", "unfused"),
])
def test_the_attention_kernel_follows_the_stack_the_source_names(source, kernel) -> None:
    # llm-foundry's published tables ran flash-attn 1.0.x (v0.3.0's `gpu` extra); torchtitan's
    # SDPA order put PyTorch's FlashAttention-2 first below compute capability 10 until
    # 2025-10, after all its published tables; 2021-22 Megatron-LM had no FlashAttention
    case = training_case(_record({**TRAIN, "source": source}))
    assert case.attention == kernel
    named = [a for a in case.assumptions if a.startswith("attention as FlashAttention")]
    assert len(named) == (1 if kernel in ("flash1", "flash2") else 0)


def test_inference_defaults() -> None:
    case = inference_case(_record({**INFER, "precision": None, "concurrency": None,
                                   "num_gpus": 4}))
    # dp = 4 GPUs / tp 2 = 2; bf16 unquantised; null concurrency → max-throughput
    assert (case.parallel.tp, case.parallel.dp) == (2, 2)
    assert case.infer.quant == "none" and case.infer.kv_dtype is None
    assert case.infer.batch is None
    assert case.engine == "trtllm"
    fp8 = inference_case(_record(INFER))
    # concurrency 4: four closed-loop clients on in-flight batching, not a static batch
    assert (fp8.infer.quant, fp8.infer.kv_dtype, fp8.infer.batch,
            fp8.infer.concurrency) == ("fp8", "fp8", None, 4)
    assert any(a.startswith("concurrency 4: at most 4 requests in flight")
               for a in fp8.assumptions)
    capped = inference_case(_record({**INFER, "concurrency": None, "max_batch": 16}))
    assert (capped.infer.batch, capped.infer.concurrency) == (None, 16)


def test_trtllm_moe_record_without_ep_spreads_experts_over_the_tp_group() -> None:
    moe = {**TINY_LLAMA, "model_type": "qwen3_moe", "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 32}
    raw = {**INFER, "model": {"name": "tiny moe", "hf_config": moe}}
    # TensorRT-LLM, tp 2, ep null: 8 experts divide over the 2 ranks → ep 2, expert TP 1
    case = inference_case(_record(raw))
    assert (case.parallel.tp, case.parallel.ep, case.parallel.dp) == (2, 2, 1)
    assert case.parallel.expert_tp == 1  # moe_tp_size = tp_size // moe_ep_size
    assert any(a.startswith("ep=2, etp=1 ") for a in case.assumptions)
    # stated EP, 7 experts (no even split), vLLM or a dense model: left as given / 1
    stated = inference_case(_record({**raw, "parallel": {"tp": 2, "ep": 1}}))
    odd = inference_case(_record({**raw, "model": {"name": "odd", "hf_config": {
        **moe, "num_experts": 7}}}))
    vllm = inference_case(_record({**raw, "source": "vLLM benchmark"}))
    dense = inference_case(_record(INFER))
    assert [c.parallel.ep for c in (stated, odd, vllm, dense)] == [1, 1, 1, 1]
    sglang = inference_case(_record({**raw, "source": "SGLang bench_serving"}))
    both = inference_case(_record({**raw, "source": "vLLM against SGLang"}))
    assert [c.engine for c in (vllm, sglang, both, dense)] == [
        "vllm", "sglang", "trtllm", "trtllm"]
    assert not any(a.startswith("ep=") for c in (stated, odd, vllm, dense)
                   for a in c.assumptions)


def test_layer_case_runs_one_micro_batch_per_replica() -> None:
    raw = {**TRAIN, "micro_batch": 4, "layers_measured": 1,
           "measured": {"fwd_ms_per_layer": 1.0}}
    del raw["workload"], raw["global_batch"]
    case = layer_case(_record(raw))
    # global batch = micro-batch 4 × dp 2 = 8: one micro-batch per replica
    assert case.train.global_batch == 8
    assert case.train.num_microbatches(case.parallel) == 1
    assert case.train.zero == 0


# -- predicting --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(host: PluginHost, tmp_path_factory: pytest.TempPathFactory) -> ValidationRun:
    bad_type = {**TRAIN, "id": "unknown-type",
                "model": {"name": "x", "hf_config": {**TINY_GPT2, "model_type": "acme-1"}}}
    unknown_key = {**INFER, "id": "typo", "concurency": 4}
    missing = {**TRAIN, "id": "no-seq", "seq_len": None}
    zero_tp = {**TRAIN, "id": "tp0", "parallel": {"tp": 0}}
    # 2 layers over pp 3: no even split, 2 + embedding + loss = 4 entries do not divide 3
    pp3 = {**TRAIN, "id": "pp3", "num_gpus": 6, "parallel": {"tp": 2, "pp": 3}}
    laid_out = {**pp3, "id": "pp3-layout",
                "parallel": {"tp": 2, "pp": 3, "pipeline_model_parallel_layout": "Et|t|L"}}
    bad_layout = {**pp3, "id": "pp3-bad-layout",
                  "parallel": {"tp": 2, "pp": 3, "pipeline_model_parallel_layout": "Et|tL"}}
    path = tmp_path_factory.mktemp("validation") / "tiny.yaml"
    path.write_text(yaml.safe_dump([TRAIN, bad_type, unknown_key, missing, zero_tp, pp3,
                                    laid_out, bad_layout, INFER]))
    return Validator(host, use_cache=False).run(load_records(path), path=str(path))


@pytest.mark.needs("zrt-nvidia")
def test_every_record_gets_a_row_and_the_run_goes_on(run: ValidationRun) -> None:
    by_id = {r.id: r for r in run.results}
    assert [r.id for r in run.results] == ["tiny-train", "unknown-type", "typo", "no-seq",
                                           "tp0", "pp3", "pp3-layout", "pp3-bad-layout",
                                           "tiny-infer"]
    assert by_id["tiny-train"].ok and by_id["tiny-infer"].ok and by_id["pp3-layout"].ok
    assert not by_id["unknown-type"].ok and "unknown model_type 'acme-1'" in \
        by_id["unknown-type"].message
    assert "a zrt plugin that supplies 'acme-1'" in by_id["unknown-type"].message
    assert "refuses it without a pipeline layout" in by_id["pp3"].message
    assert "'Et|tL': 2 stages, but the schedule runs 3" in by_id["pp3-bad-layout"].message
    assert by_id["typo"].message.startswith("record typo: unknown key 'concurency'")
    assert "seq_len must be a positive integer" in by_id["no-seq"].message
    assert by_id["tp0"].message.startswith(
        "record tp0: parallel.tp must be a positive integer or null, got 0")
    for r in run.results:
        assert "\n" not in r.message


@pytest.mark.needs("zrt-nvidia")
def test_errors_are_relative_to_the_measurement(run: ValidationRun) -> None:
    train = run.results[0]
    for key, measured in TRAIN["measured"].items():
        assert train.error[key] == pytest.approx(
            (train.predicted[key] - measured) / measured, rel=1e-12)
    # tokens/s/GPU = global batch 8 × 32 tokens / (step × 4 GPUs)
    assert train.predicted["tokens_per_s_per_gpu"] == pytest.approx(
        8 * 32 / (train.predicted["step_time_s"] * 4))
    infer = run.results[-1]
    assert set(infer.error) == {"output_tokens_per_s", "tpot_ms"}
    assert infer.predicted["output_tokens_per_s_per_gpu"] == pytest.approx(
        infer.predicted["output_tokens_per_s"] / 2)


@pytest.mark.needs("zrt-nvidia")
def test_json_has_the_schema_shape(run: ValidationRun) -> None:
    data = json.loads(json.dumps(run.to_json()))
    assert set(data) >= {"records", "summary"}
    ok = data["records"][0]
    assert ok["status"] == "ok" and set(ok) >= {"id", "predicted", "measured", "error"}
    failed = data["records"][1]
    assert failed["status"] == "error" and failed["message"]
    s = data["summary"]
    assert (s["records"], s["ok"], s["errors"]) == (9, 3, 6)
    trains = [r for r in run.results if r.ok and r.workload == "train"]
    assert s["mape_step_time"] == pytest.approx(
        sum(abs(r.error["step_time_s"]) for r in trains) / len(trains))
    assert {f["id"] for f in s["failed"]} == {"unknown-type", "typo", "no-seq", "tp0", "pp3",
                                               "pp3-bad-layout"}


def test_summary_arithmetic() -> None:
    def result(rid: str, workload: str, error: dict[str, float]) -> RecordResult:
        return RecordResult(id=rid, status="ok", workload=workload, hardware="h",
                            num_gpus=1, predicted={k: 1 + v for k, v in error.items()},
                            measured={k: 1.0 for k in error}, error=error)

    run = ValidationRun(results=[
        result("a", "train", {"step_time_s": 0.10, "tokens_per_s_per_gpu": -0.5, "mfu": 2.0}),
        result("b", "train", {"step_time_s": -0.30}),
        result("c", "infer", {"output_tokens_per_s": 0.20}),
        RecordResult(id="d", status="error", workload="infer", hardware="h", num_gpus=1,
                     message="no"),
    ])
    s = run.summary()
    # step time: (|0.10| + |−0.30|) / 2 = 0.20; throughput: (|−0.5| + |0.20|) / 2 = 0.35
    assert s["mape_step_time"] == pytest.approx(0.20)
    assert s["mape_throughput"] == pytest.approx(0.35)
    # MFU is informational: in the per-quantity table, never among the worst
    assert s["mape_by_quantity"]["mfu"]["mape"] == pytest.approx(2.0)
    assert [w["id"] for w in s["worst"]] == ["b", "c", "a"]
    assert (s["records"], s["ok"], s["errors"]) == (4, 3, 1)
    assert s["failed"] == [{"id": "d", "message": "no"}]


def test_only_selects_records(host: PluginHost, tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump([{**TRAIN, "id": "a-1", "workload": "serve"},
                                    {**TRAIN, "id": "b-2", "workload": "serve"}]))
    run = validate(path, host=host, only="b-", use_cache=False)
    assert [r.id for r in run.results] == ["b-2"]
    assert run.results[0].message.startswith("record b-2: unknown workload 'serve'")
    assert math.isfinite(run.elapsed_s)


@pytest.mark.needs("zrt-nvidia")
def test_mfu_in_the_sources_definition_where_its_counter_is_known(host: PluginHost) -> None:
    from zrt_core.source_flops import nemo2_llama_flops

    raw = {**TRAIN, "id": "nemo-long", "model": {"name": "tiny llama", "hf_config": TINY_LLAMA},
           "source": "NVIDIA NeMo long-sequence performance page, LLAMA3-8B (NeMo 25.04.rc2)",
           "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 4}, "measured": {"mfu": 0.5}}
    result = Validator(host, use_cache=False).predict(_record(raw))
    step = result.predicted["step_time_s"]
    # NeMo 2's FLOPs (full s² attention) over the predicted step × 4 GPUs × 989.4 TFLOP/s
    peak = host.hardware_spec("nvidia_h100_sxm").compute.bf16_tflops * 1e12
    assert result.predicted["mfu"] == pytest.approx(
        nemo2_llama_flops(TINY_LLAMA, 32, 8) / (step * 4 * peak), rel=1e-12)
    assert any("NeMo 2 flops_formulas" in a for a in result.assumptions)


def test_a_layout_that_places_mtp_layers_trains_them() -> None:
    """Qwen3-Next's Megatron-Bridge GB200 layout ends ``tmL``: an MTP layer its config does
    not declare. The layout is what ran, so the case trains one MTP layer and says so (it
    was a layout error); the same layout without the m is not changed."""
    from zrt_core.estimate.training.records import case_from_record

    laid_out = {**TRAIN, "id": "mtp-layout", "num_gpus": 6,
                "parallel": {"tp": 2, "pp": 3, "pipeline_model_parallel_layout": "Et|t|mL"}}
    case = case_from_record(laid_out)
    assert case.mtp is not None and case.mtp.depths == 1
    assert case.config["num_nextn_predict_layers"] == 1
    assert any("1 MTP layer(s) of the last layer kind, as the pipeline layout places them"
               in a for a in case.assumptions)
    plain = case_from_record({**laid_out, "parallel": {
        **laid_out["parallel"], "pipeline_model_parallel_layout": "Et|t|L"}})
    assert plain.mtp is None and "num_nextn_predict_layers" not in plain.config
