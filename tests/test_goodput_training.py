"""The whole run on an estimated step: the checkpoint size from the model state as the layout
shards it (tiny GPT-2, exact bytes), ``zrt run --train --steps/--tokens`` in JSON, console and
HTML, and its bad input as one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attrs import evolve

from zrt_core.cli.main import main
from zrt_core.errors import SpecError
from zrt_core.estimate.goodput import checkpoint_gb_per_s, training_goodput
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.goodput import GoodputSpec
from zrt_core.hardware import HardwareSpec
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
# 224,640 parameters (tests/test_training_estimate.py has the count, layer by layer)
PARAMS = 224_640
MB, SEQ = 2, 64


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager()


@pytest.fixture(scope="module")
def tiny(host):
    return capture_for_training(TINY, MB, SEQ, host=host, use_cache=False)


def _train(**changes) -> TrainSpec:
    return evolve(TrainSpec(micro_batch=MB, global_batch=16, seq_len=SEQ), **changes)


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_the_checkpoint_holds_weights_and_states_split_over_dp(tiny, host, zero: int) -> None:
    r = estimate_training(TINY, "h100", Parallel(dp=2), _train(zero=zero), host=host,
                          captured=tiny)
    # bf16 weights 2 B + fp32 master, m and v 12 B = 14 B per parameter, whatever the ZeRO
    # stage: 224,640 × 14 = 3,144,960 B; the fully parallel save splits it over dp = 2
    assert r.checkpoint_bytes == 14 * PARAMS == 3_144_960
    assert r.checkpoint_bytes_per_device == 14 * PARAMS / 2


@pytest.mark.needs("zrt-nvidia")
def test_tensor_parallel_shards_the_checkpoint(tiny, host) -> None:
    r = estimate_training(TINY, "h100", Parallel(tp=2, dp=2), _train(), host=host,
                          captured=tiny)
    # the 4 devices write the same 14 B per parameter in all; the busiest device writes at
    # least a quarter (the replicated norms and biases make it more)
    assert r.checkpoint_bytes >= 14 * PARAMS * 0.99
    assert 14 * PARAMS / 4 <= r.checkpoint_bytes_per_device < 14 * PARAMS / 2


@pytest.mark.needs("zrt-nvidia")
def test_the_run_uses_the_step_time_and_the_packs_bandwidth(tiny, host) -> None:
    hw = host.hardware_spec("h100")
    r = estimate_training(TINY, hw, Parallel(dp=2), _train(), host=host, captured=tiny)
    g = training_goodput(r, hw, GoodputSpec(steps=1000))
    # 1,000 steps × the step time; 16 × 64 = 1,024 tokens per step
    assert g.useful_s == pytest.approx(1000 * r.step_time_s)
    assert g.tokens == 1000 * 1024
    # the busiest device's 1,572,480 B at the pack's 6.25 GB/s
    assert g.checkpoint_write_s == pytest.approx(1_572_480 / 6.25e9)
    # a flag overrides the pack; a pack without the field needs the flag
    assert checkpoint_gb_per_s(hw, GoodputSpec(steps=1, checkpoint_gb_per_s=2.0)) == 2.0
    bare = evolve(hw, checkpoint_write_gb_per_s=None)
    with pytest.raises(SpecError, match="checkpoint write bandwidth"):
        checkpoint_gb_per_s(bare, GoodputSpec(steps=1))


def test_a_pack_declares_its_checkpoint_bandwidth() -> None:
    base = {"id": "acme_x1", "name": "Acme X1", "vendor": "acme",
            "compute": {"fp32": 10, "bf16": 100, "fp16": 100},
            "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
            "interconnect": [{"name": "net", "bandwidth_gb_per_s": 25, "latency_us": 5,
                              "devices": None}]}
    assert HardwareSpec.from_mapping(base).checkpoint_write_gb_per_s is None
    spec = HardwareSpec.from_mapping({**base, "checkpoint_write_gb_per_s": 6.25})
    assert spec.checkpoint_write_gb_per_s == 6.25
    with pytest.raises(SpecError, match="checkpoint_write_gb_per_s"):
        HardwareSpec.from_mapping({**base, "checkpoint_write_gb_per_s": -1})


# -- the CLI ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_gpt2_goodput")
    (d / "config.json").write_text(json.dumps(TINY))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


def _run(model_dir: Path, *flags: str) -> list[str]:
    return ["run", str(model_dir), "--hw", "h100", "--train", "--micro-batch", "2",
            "--seq-len", "64", "--dp", "2", "--global-batch", "16", *flags]


@pytest.mark.needs("zrt-nvidia")
def test_run_json_and_html_carry_the_run(model_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(_run(model_dir, "--tokens", "1.024M", "--mtbf-gpu-hours", "0.5",
                     "--checkpoint-every", "50", "--restart-min", "1", "--json",
                     "--out", str(tmp_path)))
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    g = data["goodput"]
    # 1,024,000 tokens / (16 × 64 = 1,024 per step) = 1,000 steps on 2 GPUs
    assert (g["steps"], g["num_gpus"], g["checkpoint_every_steps"]) == (1000, 2, 50)
    assert g["interval_source"] == "given"
    # 2 GPUs at 0.5 GPU-hours: one failure every 0.25 h = 900 s
    assert g["system_mtbf_s"] == pytest.approx(900.0)
    assert g["restart_s"] == pytest.approx(60.0 + g["checkpoint_load_s"])
    assert g["useful_s"] == pytest.approx(1000 * data["step_time_s"])
    assert g["wall_s"] == pytest.approx(g["useful_s"] + g["checkpoint_lost_s"]
                                        + g["restart_lost_s"] + g["recompute_lost_s"])
    assert 0 < g["goodput"] < 1
    assert data["checkpoint_bytes"] == 14 * PARAMS
    html = (tmp_path / "report.html").read_text()
    assert "Training run: time to train and goodput" in html
    assert json.loads((tmp_path / "report.json").read_text())["goodput"]["steps"] == 1000


@pytest.mark.needs("zrt-nvidia")
def test_run_prints_the_run_table(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_run(model_dir, "--steps", "100"), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "training run" in out and "goodput" in out and "Young–Daly" in out


@pytest.mark.parametrize(("flags", "message"), [
    (("--tokens", "15X"), "is not a token count"),
    (("--tokens", "1T", "--mtbf-gpu-hours", "-5"), "--mtbf-gpu-hours must be positive"),
    (("--steps", "0"), "--steps must be a positive integer"),
    (("--steps", "10", "--checkpoint-gbps", "-1"), "--checkpoint-gbps must be positive"),
    (("--steps", "10", "--checkpoint-every", "0"), "at least one step"),
    (("--mtbf-gpu-hours", "100"), "needs the run's length"),
    (("--steps", "10", "--tokens", "1T"), "not both"),
    (("--steps", "10", "--server", "http://127.0.0.1:9"), "not sent to a zrt serve"),
])
def test_bad_run_flags_are_one_line_exit_2(model_dir: Path, capsys: pytest.CaptureFixture[str],
                                           flags: tuple[str, ...], message: str) -> None:
    try:
        code = main(_run(model_dir, *flags))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and err.count("\n") == 1 and message in err


def test_run_flags_without_train_are_refused(model_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # zrt run serves by default: a token budget there would be dropped silently
    assert main(["run", str(model_dir), "--hw", "h100", "--tokens", "1T"]) == 2
    err = capsys.readouterr().err
    assert err == "zrt: error: --tokens describes a training run — add --train\n"
