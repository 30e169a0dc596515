"""Fuzzed inputs (hypothesis): configs, layouts, workloads, spec files, validation records,
hardware YAML and the Python API's arguments. Every outcome is a result that passes the
sanity checks (finite, positive, the identities holding) or exactly one ``zrt: error:``
line with exit status 2 — never a traceback, never exit 1 (a bug). Tiny models and the
analytic front-end keep each example in tens of milliseconds; the inputs these found are
kept as explicit cases in tests/test_input_checks.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zrt_core.cli.main import main
from zrt_core.errors import InternalError, ZrtError
from zrt_core.plugins import PluginHost, get_plugin_manager

pytestmark = pytest.mark.needs("zrt-nvidia")

# h=256, 4 layers of 8 heads (4 KV heads), FFN 512, vocab 1024, 4096 positions
TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 512,
        "vocab_size": 1024, "max_position_embeddings": 4096}
TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
            "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 8,
            "num_experts_per_tok": 2, "vocab_size": 1024, "max_position_embeddings": 4096}
FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings",
          "num_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
          "q_lora_rank", "v_head_dim", "quantization_config", "rope_scaling", "sliding_window")



def fuzz(examples: int) -> settings:
    """Bounded, reproducible runs: the same examples every time, no saved database;
    ``ZRT_FUZZ_SCALE=N`` runs N times as many (a longer hunt, outside the suite)."""
    scale = int(os.environ.get("ZRT_FUZZ_SCALE") or 1)
    return settings(max_examples=examples * scale, deadline=None, derandomize=scale == 1,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

# about half the draws are plausible sizes, so that accepted inputs are priced and checked
plausible = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048])
values = st.one_of(
    plausible, plausible, plausible, plausible, plausible, plausible, plausible, plausible,
    st.integers(min_value=-3, max_value=5000), st.sampled_from([0, 3, 2**31, 10**7, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.none(),
    st.booleans(), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                        st.integers(),
                                                                        max_size=2))


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


def tally(kind: str) -> None:
    """With ``ZRT_FUZZ_TALLY=FILE``, append ``test outcome`` per example (the counts in
    docs/input-checks.md come from such a run)."""
    path = os.environ.get("ZRT_FUZZ_TALLY")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{test} {kind}\n")


def outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    tally("result" if rc == 0 else "error")
    if rc == 0:
        assert "zrt: error" not in err
    else:
        lines = [ln for ln in err.splitlines() if ln.startswith("zrt: error: ")]
        assert rc == 2 and len(lines) == 1, (rc, err)
        assert "Traceback" not in err and "internal error" not in err
    return rc, out, err


def sane_training(data: dict[str, Any]) -> None:
    for key in ("step_time_s", "pipeline_s", "compute_s", "tokens_per_s_per_gpu", "mfu",
                "hfu"):
        assert math.isfinite(data[key]) and data[key] > 0, (key, data[key])
    for key in ("bubble_s", "optimizer_s", "recompute_s", "backward_s"):
        assert math.isfinite(data[key]) and data[key] >= -1e-9 * data["step_time_s"], key
    exposed = sum(data["pipeline_exposed_comm_s"].values())
    assert math.isclose(data["step_time_s"], data["pipeline_s"] + data["optimizer_s"]
                        + data["optimizer_comm_exposed_s"], rel_tol=1e-6)
    assert math.isclose(data["pipeline_s"], data["compute_s"] + exposed + data["bubble_s"],
                        rel_tol=1e-6)
    assert math.isclose(data["compute_s"], data["forward_s"] + data["backward_s"]
                        + data["recompute_s"], rel_tol=1e-6)


def sane_serving(data: dict[str, Any]) -> None:
    for key in ("ttft_ms", "tpot_ms"):
        assert math.isfinite(data[key]) and data[key] > 0, (key, data[key])
    tps = data["output_tokens_per_s"]
    assert math.isfinite(tps) and tps >= 0
    assert tps > 0 or data["max_batch"] == 0 or not data["memory"]["fits"]


def write_spec(tmp: Path, spec: Any) -> str:
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec) if not isinstance(spec, str | bytes) else "",
                    encoding="utf-8")
    if isinstance(spec, str):
        path.write_text(spec, encoding="utf-8")
    elif isinstance(spec, bytes):
        path.write_bytes(spec)
    return str(path)


def estimate(tmp: Path, spec: Any, capsys: pytest.CaptureFixture[str]) -> int:
    rc, out, _ = outcome(["estimate", "--config", write_spec(tmp, spec), "--json"], capsys)
    if rc == 0:
        data = json.loads(out)
        (sane_training if data["spec"]["workload"] == "train" else sane_serving)(data)
    return rc


# -- configs ----------------------------------------------------------------------------


@fuzz(20)
@given(base=st.sampled_from([TINY, TINY_MOE]),
       changes=st.dictionaries(st.sampled_from(FIELDS), values, min_size=1, max_size=3))
def test_configs_are_priced_sanely_or_refused_in_one_line(tmp_path: Path, capsys, base,
                                                          changes) -> None:
    spec = {"model": {"config": {**base, **changes}}, "hardware": "h100",
            "parallel": {"tp": 2}, "infer": {"input_len": 64, "output_len": 16, "batch": 2}}
    estimate(tmp_path, spec, capsys)


@fuzz(40)
@given(changes=st.dictionaries(st.sampled_from(FIELDS), values, min_size=1, max_size=2))
def test_configs_through_the_api_raise_only_zrt_errors(host: PluginHost, changes) -> None:
    from zrt_core.analytic.builder import analytic_capture

    try:
        analytic_capture({**TINY, **changes}, ("prefill", "decode"), batch=1, seq_len=32,
                         host=host)
    except ZrtError as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc)
        tally("error")
    else:
        tally("result")


# -- layouts and workloads -----------------------------------------------------------------

degrees = st.sampled_from([1, 2, 3, 4, 8])


@fuzz(15)
@given(tp=degrees, pp=degrees, vp=st.sampled_from([1, 2]), cp=st.sampled_from([1, 2, 3]),
       dp=degrees, ep=st.sampled_from([1, 2, 4]), micro=st.sampled_from([1, 2, 3]),
       global_batch=st.sampled_from([1, 8, 16, 48, 10**30]),
       seq=st.sampled_from([64, 96, 128, 4097, 10**11]), zero=st.sampled_from([0, 1, 2, 3]),
       fsdp=st.booleans(), recompute=st.sampled_from(["none", "selective", "full"]),
       schedule=st.sampled_from(["1f1b", "gpipe", "interleaved", "zb-h1", "zb-v",
                                 "dualpipe", "dualpipev"]), moe=st.booleans())
def test_training_layouts_are_priced_sanely_or_refused(tmp_path: Path, capsys, tp, pp, vp,
                                                        cp, dp, ep, micro, global_batch, seq,
                                                        zero, fsdp, recompute, schedule,
                                                        moe) -> None:
    spec = {"model": {"config": TINY_MOE if moe else TINY}, "hardware": "h100",
            "parallel": {"tp": tp, "pp": pp, "vp": vp, "cp": cp, "dp": dp, "ep": ep},
            "train": {"micro_batch": micro, "global_batch": global_batch, "seq_len": seq,
                      "zero": zero, "fsdp": fsdp, "recompute": recompute,
                      "pp_schedule": schedule}}
    estimate(tmp_path, spec, capsys)


@fuzz(12)
@given(tp=degrees, pp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2]),
       input_len=st.sampled_from([1, 17, 64, 4000, 5000, 10**9]),
       output_len=st.sampled_from([1, 16, 200, 10**30]),
       batch=st.sampled_from([None, 1, 7, 64, 10**12]),
       quant=st.sampled_from(["none", "int8", "int4", "fp8", "fp4"]),
       engine=st.sampled_from(["trtllm", "vllm"]), moe=st.booleans())
def test_serving_workloads_are_priced_sanely_or_refused(tmp_path: Path, capsys, tp, pp, dp,
                                                         input_len, output_len, batch, quant,
                                                         engine, moe) -> None:
    spec = {"model": {"config": TINY_MOE if moe else TINY}, "hardware": "h100",
            "parallel": {"tp": tp, "pp": pp, "dp": dp},
            "infer": {"input_len": input_len, "output_len": output_len, "batch": batch,
                      "quant": quant, "engine": engine}}
    estimate(tmp_path, spec, capsys)


# -- spec files ------------------------------------------------------------------------------

yaml_values = st.recursive(st.one_of(values, st.just("analytic")),
                           lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                   st.dictionaries(st.text(max_size=4), inner,
                                                                   max_size=2)),
                           max_leaves=6)
SPEC_KEYS = {"model": ["hidden", "layers", "heads", "ffn", "vocab", "experts", "top_k",
                       "kv_heads", "head_dim", "family", "dense_layers", "max_positions"],
             "parallel": ["tp", "pp", "vp", "cp", "ep", "dp", "etp", "sp", "cp_kind"],
             "train": ["micro_batch", "global_batch", "seq_len", "zero", "recompute",
                       "precision", "pp_schedule"],
             "infer": ["input_len", "output_len", "batch", "quant", "kv_dtype", "dtype",
                       "engine"]}


@fuzz(20)
@given(section=st.sampled_from(sorted(SPEC_KEYS)), data=st.data())
def test_spec_file_values_are_priced_sanely_or_refused(tmp_path: Path, capsys, section,
                                                       data) -> None:
    spec: dict[str, Any] = {
        "model": {"hidden": 256, "layers": 4, "heads": 8, "ffn": 512, "vocab": 1024},
        "hardware": "h100", "parallel": {"tp": 2},
        "train": {"micro_batch": 1, "global_batch": 4, "seq_len": 64}}
    if section == "infer":
        spec["infer"] = {"input_len": 64, "output_len": 16, "batch": 2}
        del spec["train"]
    key = data.draw(st.sampled_from(SPEC_KEYS[section]))
    spec[section] = {**(spec.get(section) or {}), key: data.draw(st.one_of(plausible,
                                                                           yaml_values))}
    estimate(tmp_path, spec, capsys)


@fuzz(30)
@given(blob=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                      st.sampled_from([b"[" * 5000 + b"]" * 5000, b"a: " + b"9" * 5000,
                                       b"\xff\xfe\x00garbage", b"- 1\n- 2\n", b"{}"])))
def test_spec_files_that_are_not_specs_are_refused(tmp_path: Path, capsys, blob) -> None:
    assert estimate(tmp_path, blob, capsys) == 2


# -- validation records -------------------------------------------------------------------------

RECORD = {"id": "fuzz-1", "source": "fuzz", "workload": "train", "hardware": "nvidia_h100_sxm",
          "num_gpus": 4, "model": {"name": "tiny", "hf_config": TINY},
          "parallel": {"tp": 2, "pp": 1, "dp": 2}, "micro_batch": 1, "global_batch": 8,
          "seq_len": 128, "precision": "bf16", "measured": {"step_time_s": 0.01}}
RECORD_FIELDS = {"num_gpus": None, "micro_batch": None, "global_batch": None, "seq_len": None,
                 "precision": None, "hardware": None, "parallel": None, "workload": None,
                 "measured": None, "recompute": None}


@fuzz(20)
@given(changes=st.dictionaries(st.sampled_from(sorted(RECORD_FIELDS)),
                               st.one_of(plausible, yaml_values), min_size=1, max_size=2),
       config_changes=st.dictionaries(st.sampled_from(FIELDS), values, max_size=1))
def test_validation_records_are_predicted_or_reported(host: PluginHost, changes,
                                                      config_changes) -> None:
    from zrt_core.validate import Validator, records_from_data

    record = {**RECORD, **changes,
              "model": {"name": "tiny", "hf_config": {**TINY, **config_changes}}}
    try:
        records = records_from_data([record])
    except ZrtError:
        tally("error")
        return  # the file itself is unusable: exit 2 at the CLI
    run = Validator(host, frontend="analytic", use_cache=False).run(records)
    (result,) = run.results
    tally("result" if result.ok else "error")
    if result.ok:
        assert all(math.isfinite(v) and v > 0 for k, v in result.predicted.items()), result
    else:
        assert result.message and "\n" not in result.message
        assert "bad value" not in result.message, result.message  # a raw exception's text


# -- hardware YAML -------------------------------------------------------------------------------

H100_YAML = (Path(__file__).parents[1] / "plugins/zrt_nvidia/src/zrt_nvidia/hardware/"
             "nvidia_h100_sxm.yaml")


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out += _paths(v, (*prefix, i))
    return out


@fuzz(40)
@given(data=st.data())
def test_broken_hardware_yaml_is_one_line(tmp_path: Path, data) -> None:
    from zrt_core.hardware import HardwareSpec

    spec = yaml.safe_load(H100_YAML.read_text())
    path = data.draw(st.sampled_from(_paths(spec)))
    target = spec
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = data.draw(yaml_values)
    file = tmp_path / "hw.yaml"
    file.write_text(yaml.safe_dump(spec))
    try:
        hw = HardwareSpec.from_yaml(file)
    except ZrtError as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc)
        tally("error")
        return
    tally("result")
    assert hw.memory.capacity_gb > 0 and math.isfinite(hw.memory.capacity_gb)


# -- the Python API --------------------------------------------------------------------------------

odd = st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=4), st.floats(),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2),
                                                                     st.integers(), max_size=1))


@fuzz(40)
@given(which=st.sampled_from(["model", "hardware", "parallel", "workload", "phases",
                              "batch", "seq_len"]), value=odd)
def test_api_arguments_of_the_wrong_kind_raise_zrt_errors(host: PluginHost, which,
                                                          value) -> None:
    from zrt_core.analytic.builder import analytic_capture
    from zrt_core.estimate import estimate_inference
    from zrt_core.strategy import InferSpec, Parallel

    args: dict[str, Any] = {"model": TINY, "hardware": "h100", "parallel": Parallel(tp=2),
                            "workload": InferSpec(input_len=32, output_len=8, batch=2)}
    try:
        if which in ("phases", "batch", "seq_len"):
            kwargs = {"phases": ("prefill", "decode"), "batch": 1, "seq_len": 32,
                      which: value}
            analytic_capture(TINY, host=host, **kwargs)
        else:
            args[which] = value
            estimate_inference(args["model"], args["hardware"], args["parallel"],
                               args["workload"], host=host)
    except InternalError:
        raise
    except ZrtError as exc:
        assert "\n" not in str(exc)
        tally("error")
    else:
        tally("result")
