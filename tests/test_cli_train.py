"""``zrt run MODEL --hw ID --train``: the JSON fields, the files of --out, and bad layouts as
one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_gpt2")
    (d / "config.json").write_text(json.dumps(TINY))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # one capture for the module, kept on disk between the runs
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


def _run(model_dir: Path, *flags: str) -> list[str]:
    return ["run", str(model_dir), "--hw", "h100", "--train", "--micro-batch", "2",
            "--seq-len", "64", *flags]


@pytest.mark.needs("zrt-nvidia")
def test_json_carries_the_identities_throughput_utilisation_and_memory(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_run(model_dir, "--pp", "2", "--dp", "2", "--global-batch", "16",
                     "--recompute", "selective", "--zero", "1", "--optimizer", "adamw",
                     "--precision", "bf16", "--pp-schedule", "1f1b", "--json"))
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_s"] == pytest.approx(
        data["pipeline_s"] + data["optimizer_s"] + data["optimizer_comm_exposed_s"])
    assert data["pipeline_s"] == pytest.approx(
        data["compute_s"] + sum(data["pipeline_exposed_comm_s"].values()) + data["bubble_s"])
    assert data["compute_s"] == pytest.approx(
        data["forward_s"] + data["backward_s"] + data["recompute_s"])
    # where the compute goes: by op category and by layer kind (GPT-2's blocks are one kind,
    # "dense"; "outside_layers" holds the embedding, the final norm, the head and the loss)
    by_category, by_kind = data["compute_by_category_s"], data["compute_by_layer_kind_s"]
    assert sum(by_category.values()) == pytest.approx(data["compute_s"])
    assert sum(by_kind.values()) == pytest.approx(data["compute_s"])
    assert {"matmul", "attention", "norm"} <= set(by_category)
    # the loss runs on the last stage: it is in the critical rank's compute when that rank is
    # the last one (the host launch time can make either rank of this tiny model critical)
    assert ("loss" in by_category) == (data["critical_rank"] == 1)
    assert set(by_kind) == {"dense", "outside_layers"}
    assert data["tokens_per_s_per_gpu"] == pytest.approx(
        16 * 64 / (data["step_time_s"] * 4))
    assert 0 < data["mfu"] <= data["hfu"]
    memory = data["memory"]
    for key in ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib",
                "peak_gib", "capacity_gib", "feasible", "inflight_microbatches"):
        assert key in memory
    assert (data["parallel"]["pp"], data["microbatches"], data["schedule"]) == (2, 4, "1f1b")


@pytest.mark.needs("zrt-nvidia")
def test_out_writes_html_json_and_a_pipeline_trace(model_dir: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(_run(model_dir, "--pp", "2", "--vp", "2", "--global-batch", "8",
                     "--out", str(out))) == 0
    text = capsys.readouterr().out
    assert "training step" in text and "interleaved" in text
    html = (out / "report.html").read_text()
    assert "Pipeline schedule" in html and "Memory per device" in html and "<svg" in html
    assert "Compute by op category and layer kind" in html
    # each note once, as a highlighted line after the summary table
    assert html.count("graph transforms: ") == 1
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") ==
             "process_name"}
    assert {"pipeline rank 0", "pipeline rank 1"} <= names
    assert json.loads((out / "report.json").read_text())["schedule"] == "interleaved"


@pytest.mark.parametrize(("flags", "rule"), [
    (("--dp", "2", "--num-gpus", "8"), "tp × cp × pp × dp = 1 × 1 × 1 × 2 = 2"),
    (("--pp", "3"), "pp × vp = 3 does not divide the 4 layers"),
    (("--dp", "2", "--global-batch", "6"), "global batch 6 is not divisible"),
    (("--ep", "2", "--dp", "2"), "no routed experts"),
    (("--pp", "3", "--global-batch", "6"), "--decoder-first/last-pipeline-num-layers"),
    (("--pp", "3", "--global-batch", "6", "--pipeline-model-parallel-layout", "Ett|tt|L",
      "--decoder-first-pipeline-num-layers", "2"), "cannot be combined"),
    (("--pp", "3", "--global-batch", "6", "--pipeline-model-parallel-layout", "Ett|ttL"),
     "2 stages, but the schedule runs 3"),
])
@pytest.mark.needs("zrt-nvidia")
def test_bad_layouts_are_one_line_with_exit_2(model_dir: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              flags: tuple[str, ...], rule: str) -> None:
    assert main(_run(model_dir, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and rule in err and err.count("\n") == 1


@pytest.mark.needs("zrt-nvidia")
def test_an_attention_kernel_the_device_has_no_rate_for_is_one_line_with_exit_2(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _run(model_dir, "--attention", "flash1")
    args[args.index("h100")] = "b200"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: nvidia_b200 has no published rate for attention "
                          "kernel flash1") and err.count("\n") == 1


def test_bad_flag_values_are_usage_errors(model_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(_run(model_dir, "--recompute", "half"))
    assert exc.value.code == 2
    assert "--recompute" in capsys.readouterr().err


@pytest.mark.needs("zrt-nvidia")
def test_uneven_pipeline_flags(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 4 layers over pp 3: first 2, the other two ranks one each (Megatron-Core's rule)
    assert main(_run(model_dir, "--pp", "3", "--global-batch", "6",
                     "--decoder-first-pipeline-num-layers", "2", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["layers"] for s in data["stages"]] == [[0, 2], [2, 3], [3, 4]]
    assert main(_run(model_dir, "--pp", "3", "--global-batch", "6",
                     "--pipeline-model-parallel-layout", "Et|ttt|L", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["layers"] for s in data["stages"]] == [[0, 1], [1, 4], [4, 4]]


LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 128, "max_position_embeddings": 256}


@pytest.mark.needs("zrt-nvidia")
def test_graph_mode_training_prices_the_compiled_graphs_and_compares_inductor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    args = ["run", str(tmp_path), "--hw", "h100", "--train", "--micro-batch", "1",
            "--seq-len", "32", "--json"]
    assert main(args) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main([*args, "--graph-mode", "--compare-compile"]) == 0
    graph = json.loads(capsys.readouterr().out)
    # the compiled forward and backward graphs do the same model arithmetic as eager
    # capture (docs/graph-mode.md: within 1% on llama)
    assert graph["hardware_flops"] == pytest.approx(eager["hardware_flops"], rel=0.01)
    assert graph["step_time_s"] == pytest.approx(eager["step_time_s"], rel=0.05)
    gains = {g["phase"]: g for g in graph["compare_compile"]}
    assert sorted(gains) == ["train_backward", "train_forward"]
    for g in gains.values():
        # Inductor fuses pointwise chains: fewer kernels and fewer bytes, never slower
        assert g["kernels_inductor"] < g["kernels_eager"]
        assert g["bytes_inductor"] < g["bytes_eager"]
        assert g["inductor_s"] <= g["eager_s"]
