"""``zrt search --objective goodput|time-to-train``: each row's run from the whole-run model,
the ranking by useful tokens/s per GPU or by wall time, and the objective's bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main
from zrt_core.errors import SpecError
from zrt_core.goodput import GoodputSpec
from zrt_core.hardware import HardwareSpec
from zrt_core.search.objective import add_goodput, check_objective, rank_key

HW = HardwareSpec.from_mapping({
    "id": "acme_x1", "name": "Acme X1", "vendor": "acme",
    "compute": {"fp32": 10, "bf16": 100, "fp16": 100},
    "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
    "interconnect": [{"name": "net", "bandwidth_gb_per_s": 25, "latency_us": 5,
                      "devices": None}],
    "checkpoint_write_gb_per_s": 1.0})


def _rows() -> list[dict]:
    # two layouts of one model: 1,000 GPUs at 10 s a step, and 2,000 GPUs at 5.5 s (less
    # per GPU, but sooner); 4M tokens a step, a 1 TB checkpoint spread over the GPUs
    return [
        {"gpus": 1000, "step_time_s": 10.0, "tokens_per_s_per_gpu": 4e6 / (10.0 * 1000),
         "checkpoint_bytes": 1e12, "checkpoint_bytes_per_device": 1e9},
        {"gpus": 2000, "step_time_s": 5.5, "tokens_per_s_per_gpu": 4e6 / (5.5 * 2000),
         "checkpoint_bytes": 1e12, "checkpoint_bytes_per_device": 5e8},
    ]


def test_rows_get_their_run_and_rank_by_the_objective() -> None:
    rows = _rows()
    run = GoodputSpec(steps=100_000, mtbf_gpu_hours=100_000, restart_s=600)
    add_goodput(rows, HW, run, global_batch=1000, seq_len=4000)
    # the first row is tests/test_goodput.py's 1,000-GPU run: goodput 0.99598208,
    # wall 1,004,034.1 s = 11.6208 days
    assert rows[0]["goodput"] == pytest.approx(0.99598208, abs=1e-8)
    assert rows[0]["wall_days"] == pytest.approx(1_004_034.124 / 86400, abs=1e-6)
    assert rows[0]["goodput_tokens_per_s_per_gpu"] == pytest.approx(400 * 0.99598208)
    # 2,000 GPUs fail twice as often (every 50 h) and write 0.5 s checkpoints: the useful
    # 550,000 s take about 1.0043 times as long
    assert rows[1]["goodput"] < rows[0]["goodput"]
    assert rows[1]["wall_days"] < rows[0]["wall_days"]
    order = {o: sorted(range(2), key=rank_key(o, rows))
             for o in ("throughput", "goodput", "time-to-train")}
    # tokens/s per GPU: 400 against 363.6, and still so after goodput; but 2,000 GPUs finish
    # first
    assert order == {"throughput": [0, 1], "goodput": [0, 1], "time-to-train": [1, 0]}


def test_a_layout_whose_run_never_finishes_ranks_last_with_its_reason() -> None:
    rows = _rows()
    # 0.002 GPU-hours per GPU: 1,000 GPUs fail every 0.0072 s, 2,000 every 0.0036 s — no
    # 10 s step survives; both rows get goodput 0 and the reason, and rank after any other
    add_goodput(rows, HW, GoodputSpec(steps=10, mtbf_gpu_hours=0.002), 1000, 4000)
    assert [r["goodput"] for r in rows] == [0.0, 0.0]
    assert all("never finish" in r["run_error"] for r in rows)
    rows.append({"wall_days": 3.0, "goodput_tokens_per_s_per_gpu": 1.0})
    assert sorted(range(3), key=rank_key("time-to-train", rows)) == [2, 0, 1]
    assert sorted(range(3), key=rank_key("goodput", rows)) == [2, 0, 1]


@pytest.mark.parametrize(("objective", "run", "train", "message"), [
    ("speed", GoodputSpec(steps=1), True, "unknown objective"),
    ("goodput", None, True, "--tokens"),
    ("time-to-train", GoodputSpec(steps=1), False, "--train"),
    ("throughput", GoodputSpec(steps=1), False, "--train"),
])
def test_an_objective_without_its_run_is_refused(objective, run, train, message) -> None:
    with pytest.raises(SpecError, match=message):
        check_objective(objective, run, train, HW)


def test_a_run_on_a_pack_without_checkpoint_bandwidth_is_refused_before_the_search() -> None:
    from attrs import evolve

    with pytest.raises(SpecError, match="--checkpoint-gbps"):
        check_objective("goodput", GoodputSpec(steps=1), True,
                        evolve(HW, checkpoint_write_gb_per_s=None))


TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
#: 4 layouts on 4 GPUs and 2 on 2: (tp, pp) ∈ {1,2}² with dp filling the GPUs
TRAIN = ["--train", "--gpus", "2,4", "--tp", "1,2", "--pp", "1,2", "--cp", "1", "--vp", "1",
         "--micro-batch", "1", "--recompute", "none", "--sharding", "zero1",
         "--pp-schedule", "1f1b", "--global-batch", "8", "--seq-len", "64"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


@pytest.mark.needs("zrt-nvidia")
def test_search_ranks_by_time_to_train(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    assert main(["search", str(tmp_path), "--hw", "h100", *TRAIN, "--tokens", "10M",
                 "--objective", "time-to-train", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    days = [r["wall_days"] for r in data["results"]]
    assert days == sorted(days) and len(days) >= 2
    # 10M tokens / (8 × 64 = 512 a step) = 19,532 steps; the winner's report has its run
    assert data["winner_report"]["goodput"]["steps"] == 19_532
