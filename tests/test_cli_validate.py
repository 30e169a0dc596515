"""``zrt validate``: a table and a summary on stdout, the JSON file, one-line errors (exit 2)
for an unusable file, exit 0 when records fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zrt_core.cli.main import main

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 128, "max_position_embeddings": 256}
RECORDS = [
    {"id": "tiny-infer", "source": "tests", "trust": "low", "workload": "infer",
     "model": {"name": "tiny llama", "hf_config": TINY_LLAMA}, "hardware": "nvidia_h100_sxm",
     "num_gpus": 1, "parallel": {"tp": 1}, "input_len": 16, "output_len": 4,
     "concurrency": 2, "max_batch": None, "precision": "bf16",
     "measured": {"output_tokens_per_s": 1000.0}, "notes": ""},
    {"id": "bad-hardware", "source": "tests", "trust": "low", "workload": "infer",
     "model": {"name": "tiny llama", "hf_config": TINY_LLAMA}, "hardware": "abacus",
     "num_gpus": 1, "parallel": {"tp": 1}, "input_len": 16, "output_len": 4,
     "concurrency": 2, "max_batch": None, "precision": "bf16",
     "measured": {"output_tokens_per_s": 1000.0}, "notes": ""},
]


@pytest.mark.needs("zrt-nvidia")
def test_validate_prints_table_and_summary_and_writes_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(RECORDS))
    out_json = tmp_path / "out" / "result.json"
    code = main(["validate", str(path), "--json", str(out_json), "--no-cache", "-q"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tiny-infer" in out and "out tok/s" in out
    assert "records 2, predicted 1, failed 1" in out
    assert "failed: bad-hardware:" in out and "abacus" in out
    data = json.loads(out_json.read_text())
    assert [r["status"] for r in data["records"]] == ["ok", "error"]
    assert data["summary"]["ok"] == 1
    ok = data["records"][0]
    assert ok["error"]["output_tokens_per_s"] == pytest.approx(
        (ok["predicted"]["output_tokens_per_s"] - 1000.0) / 1000.0)


def test_unusable_file_is_one_line_exit_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "v.yaml"
    path.write_text("just: a mapping\n")
    assert main(["validate", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a list of records" in err
    assert main(["validate", str(tmp_path / "missing.yaml"), "-q"]) == 2
    assert "cannot read the validation file" in capsys.readouterr().err


@pytest.mark.needs("zrt-nvidia")
def test_max_throughput_record_that_does_not_fit_fails_instead_of_predicting_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 4 layers of gate, up and down at 16384 x 131072 (6.44e9 parameters a layer, 12.9 GB
    # in bf16): 51.5 GB of MLP weights plus attention, on one H100 of 80 GB is fine; at
    # 8 layers, 103 GB, no sequence fits, so offline max-throughput has no batch. The
    # record fails with why; a 0 tok/s prediction would score as -100%.
    big = {**TINY_LLAMA, "hidden_size": 16384, "intermediate_size": 131072,
           "num_hidden_layers": 8, "num_attention_heads": 128, "num_key_value_heads": 8}
    record = {**RECORDS[0], "id": "too-big", "concurrency": None,
              "model": {"name": "big", "hf_config": big}}
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump([record]))
    out_json = tmp_path / "r.json"
    assert main(["validate", str(path), "--json", str(out_json), "-q"]) == 0
    data = json.loads(out_json.read_text())
    (rec,) = data["records"]
    assert rec["status"] == "error"
    assert "no sequence fits beside the weights" in rec["message"]
    assert "GiB of one device" in rec["message"] and "\n" not in rec["message"]
