"""The device tool chain on this machine's CPU with a tiny llama (hidden 64, 2 layers):
zrt calibrate → zrt measure → zrt diff, zrt profile → --tables, and bad input as one line
with exit 2. Bounds on timings are loose (the figures live in benchmarks/bench_profile.py):
the checks are on structure, exact bookkeeping and errors."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

LLAMA = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, vocab_size=128)
#: a small, fast calibration grid (two sizes: the fit needs k to vary)
CAL = ["--sizes", "32,64", "--repeats", "2", "--min-time-ms", "1", "--mem-mb", "1",
       "--dtypes", "fp32"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("chain")
    (d / "config.json").write_text(json.dumps(LLAMA))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["calibrate", "--device", "cpu", "-o", str(d / "cpu.yaml"), *CAL,
                     "--json"]) == 0
    (d / "cal.json").write_text(out.getvalue())
    return {"dir": d, "config": d / "config.json", "hw": d / "cpu.yaml",
            "saved": d / "cal.json"}


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_saved_calibration_writes_the_same_pack_without_the_device(chain, capsys, tmp_path):
    again = tmp_path / "again.yaml"
    assert main(["calibrate", "--from", str(chain["saved"]), "-o", str(again)]) == 0
    # the same measurements re-fitted by the same code: the same pack, line for line, below
    # the comment that says how it was written
    first = chain["hw"].read_text().splitlines()
    second = again.read_text().splitlines()
    assert first[0] == "# written by zrt calibrate --device cpu"
    assert second[0] == f"# written by zrt calibrate --from {chain['saved']}"
    assert first[1:] == second[1:]
    assert "not a saved calibration: KeyError 'device'" in _error(
        capsys, ["calibrate", "--from", str(chain["config"]), "-o", str(again)])
    assert "No such file" in _error(
        capsys, ["calibrate", "--from", str(tmp_path / "none.json"), "-o", str(again)])


def test_calibrated_pack_is_accepted_by_hw(chain, capsys):
    from zrt_core.hardware import HardwareSpec

    spec = HardwareSpec.from_yaml(chain["hw"])
    assert spec.vendor == "measured" and spec.compute.fp32_tflops > 0
    assert 0 < spec.efficiency.attention <= 1 and spec.efficiency.launch_overhead_us > 0
    # fp32 rows one and two elements longer than aligned are 4 and 8 bytes: one class timed
    assert 0 < spec.efficiency.matmul_unaligned_8b <= 1
    assert spec.efficiency.matmul_unaligned_2b == 1.0
    # the host probe's four passes, each timed on this CPU: training forward, backward,
    # no-grad prefill and a decode step over a KV cache
    eff = spec.efficiency
    assert min(eff.eager_host_us, eff.eager_host_backward_us, eff.eager_host_infer_us,
               eff.eager_host_decode_us) > 0
    data = _json(capsys, ["hw", "show", str(chain["hw"]), "--json"])
    assert data["id"] == spec.id and data["distribution"] == f"file {chain['hw']}"


def test_measure_then_diff_train(chain, capsys, tmp_path):
    m = _json(capsys, ["measure", str(chain["config"]), "--device", "cpu", "--train",
                       "--batch", "1", "--seq-len", "16", "--repeats", "2", "--json"])
    assert m["mode"] == "train" and m["num_layers"] == 2 and m["step_s"] > 0
    assert [r["index"] for r in m["layers"]] == [0, 1]
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in m["layers"])
    assert {r["name"] for r in m["modules"]} == {"self_attn", "mlp", "input_layernorm",
                                                  "post_attention_layernorm"}
    assert any(k["op"] == "aten::mm" for k in m["kernels"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(m))
    html = tmp_path / "d.html"
    d = _json(capsys, ["diff", str(path), "--hw", str(chain["hw"]), "--html", str(html),
                       "--json"])
    assert d["measured_s"] == m["step_s"]
    assert d["end_to_end_ratio"] == pytest.approx(d["predicted_s"] / d["measured_s"])
    assert 0.05 < d["end_to_end_ratio"] < 20  # loose: a shared CI CPU
    # the ops' own time is the profiler's self times summed; the ratio is over it
    assert d["measured_op_s"] == pytest.approx(sum(k["self_s"] for k in m["kernels"]))
    assert d["op_ratio"] == pytest.approx(d["predicted_op_s"] / d["measured_op_s"])
    # the calibrated CPU pack has an eager host cost: the host runs before each op
    assert d["host_model"]["serial"] is True and d["host_model"]["forward_us"] > 0
    # each node's time plus the host's per node, less the dispatch each price holds
    assert d["predicted_s"] > d["predicted_op_s"]
    assert [r["index"] for r in d["layers"]] == [0, 1]
    assert all(r["predicted_s"] > 0 and r["measured_s"] > 0 for r in d["layers"])
    assert {"matmul", "attention"} <= {r["category"] for r in d["categories"]}
    assert d["coverage"]["time"]["roofline"] == 1.0  # no tables given
    assert "measured" in html.read_text() and "predicted" in html.read_text()


def test_decode_step_diff(chain, capsys, tmp_path):
    m = _json(capsys, ["measure", str(chain["config"]), "--infer", "--decode", "--batch", "2",
                       "--seq-len", "16", "--repeats", "2", "--json"])
    assert m["mode"] == "decode" and all(r["backward_s"] == 0 for r in m["layers"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(m))
    d = _json(capsys, ["diff", str(path), "--hw", str(chain["hw"]), "--json"])
    assert 0.05 < d["end_to_end_ratio"] < 20 and len(d["layers"]) == 2


def test_profile_tables_price_the_diff_and_resume(chain, capsys, tmp_path):
    out = tmp_path / "tables"
    argv = ["profile", str(chain["config"]), "--hw", str(chain["hw"]), "--out", str(out),
            "--batch", "1", "--seq-len", "16", "--repeats", "2", "--min-time-ms", "1",
            "--no-grid", "--json"]
    first = _json(capsys, [*argv, "--limit", "3"])  # an "interrupted" run: 3 rows kept
    assert first["new_rows"] == 3
    rest = _json(capsys, argv)
    assert rest["new_rows"] == first["kernels"] - 3  # the rerun skips what is there
    table = next(out.glob("*.csv"))
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == first["kernels"]
    assert all(r["source"].startswith("zrt profile ") for r in rows)
    m = _json(capsys, ["measure", str(chain["config"]), "--train", "--batch", "1",
                       "--seq-len", "16", "--repeats", "2", "--json"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps(m))
    d = _json(capsys, ["diff", str(path), "--hw", str(chain["hw"]), "--tables", str(out),
                       "--json"])
    cov = d["coverage"]
    assert cov["time"]["measured"] > 0.5  # the model's own GEMMs and attention hit exactly
    assert sum(cov["ops"].values()) == pytest.approx(1.0)
    assert all(miss["op"] for miss in cov["misses"])


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and err.count("\n") == 1
    return err


def test_bad_input_is_one_line_exit_2(chain, capsys, tmp_path):
    import torch

    if not torch.cuda.is_available():
        assert "cuda is not present" in _error(
            capsys, ["calibrate", "--device", "cuda", "-o", str(tmp_path / "x.yaml")])
    assert "has no fp8" in _error(capsys, ["calibrate", "--device", "cpu", "--dtypes", "fp8",
                                           "-o", str(tmp_path / "x.yaml")])
    assert "not found" in _error(capsys, ["hw", "show", str(tmp_path / "none.yaml")])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "t.csv").write_text("hardware_id,op,dtype,m,n,k,time_us\nx,gemm,float32,1,1,1,2\n")
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"schema": "zrt-measure/1", "config": LLAMA, "mode": "train",
                             "batch": 1, "seq_len": 8, "dtype": "float32", "step_s": 0.01,
                             "layers": []}))
    assert "missing column 'source'" in _error(
        capsys, ["diff", str(m), "--hw", str(chain["hw"]), "--tables", str(bad)])
    (bad / "t.csv").write_text("hardware_id,op,dtype,m,n,k,time_us,source\n"
                               "x,gemm,float32,1,1,1,-2,me\n")
    assert "time_us must be a finite number > 0" in _error(
        capsys, ["diff", str(m), "--hw", str(chain["hw"]), "--tables", str(bad)])
    (tmp_path / "junk.json").write_text("{}")
    assert "not a zrt measure result" in _error(
        capsys, ["diff", str(tmp_path / "junk.json"), "--hw", str(chain["hw"])])


def test_run_with_a_pack_file_and_tables_reports_coverage(chain, capsys, tmp_path):
    out = tmp_path / "tables"
    _json(capsys, ["profile", str(chain["config"]), "--hw", str(chain["hw"]), "--out",
                   str(out), "--infer", "--dtype", "bfloat16", "--batch", "1", "--seq-len",
                   "16", "--repeats", "1", "--min-time-ms", "1", "--no-grid", "--json"])
    data = _json(capsys, ["run", str(chain["config"]), "--hw", str(chain["hw"]), "--tables",
                          str(out), "--batch", "1", "--input-len", "16", "--output-len", "4",
                          "--json"])
    for phase in ("prefill", "decode"):
        cov = data[phase]["price_coverage"]
        assert set(cov["ops"]) == {"measured", "interpolated", "roofline"}
        assert sum(cov["time"].values()) == pytest.approx(1.0)
    # the prefill's own GEMMs were profiled in bf16 at this batch and length: exact hits
    assert data["prefill"]["price_coverage"]["ops"]["measured"] > 0


def test_a_training_run_with_tables_reports_coverage(chain, capsys, tmp_path):
    out = tmp_path / "tables"
    _json(capsys, ["profile", str(chain["config"]), "--hw", str(chain["hw"]), "--out",
                   str(out), "--train", "--batch", "1", "--seq-len", "16", "--repeats", "1",
                   "--min-time-ms", "1", "--no-grid", "--json"])
    argv = ["run", str(chain["config"]), "--hw", str(chain["hw"]), "--train", "--tables",
            str(out), "--micro-batch", "1", "--seq-len", "16"]
    data = _json(capsys, [*argv, "--json"])
    cov = data["price_coverage"]
    assert set(cov["ops"]) <= {"measured", "interpolated", "roofline"}
    assert sum(cov["time"].values()) == pytest.approx(1.0)
    # the step's own fp32 GEMMs were profiled at this micro-batch and length: exact hits
    assert cov["ops"]["measured"] > 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "forward and backward (one micro-batch):" in capsys.readouterr().out


def test_calibrate_over_two_cpu_ranks_writes_the_measured_link(capsys, tmp_path):
    out = tmp_path / "two.yaml"
    data = _json(capsys, ["calibrate", "--device", "cpu", "-o", str(out), *CAL, "--ranks",
                          "2", "--json"])
    link = data["calibration"]["link"]
    assert link["ranks"] == 2 and link["backend"] == "gloo"
    assert len(link["all_reduce"]) == 4 and link["bandwidth_gb_per_s"] > 0
    tier = data["pack"]["interconnect"][0]
    assert tier["name"] == "measured_gloo_2_ranks" and tier["devices"] is None
    # the pack loads as --hw reads it
    capsys.readouterr()
    assert main(["hw", "show", str(out)]) == 0
