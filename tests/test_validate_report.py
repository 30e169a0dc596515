"""``zrt validate``'s grouped summary (by source, model family, hardware), ``--explain ID``
(one record's breakdown beside what its source published) and the shipped ``public``
suite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zrt_core.cli.main import main
from zrt_core.errors import UnknownNameError
from zrt_core.plugins import get_plugin_manager
from zrt_core.validate import (
    SUITES,
    RecordResult,
    ValidationRun,
    Validator,
    load_records,
    records_from_data,
    suite_path,
)
from zrt_core.validate_report import explain, find_record, grouped, source_of

TINY_GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256,
             "vocab_size": 128, "n_positions": 128}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128, "max_position_embeddings": 256}
TRAIN = {
    "id": "made-train", "source": "made up for tests", "trust": "low", "workload": "train",
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
    "id": "made-infer", "source": "made up for tests", "trust": "low", "workload": "infer",
    "model": {"name": "tiny llama", "hf_config": TINY_LLAMA},
    "hardware": "nvidia_h100_sxm", "num_gpus": 2, "parallel": {"tp": 2},
    "input_len": 32, "output_len": 8, "concurrency": 4, "max_batch": None,
    "precision": "fp8", "measured": {"output_tokens_per_s": 1000.0}, "notes": "",
}


def _result(rid: str, workload: str, model_type: str, hardware: str,
            error: dict[str, float]) -> RecordResult:
    return RecordResult(id=rid, status="ok", workload=workload, hardware=hardware,
                        num_gpus=1, model_type=model_type,
                        predicted={k: 1 + v for k, v in error.items()},
                        measured={k: 1.0 for k in error}, error=error)


def test_summary_groups_by_source_family_and_hardware() -> None:
    run = ValidationRun(results=[
        _result("mbridge-a", "train", "qwen3_moe", "b200", {"step_time_s": -0.40,
                                                           "tokens_per_s_per_gpu": 0.67}),
        _result("mbridge-b", "train", "llama", "b200", {"step_time_s": 0.10}),
        _result("mbridge-c", "train", "llama", "h100", {"mfu": 0.5}),  # MFU only: unscored
        _result("trtllm-d", "infer", "llama", "h100", {"output_tokens_per_s": -0.06}),
        RecordResult(id="trtllm-e", status="error", workload="infer", hardware="h100",
                     num_gpus=1, model_type="llama", message="no"),
    ])
    s = run.summary()
    # mbridge training: step-time errors −0.40 and +0.10 → MAPE 0.25, bias −0.15; the
    # MFU-only record counts as predicted but not scored
    assert s["by_source"]["mbridge"] == {"train": {
        "records": 3, "ok": 3, "scored": 2, "mape": pytest.approx(0.25),
        "bias": pytest.approx(-0.15)}}
    assert s["by_source"]["trtllm"] == {"infer": {
        "records": 2, "ok": 1, "scored": 1, "mape": pytest.approx(0.06),
        "bias": pytest.approx(-0.06)}}
    assert set(s["by_family"]) == {"llama", "qwen3_moe"}
    assert s["by_family"]["llama"]["train"]["mape"] == pytest.approx(0.10)
    assert s["by_family"]["llama"]["infer"]["records"] == 2
    assert s["by_hardware"]["b200"]["train"]["bias"] == pytest.approx(-0.15)
    assert s["by_hardware"]["h100"]["train"] == {"records": 1, "ok": 1, "scored": 0,
                                                 "mape": None, "bias": None}
    # family x hardware: qwen3_moe on b200 alone (-0.40) and llama on b200 (+0.10)
    assert set(s["by_family_hardware"]) == {"qwen3_moe on b200", "llama on b200",
                                            "llama on h100"}
    assert s["by_family_hardware"]["qwen3_moe on b200"]["train"]["bias"] == pytest.approx(
        -0.40)
    assert s["by_family_hardware"]["llama on b200"]["train"]["bias"] == pytest.approx(0.10)
    assert grouped([], source_of) == {}


def test_find_record_names_the_closest_ids() -> None:
    records = records_from_data([TRAIN, INFER])
    assert find_record(records, "made-infer", "f.yaml").id == "made-infer"
    with pytest.raises(UnknownNameError) as info:
        find_record(records, "made-infr", "f.yaml")
    assert str(info.value).startswith("no record 'made-infr' in f.yaml — closest: made-infer")


@pytest.mark.needs("zrt-nvidia")
def test_explain_a_training_record() -> None:
    validator = Validator(get_plugin_manager(), use_cache=False)
    d = explain(validator, records_from_data([TRAIN])[0])
    assert d["published"] == TRAIN["measured"]
    p, step = d["predicted"], d["step"]
    assert d["error"]["step_time_s"] == pytest.approx((p["step_time_s"] - 0.01) / 0.01)
    assert set(d["error"]) == {"step_time_s", "tokens_per_s_per_gpu", "mfu"}
    # the identities the breakdown shows
    assert step["step_time_s"] == pytest.approx(
        step["pipeline_s"] + step["optimizer_s"] + step["optimizer_comm_exposed_s"])
    assert step["pipeline_s"] == pytest.approx(
        step["compute_s"] + step["pipeline_exposed_comm_s"] + step["bubble_s"])
    assert sum(d["compute_by_category_s"].values()) == pytest.approx(step["compute_s"])
    assert step["pipeline_exposed_comm_s"] == pytest.approx(
        sum(d["exposed_comm_s"]["pipeline"].values()))
    assert d["memory"]["peak_gib"] == pytest.approx(p["memory_gib_per_device"])
    # dp = 4 GPUs / tp 2; the record left micro_batch and precision null
    assert d["layout"]["dp"] == 2 and d["layout"]["tp"] == 2
    assert any(a.startswith("micro_batch=1") for a in d["assumptions"])
    json.dumps(d)


@pytest.mark.needs("zrt-nvidia")
def test_explain_on_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump([TRAIN, INFER]))
    out_json = tmp_path / "e.json"
    assert main(["validate", str(path), "--explain", "made-infer", "--no-cache",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("made-infer: ")  # styled, no markup printed literally
    assert "[bold]" not in out
    assert "published and predicted" in out and "decode by op category" in out
    assert "assumptions (fields the source left out): KV cache fp8" in out
    data = json.loads(out_json.read_text())
    assert data["predicted"]["batch"] == 4
    assert data["error"]["output_tokens_per_s"] == pytest.approx(
        (data["predicted"]["output_tokens_per_s"] - 1000.0) / 1000.0)
    assert main(["validate", str(path), "--explain", "made-trian"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("zrt: error: no record 'made-trian'") and "made-train" in err


def test_the_public_suite_is_shipped_in_the_package() -> None:
    path = suite_path("public")
    assert path.is_file() and path.parent.name == "validation"
    assert set(SUITES) == {"public"}
    records = load_records(path)
    assert len(records) == len({r.id for r in records}) > 0
    with pytest.raises(UnknownNameError, match="unknown validation suite 'private'"):
        suite_path("private")


def test_validate_without_a_file_runs_the_public_suite(
        capsys: pytest.CaptureFixture[str]) -> None:
    # --only selects no record: the shipped file is read, nothing is predicted
    assert main(["validate", "--only", "no-such-record", "-q"]) == 0
    out = capsys.readouterr().out
    # the title names the shipped file's path, which a narrow console may wrap anywhere
    assert "public.yaml" in "".join(out.split()) and "records 0, predicted 0, failed 0" in out
    assert "by source (the id's first token)" in out and "by hardware" in out
    assert main(["validate", "--suite", "public", "--only", "no-such-record", "-q"]) == 0
    assert "public.yaml" in "".join(capsys.readouterr().out.split())
    assert main(["validate", "x.yaml", "--suite", "public", "-q"]) == 2
    assert "both a file (x.yaml) and --suite public were given" in capsys.readouterr().err
