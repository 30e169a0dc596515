"""zrt_core.calibrate.records: the inventory of fitted parameters matches the shipped packs,
and validation records become the samples a fit scores."""

from __future__ import annotations

import pytest

from zrt_core.calibrate.records import PACK_PARAMS, samples_from_records
from zrt_core.plugins import get_plugin_manager
from zrt_core.validate import records_from_data


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
