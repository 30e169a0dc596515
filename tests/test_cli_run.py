"""``zrt run``: JSON keys, the --out files, defaults to inference, and bad layouts as one
line with exit 2 naming the dimension. A tiny llama config (hidden 128, 4 heads, 2 KV
heads, FFN 256, 2 layers) on the H100 pack; captures go to a temporary cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


@pytest.mark.needs("zrt-nvidia")
def test_json_has_the_promised_keys(model_dir, capsys):
    code = main(["run", str(model_dir), "--hw", "h100", "--tp", "2", "--input-len", "32",
                 "--output-len", "16", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("ttft_ms", "tpot_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
                "memory_gib_per_device", "max_batch"):
        assert isinstance(data[key], int | float), key
    assert data["mode"] == "max_throughput" and data["num_gpus"] == 2
    assert data["parallel"]["tp"] == 2
    assert data["output_tokens_per_s_per_gpu"] == pytest.approx(
        data["output_tokens_per_s"] / 2)


@pytest.mark.needs("zrt-nvidia")
def test_latency_mode_and_out_dir(model_dir, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(["run", str(model_dir), "--hw", "h100", "--infer", "--batch", "4",
                 "--input-len", "32", "--output-len", "16", "--quant", "fp8",
                 "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "wrote" in text
    html = (out / "report.html").read_text()
    assert html.count("<svg") >= 4 and "<script" not in html and "<link" not in html
    report = json.loads((out / "report.json").read_text())
    assert report["batch"] == 4 and report["workload"]["quant"] == "fp8"
    assert report["workload"]["kv_dtype"] == "float8_e4m3fn"
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


@pytest.mark.needs("zrt-nvidia")
def test_bad_tp_names_the_dimension_and_exits_2(model_dir, capsys):
    code = main(["run", str(model_dir), "--hw", "h100", "--tp", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "tp=3 does not divide the 4 attention heads" in err


@pytest.mark.needs("zrt-nvidia")
def test_bad_kv_heads_and_unknown_hardware_exit_2(model_dir, capsys):
    assert main(["run", str(model_dir), "--hw", "h100", "--tp", "4", "--input-len", "32",
                 "--output-len", "8", "--json"]) == 0  # 2 KV heads replicated over 4
    capsys.readouterr()
    cfg = model_dir.parent / "odd"
    cfg.mkdir(exist_ok=True)
    (cfg / "config.json").write_text(json.dumps({**LLAMA, "num_attention_heads": 12,
                                                 "num_key_value_heads": 3,
                                                 "hidden_size": 384}))
    assert main(["run", str(cfg), "--hw", "h100", "--tp", "4"]) == 2
    assert "KV heads" in capsys.readouterr().err
    assert main(["run", str(model_dir), "--hw", "no-such-gpu"]) == 2
    assert "no-such-gpu" in capsys.readouterr().err


def test_an_unregistered_mode_is_a_clear_error(model_dir, capsys, monkeypatch):
    from zrt_core.cli import run_cmd

    monkeypatch.delitem(run_cmd.MODES, "train", raising=False)
    assert main(["run", str(model_dir), "--hw", "h100", "--train"]) == 2
    assert "--train is not available" in capsys.readouterr().err
