"""``zrt estimate --config``: a serving and a training spec from model numbers through the
analytic front-end, the same numbers as the capture front-end, strict keys (one line naming
the file and the key, exit 2), and the shipped examples parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zrt_core.analytic.spec import EstimateSpec, config_from_numbers
from zrt_core.cli.main import main
from zrt_core.errors import SpecError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LLAMA_NUMBERS = {"family": "llama", "hidden": 128, "layers": 3, "heads": 4, "kv_heads": 2,
                 "ffn": 256, "vocab": 512}
SERVE = {"model": LLAMA_NUMBERS, "hardware": "nvidia_h100_sxm", "parallel": {"tp": 2},
         "infer": {"input_len": 32, "output_len": 8, "batch": 4}}
TRAIN = {"model": {"family": "gpt2", "hidden": 128, "layers": 2, "heads": 4, "ffn": 512,
                   "vocab": 512, "max_positions": 128},
         "hardware": "nvidia_h100_sxm", "parallel": {"tp": 2, "dp": 2},
         "train": {"micro_batch": 2, "global_batch": 8, "seq_len": 32,
                   "recompute": "selective"}}


def _write(tmp_path: Path, data: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_model_numbers_become_the_family_config() -> None:
    cfg = config_from_numbers(LLAMA_NUMBERS)
    assert {k: cfg[k] for k in ("model_type", "hidden_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads",
                                "intermediate_size", "vocab_size", "head_dim")} == {
        "model_type": "llama", "hidden_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 256,
        "vocab_size": 512, "head_dim": 32}  # head_dim = 128 / 4
    moe = config_from_numbers({**LLAMA_NUMBERS, "family": None, "experts": 8,
                               "moe_ffn": 64, "dense_layers": 1})
    assert (moe["model_type"], moe["num_experts"], moe["num_experts_per_tok"],
            moe["moe_intermediate_size"], moe["mlp_only_layers"]) == ("qwen3_moe", 8, 2, 64,
                                                                      [0])


@pytest.mark.needs("zrt-nvidia")
def test_serving_spec_analytic_equals_capture(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, SERVE)
    analytic = _json(capsys, ["estimate", "--config", str(path), "--json"])
    captured = _json(capsys, ["estimate", "--config", str(path), "--json",
                              "--frontend", "capture"])
    assert analytic["spec"]["frontend"] == "analytic"
    assert analytic["spec"]["workload"] == "infer"
    for key in ("ttft_ms", "tpot_ms", "output_tokens_per_s"):
        assert analytic[key] > 0
        assert analytic[key] == pytest.approx(captured[key], rel=0.02)
    # output tokens/s per GPU = system throughput over tp 2
    assert analytic["output_tokens_per_s_per_gpu"] == pytest.approx(
        analytic["output_tokens_per_s"] / 2)


@pytest.mark.needs("zrt-nvidia")
def test_training_spec_analytic_equals_capture(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, TRAIN)
    analytic = _json(capsys, ["estimate", "--config", str(path), "--json"])
    captured = _json(capsys, ["estimate", "--config", str(path), "--json",
                              "--frontend", "capture"])
    assert analytic["step_time_s"] == pytest.approx(captured["step_time_s"], rel=0.02)
    # tokens/s per GPU = 8 sequences × 32 tokens / (step × 4 GPUs)
    assert analytic["tokens_per_s_per_gpu"] == pytest.approx(
        8 * 32 / (analytic["step_time_s"] * 4))


@pytest.mark.needs("zrt-nvidia")
def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--config", str(_write(tmp_path, TRAIN))]) == 0
    out = capsys.readouterr().out
    assert "analytic front-end" in out and "step" in out and "tokens/s per GPU" in out


@pytest.mark.parametrize(("change", "message"), [
    ({"train": {**TRAIN["train"], "micro_batchs": 2}}, "unknown key 'train.micro_batchs'"),
    ({"model": {**TRAIN["model"], "layerz": 2}}, "unknown key 'model.layerz'"),
    ({"colour": "blue"}, "unknown key 'colour'"),
    ({"parallel": {"tp": 0}}, "bad parallel"),
    ({"train": {"seq_len": 32}}, "train.micro_batch is missing"),
    ({"infer": {"input_len": 8, "output_len": 8}}, "give exactly one of train and infer"),
    ({"train": None, "infer": {"input_len": 8, "output_len": 8, "batch": 4,
                               "concurrency": 8}}, "batch 4 and concurrency 8 both given"),
    ({"model": {"family": "bloom", "hidden": 8, "layers": 1, "heads": 1, "ffn": 8,
                "vocab": 8}}, "model.family 'bloom' has no analytic model"),
])
def test_bad_spec_is_one_line_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict,
        message: str) -> None:
    path = _write(tmp_path, {**TRAIN, **change}, "bad.yaml")
    assert main(["estimate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(path) in err and message in err


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse(example: Path) -> None:
    spec = EstimateSpec.from_yaml(example)
    assert spec.hardware and spec.workload in ("train", "infer")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the estimate file"):
        EstimateSpec.from_yaml(tmp_path / "none.yaml")
