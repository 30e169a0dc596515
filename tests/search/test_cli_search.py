"""``zrt search`` and ``zrt compare`` end to end on a tiny model: the JSON shape, counts,
ranking and fronts consistent with the rows, files of --out, the Python API, local
processes giving the serial result, and bad input as one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
#: 8 layouts: (tp, pp) ∈ {1,2}² on 4 GPUs (dp 4, 2, 2, 1) × recompute none/full
TRAIN = ["--train", "--gpus", "4", "--tp", "1,2", "--pp", "1,2", "--cp", "1", "--vp", "1",
         "--micro-batch", "1", "--recompute", "none,full", "--sharding", "zero1",
         "--pp-schedule", "1f1b", "--global-batch", "8", "--seq-len", "64"]
SERVE = ["--infer", "--gpus", "2", "--input-len", "32", "--output-len", "8",
         "--quant", "none", "--batch", "1,4"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_gpt2")
    (d / "config.json").write_text(json.dumps(TINY))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.needs("zrt-nvidia")
def test_training_search_json(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--top-k", "3",
              "--json")
    # 2 tp × 2 pp × 2 recompute = 8 enumerated, every one valid on 4 GPUs (tp·pp | 4;
    # 8 sequences over dp ≤ 4 leave ≥ 2 micro-batches ≥ pp) and tiny enough to fit
    assert d["enumerated"] == 8 and d["evaluated"] == 8 and d["rejected"] == {}
    assert len(d["results"]) == 3
    speeds = [r["tokens_per_s_per_gpu"] for r in d["results"]]
    assert speeds == sorted(speeds, reverse=True)
    assert d["winner"] == d["results"][0]
    # the winner's full report is zrt run --train's JSON for that layout
    report = d["winner_report"]
    assert report["step_time_s"] == pytest.approx(d["winner"]["step_time_s"])
    assert report["parallel"]["tp"] == d["winner"]["tp"]
    # full recompute only adds work: for each layout, none is faster than full
    by = {(r["tp"], r["pp"], r["recompute"]): r["step_time_s"]
          for r in d["results"] + d["pareto"]}
    for (tp, pp, rec), t in by.items():
        if rec == "full" and (tp, pp, "none") in by:
            assert by[(tp, pp, "none")] < t
    # no point of the front is beaten on both speed and memory by another front point
    front = d["pareto"]
    for p in front:
        assert not any(q["tokens_per_s_per_gpu"] > p["tokens_per_s_per_gpu"]
                       and q["memory_gib"] < p["memory_gib"] for q in front)
    assert d["winner"] in front  # the fastest layout is always on the front


@pytest.mark.needs("zrt-nvidia")
def test_gpu_range_gives_a_front_of_step_time_against_gpus(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", TRAIN[0], "--gpus", "1-4",
              *TRAIN[3:], "--json")
    # --gpus 1-4 doubles: 1, 2, 4 GPUs
    assert sorted({r["gpus"] for r in d["gpus_front"]}) <= [1, 2, 4]
    steps = [r["step_time_s"] for r in sorted(d["gpus_front"], key=lambda r: r["gpus"])]
    assert steps == sorted(steps, reverse=True)  # more GPUs on the front: a shorter step
    # (tp, pp) pairs whose tp·pp does not divide the GPUs, × 2 recompute each: on 1 GPU
    # all but (1,1) (3 pairs, 6), on 2 GPUs (2,2) (2), on 4 none: 8
    assert d["rejected"]["gpus"] == 8


@pytest.mark.needs("zrt-nvidia")
def test_workers_give_the_serial_result(model_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    serial = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--json")
    parallel = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--workers",
                     "2", "--json")
    for key in ("enumerated", "evaluated", "rejected", "results", "pareto", "winner"):
        assert serial[key] == parallel[key], key


@pytest.mark.needs("zrt-nvidia")
def test_serving_search_targets_and_rate(model_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", *SERVE, "--json")
    # tp ∈ {1,2} × dp ∈ {1,2} × 2 batches = 8; tp·dp = 2 keeps (1,2) and (2,1): 4 removed
    assert d["enumerated"] == 8 and d["rejected"] == {"gpus": 4} and d["evaluated"] == 4
    rows = d["results"]
    assert all(r["meets_targets"] for r in rows)
    tpot = min(r["tpot_ms"] for r in rows)
    # a TPOT target between the best and the worst keeps only layouts within it
    limit = (tpot + max(r["tpot_ms"] for r in rows)) / 2
    t = _json(capsys, "search", str(model_dir), "--hw", "h100", *SERVE, "--tpot-ms",
              str(limit), "--rate", "1000", "--json")
    assert all(r["tpot_ms"] <= limit for r in t["results"])
    assert t["rejected"]["latency_targets"] == 4 - len(t["results"])
    rate = t["rate"]
    # replicas of one layout sustaining 1000 requests/s: ceil(1000 / its rate) of them
    import math

    assert rate["replicas"] == math.ceil(1000 / rate["layout"]["requests_per_s"])
    assert rate["gpus"] == rate["replicas"] * rate["layout"]["gpus"]


@pytest.mark.needs("zrt-nvidia")
def test_out_writes_csv_xlsx_and_html(model_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--out",
              str(tmp_path), "--json")
    assert sorted(Path(f).name for f in d["files"]) == ["results.csv", "results.xlsx",
                                                        "search.html"]
    lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(lines) == 1 + 8  # a header and every evaluated layout
    from openpyxl import load_workbook

    wb = load_workbook(tmp_path / "results.xlsx")
    assert wb.sheetnames == ["results", "best_per_hardware"]
    assert wb["results"].max_row == 9 and wb["best_per_hardware"].max_row == 2
    assert wb["results"]["A1"].font.bold
    html = (tmp_path / "search.html").read_text()
    assert "<svg" in html and "Pareto front" in html and "http" not in html.split("<svg")[0]


@pytest.mark.needs("zrt-nvidia")
def test_python_api_returns_what_json_prints(model_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    import zrt_core
    from zrt_core.search import TrainSpace

    space = TrainSpace(gpus=(4,), global_batch=8, seq_len=64, tp=(1, 2), pp=(1, 2), cp=(1,),
                       vp=(1,), micro_batch=(1,), recompute=("none", "full"),
                       sharding=("zero1",), pp_schedule=("1f1b",))
    result = zrt_core.search(str(model_dir), "h100", space)
    data = result.to_json()
    json.dumps(data)  # plain JSON: a service can store it
    cli = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--json")
    assert data["results"] == cli["results"] and data["rejected"] == cli["rejected"]
    # the winner as zrt run's values, for --emit
    spec = result.winner_spec
    assert spec["parallel"].tp == data["winner"]["tp"]
    assert spec["train"].global_batch == 8


@pytest.mark.needs("zrt-nvidia")
def test_compare_normalises_to_the_first(model_dir: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "compare", str(model_dir), "--hw", "h100,h200", *TRAIN, "--price",
              "h100=2,h200=3", "--out", str(tmp_path), "--json")
    rows = d["results"]
    assert [r["hardware"] for r in rows] == ["nvidia_h100_sxm", "nvidia_h200"]
    assert rows[0]["normalised_throughput"] == 1.0
    assert rows[1]["normalised_throughput"] == pytest.approx(
        rows[1]["tokens_per_s_per_gpu"] / rows[0]["tokens_per_s_per_gpu"])
    # 700 W (the H100 pack's board power) per GPU over tokens/s per GPU
    assert rows[0]["joules_per_token"] == pytest.approx(700 / rows[0]["tokens_per_s_per_gpu"])
    # $2 per GPU-hour: 2 / 3600 $ per GPU-second over tokens/s per GPU, per million tokens
    assert rows[0]["usd_per_million_tokens"] == pytest.approx(
        2 / 3600 / rows[0]["tokens_per_s_per_gpu"] * 1e6)
    assert rows[0]["usd_per_step"] == pytest.approx(rows[0]["step_time_s"] * 4 * 2 / 3600)
    from openpyxl import load_workbook

    best = load_workbook(tmp_path / "results.xlsx")["best_per_hardware"]
    assert best.max_row == 3  # a header and one row per hardware


@pytest.mark.needs("zrt-nvidia")
def test_compare_groups_from_yaml(model_dir: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    groups = tmp_path / "groups.yaml"
    groups.write_text("comparison_hw_groups:\n  hopper: [h100, h200]\n  hopper2: [h200]\n")
    d = _json(capsys, "compare", str(model_dir), "--groups", str(groups), *TRAIN, "--json")
    assert [(r["group"], r["normalised_throughput"] == 1.0) for r in d["results"]] == [
        ("hopper", True), ("hopper", False), ("hopper2", True)]


@pytest.mark.needs("zrt-nvidia")
def test_no_valid_layout_names_the_rule(model_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # 3 GPUs: no power-of-two tp·cp·pp divides 3 except 1·1·1, and dp 3 does not divide 8
    err = _error(capsys, "search", str(model_dir), "--hw", "h100", "--train", "--gpus", "3",
                 "--global-batch", "8", "--seq-len", "64", "--micro-batch", "1",
                 "--recompute", "none", "--sharding", "zero1", "--pp-schedule", "1f1b")
    assert "no valid layout: the rule 'gpus'" in err


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize(("argv", "needle"), [
    (["search", "MODEL", "--hw", "nosuchgpu", *TRAIN], "nosuchgpu"),
    (["compare", "MODEL", "--hw", "h100,nosuchgpu", *TRAIN], "nosuchgpu"),
    (["compare", "MODEL", "--hw", "h100", "--price", "b200=5", *TRAIN],
     "not in the comparison"),
    (["search", "MODEL", "--hw", "h100", "--train", "--gpus", "x8", "--global-batch", "8"],
     "--gpus must be N"),
    (["search", "MODEL", "--hw", "h100", "--train", "--gpus", "8"], "--global-batch"),
    (["search", "MODEL", "--hw", "h100", *TRAIN[:-4], "--tp", "16", "--max-tp", "8",
      "--global-batch", "8"], "contradicts --max-tp 8"),
    (["search", "MODEL", "--hw", "h100", *TRAIN, "--tpot-ms", "5"], "serving targets"),
    (["search", "MODEL", "--hw", "h100", *SERVE, "--pp", "2"], "not a serving dimension"),
    (["search", "MODEL", "--hw", "h100", *SERVE, "--mtp", "1"], "not a serving dimension"),
    (["search", "MODEL", "--hw", "h100", *TRAIN, "--mtp", "0"], "--mtp"),
])
def test_bad_input_is_one_line(model_dir: Path, capsys: pytest.CaptureFixture[str],
                               argv: list[str], needle: str) -> None:
    argv = [str(model_dir) if a == "MODEL" else a for a in argv]
    assert needle in _error(capsys, *argv)


@pytest.mark.needs("zrt-nvidia", "ray")
def test_ray_runs_give_the_serial_result(model_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # a local Ray instance of one CPU on the loopback address (nothing reachable from
    # outside); --ray then runs on the instance already started, as on a cluster
    import ray

    serial = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--json")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        on_ray = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--ray",
                       "auto", "--json")
    finally:
        ray.shutdown()
    for key in ("enumerated", "evaluated", "rejected", "results", "pareto", "winner"):
        assert serial[key] == on_ray[key], key


@pytest.mark.needs("zrt-nvidia")
def test_tables_for_people(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", str(model_dir), "--hw", "h100", *TRAIN, "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    # 8 layouts, none removed; the top 2, the front, the winner's zrt run --train report
    assert "8 layouts enumerated, 8 estimated" in out
    assert "removed: none" in out and "top 2 by tokens/s per GPU" in out
    assert "Pareto front" in out and "the winner's report:" in out and "training step" in out
    assert main(["search", str(model_dir), "--hw", "h100", *SERVE, "--rate", "5"]) == 0
    out = capsys.readouterr().out
    assert "5 requests/s:" in out and "disaggregated:" in out


@pytest.mark.needs("zrt-nvidia")
def test_targets_no_layout_meets_is_one_line(model_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # a TPOT of a picosecond: the 4 valid layouts all fit and all miss it (4 more removed by
    # the gpus rule: a tie goes to the later hurdle, the targets)
    err = _error(capsys, "search", str(model_dir), "--hw", "h100", *SERVE, "--tpot-ms",
                 "1e-9")
    assert "the rule 'latency_targets'" in err and "removed 4 of 8" in err
    assert "relax --ttft-ms/--tpot-ms" in err


@pytest.mark.needs("zrt-nvidia")
def test_strategy_families(model_dir: Path, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", "--train", "--gpus", "8",
              "--global-batch", "16", "--seq-len", "64", "--strategies", "--out",
              str(tmp_path), "--json")
    rows = {r["strategy"]: r for r in d["strategies"]}
    assert list(rows) == ["DDP", "FSDP", "TP", "SP", "PP", "EP", "3D"]
    assert "error" in rows["EP"]
    # FSDP shards what DDP replicates: less memory per device
    assert rows["FSDP"]["memory_gib"] < rows["DDP"]["memory_gib"]
    assert "Step time" in (tmp_path / "search.html").read_text()


@pytest.mark.needs("zrt-nvidia")
def test_emit_writes_the_winner_as_megatron_arguments(model_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--json")
    assert main(["search", str(model_dir), "--hw", "h100", *TRAIN, "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    win = d["winner"]
    # the header names the prediction; the arguments carry the winner's layout and batch
    assert "# Megatron-LM arguments written by zrt" in out
    assert f"--tensor-model-parallel-size {win['tp']}" in out
    assert f"--pipeline-model-parallel-size {win['pp']}" in out
    assert "--global-batch-size 8" in out and "--seq-length 64" in out


@pytest.mark.needs("zrt-nvidia")
def test_emit_to_an_unknown_framework_is_one_line(model_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "search", str(model_dir), "--hw", "h100", *TRAIN, "--emit", "nemo1")
    assert "nemo1" in err


TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128,
            "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4,
            "num_experts_per_tok": 2, "vocab_size": 128}


@pytest.mark.needs("zrt-nvidia")
def test_an_moe_serving_winner_with_attention_dp_says_its_gain_is_an_upper_bound(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zrt_core.search.run import ATTENTION_DP_MOE_NOTE

    (tmp_path / "config.json").write_text(json.dumps(TINY_MOE))
    serve = [a for a in SERVE if a != "--batch" and a != "1,4"]
    # only attention dp 2 on 2 GPUs: the winner is attention-DP, so the note comes with it
    d = _json(capsys, "search", str(tmp_path), "--hw", "h100", *serve, "--tp", "1",
              "--dp", "2", "--json")
    assert d["winner"]["dp"] == 2 and d["notes"] == [ATTENTION_DP_MOE_NOTE]
    # tensor-parallel attention: no note; nor for a dense model with attention dp
    d = _json(capsys, "search", str(tmp_path), "--hw", "h100", *serve, "--tp", "2",
              "--dp", "1", "--json")
    assert "notes" not in d
    d = _json(capsys, "search", str(model_dir), "--hw", "h100", *serve, "--tp", "1",
              "--dp", "2", "--json")
    assert "notes" not in d
