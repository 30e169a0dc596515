"""zrt_core.calibrate.records: the inventory of fitted parameters matches the shipped packs,
and validation records become the samples a fit scores."""

from __future__ import annotations

import pytest

from zrt_core.calibrate.records import PACK_PARAMS, samples_from_records
from zrt_core.plugins import get_plugin_manager
from zrt_core.validate import records_from_data


class _WithoutHostTime:
    """The plugin host with no host launch time on any hardware: the tiny GPT-2 steps of the
    fit test would otherwise be host-bound (``host_launch_us``), and no GEMM rate could then
    move them."""

    def __init__(self, host) -> None:
        self._host = host

    def hardware_spec(self, name: str):
        from attrs import evolve

        spec = self._host.hardware_spec(name)
        return evolve(spec, efficiency=evolve(spec.efficiency, host_launch_us=0.0))

    def __getattr__(self, name: str):
        return getattr(self._host, name)


@pytest.mark.needs("zrt-nvidia")
def test_every_fitted_parameter_is_the_packs_value() -> None:
    host = get_plugin_manager()
    for p in PACK_PARAMS:
        for hw in p.hardware:
            assert getattr(host.hardware_spec(hw).efficiency, p.field) == p.shipped, (p, hw)
    assert len({p.name for p in PACK_PARAMS}) == len(PACK_PARAMS)


def test_samples_score_step_time_and_output_throughput() -> None:
    cfg = {"model_type": "llama"}
    common = {"model": {"name": "m", "hf_config": cfg}, "num_gpus": 8, "hardware": "hw"}
    records = records_from_data([
        {**common, "id": "src-a", "workload": "train", "precision": "FP8",
         "measured": {"step_time_s": 2.0, "mfu": 0.4}},
        {**common, "id": "src-b", "workload": "train", "measured": {"mfu": 0.4}},
        {**common, "id": "other-c", "workload": "infer",
         "measured": {"output_tokens_per_s_per_gpu": 50.0}},
        {**common, "id": "src-a", "workload": "train", "measured": {"step_time_s": 1.0}},
        {**common, "id": "src-d", "workload": "train", "typo": 1,
         "measured": {"step_time_s": 1.0}},
    ])
    samples = samples_from_records(records)
    # the MFU-only record, the repeated id and the record with an unknown key are left out
    assert [(s.id, s.source, s.workload, s.quantity, s.measured, s.precision, s.family)
            for s in samples] == [
        ("src-a", "src", "train", "step_time_s", 2.0, "fp8", "llama"),
        ("other-c", "other", "infer", "output_tokens_per_s_per_gpu", 50.0, None, "llama")]


# GPT-2 of h=1024, 2 layers, 8 heads, vocab 512: at micro-batch 4 × 512 tokens its QKV GEMM
# (2 · 2048 · 3072 · 1024 = 12.9 GFLOP against ~17 MB) is compute-bound on H100, so the
# step time moves with the rate its bf16 GEMMs sustain (H100's matmul_sustained_16bit)
GPT2 = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 2, "n_head": 8, "n_inner": 4096,
        "vocab_size": 512, "n_positions": 512}


@pytest.mark.needs("zrt-nvidia")
def test_a_fit_on_records_recovers_the_value_they_were_made_with() -> None:
    from attrs import evolve

    from zrt_core.calibrate import Param, errors_at, fit
    from zrt_core.calibrate.records import RecordPredictor

    def record(rid: str, global_batch: int, hardware: str = "nvidia_h100_sxm") -> dict:
        return {"id": rid, "source": "tests", "workload": "train",
                "model": {"name": "gpt2", "hf_config": GPT2}, "hardware": hardware,
                "num_gpus": 2, "parallel": {"tp": 1, "pp": 1, "dp": 2}, "micro_batch": 4,
                "global_batch": global_batch, "seq_len": 512, "precision": "bf16",
                "measured": {"step_time_s": 1.0}}

    raw = [record("t-a", 8), record("t-b", 16), record("t-c", 32),
           record("t-x", 8, hardware="abacus")]
    param = Param("h.sustained", "matmul_sustained_16bit", ("nvidia_h100_sxm",), default=1.0,
                  shipped=0.75, lo=0.6, hi=1.0)
    records = records_from_data(raw)
    predict = RecordPredictor(records, [param], host=_WithoutHostTime(get_plugin_manager()))
    samples = samples_from_records(records)
    assert predict(samples[-1], {}) is None  # unknown hardware: not predicted
    made = [evolve(s, measured=predict(s, {"h.sustained": 0.8})) for s in samples[:3]]
    assert predict(made[0], {"h.sustained": 0.6}) > made[0].measured > \
        predict(made[0], {"h.sustained": 1.0})
    result = fit(made, [param], predict)
    assert result.values["h.sustained"] == 0.8
    assert max(abs(e) for e in errors_at(made, [param], result.values, predict).values()) \
        == 0.0
