"""``zrt run --from FRAMEWORK SOURCE`` and ``--emit FRAMEWORK``: what is emitted and read
back predicts the same figures as the flags it came from; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
TRAIN = ("--train", "--micro-batch", "2", "--seq-len", "64", "--pp", "2", "--dp", "2",
         "--global-batch", "16", "--recompute", "selective")
SERVE = ("--tp", "2", "--batch", "4", "--input-len", "32", "--output-len", "8")


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


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("framework", ["megatron", "bridge"])
def test_training_emitted_and_read_back_predicts_the_same(
        framework: str, model_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", str(model_dir), "--hw", "h100"]
    before = _json(capsys, *base, *TRAIN, "--json")
    assert main([*base, *TRAIN, "--emit", framework]) == 0
    text = capsys.readouterr().out
    # the header: zrt's version, the model, the hardware and the predicted figures
    assert "written by zrt" in text and "hardware: nvidia_h100_sxm" in text
    assert f"step_time_s {before['step_time_s']:.6g}" in text
    args = tmp_path / "launch.sh"
    args.write_text(text)
    after = _json(capsys, *base, "--from", framework, str(args), "--json")
    assert after["parallel"] == before["parallel"]
    assert after["train"] == before["train"]
    assert after["step_time_s"] == before["step_time_s"]
    assert after["memory"] == before["memory"]


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize("framework, suffix", [("vllm", ".sh"), ("trtllm", ".yaml")])
def test_serving_emitted_and_read_back_predicts_the_same(
        framework: str, suffix: str, model_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["run", str(model_dir), "--hw", "h100", "--engine", framework]
    before = _json(capsys, *base, *SERVE, "--json")
    assert main([*base, *SERVE, "--emit", framework]) == 0
    path = tmp_path / f"config{suffix}"
    path.write_text(capsys.readouterr().out)
    # the lengths are the benchmark's dataset, not the engine's config: given again
    after = _json(capsys, "run", str(model_dir), "--hw", "h100", "--from", framework,
                  str(path), "--input-len", "32", "--output-len", "8", "--json")
    for key in ("ttft_ms", "tpot_ms", "output_tokens_per_s", "batch", "engine", "parallel"):
        assert after[key] == before[key], key


@pytest.mark.needs("zrt-nvidia")
def test_ignored_arguments_are_listed(model_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(model_dir), "--hw", "h100", "--from", "megatron",
                 "--micro-batch-size 2 --seq-length 64 --global-batch-size 4 --lr 3e-4 "
                 "--bf16 --use-distributed-optimizer", "--dp", "2", "--json"])
    assert code == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["train"]["global_batch"] == 4
    assert "zrt: --from megatron ignores --lr 3e-4 (not modelled)" in captured.err


@pytest.mark.parametrize("flags, message", [
    (("--from", "nemo2", "x"), "unknown framework 'nemo2'"),
    (("--emit", "jax"), "unknown framework 'jax'"),
    # a Megatron-LM reader checks the layout against the hardware: these two need a pack
    pytest.param(("--from", "megatron", "--tensor-model-parallel-size 2 --micro-batch-size 1",
                  "--tp", "4"), "--tp 4 contradicts --from megatron, which gives tp=2",
                 marks=pytest.mark.needs("zrt-nvidia")),
    (("--from", "vllm", "vllm serve m -tp 2", "--train"), "gives a serving run, but --train"),
    pytest.param(("--from", "megatron", "--tensor-model-parallel-size two"),
                 "--tensor-model-parallel-size must be an integer, got 'two'",
                 marks=pytest.mark.needs("zrt-nvidia")),
])
def test_bad_input_is_one_line_with_exit_2(flags: tuple[str, ...], message: str,
                                           model_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(model_dir), "--hw", "h100", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("zrt: error:")
    assert message in err


def test_the_help_names_every_registered_framework():
    from zrt_core.cli.run_frameworks import FRAMEWORK_NAMES
    from zrt_core.frameworks import FRAMEWORKS

    assert FRAMEWORK_NAMES == tuple(FRAMEWORKS)
