"""The published runs shipped inside zrt-core (``zrt validate --suite public``) are the
shared validation file, byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zrt_core.validate import suite_path

#: The shared folder beside the repository (CI checks it out at ``../shared``);
#: ``ZRT_SHARED`` overrides it, as for the benchmarks.
ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ZRT_SHARED") or ROOT.parent / "shared")


def test_shipped_public_suite_equals_the_shared_file() -> None:
    shared = SHARED / "validation" / "public.yaml"
    if not shared.is_file():
        pytest.skip(f"{shared} is absent (the shared folder is checked out beside the "
                    "repository in CI); nothing to compare the shipped copy with")
    shipped = suite_path("public")
    assert shipped.read_bytes() == shared.read_bytes(), (
        f"{shipped} differs from {shared}: copy the shared file into the package "
        f"(cp {shared} {shipped})")


def test_held_out_serving_records_are_valid_and_not_in_the_public_suite() -> None:
    from zrt_core.validate import check_record, load_records

    held = load_records(ROOT / "benchmarks" / "data" / "perf_overview_heldout.yaml")
    seen: set[str] = set()
    for record in held:  # each passes the file checks zrt validate applies
        check_record(record, seen)
        seen.add(record.id)
    # 14 columns of the perf-overview page, 10 shapes each, 10 cells left empty there
    assert len(held) == 130
    def cell(r):  # model type, machine, GPUs and shape
        return (r.model_type, r.hardware, r.num_gpus, r.raw["input_len"], r.raw["output_len"])

    public = {cell(r) for r in load_records(suite_path("public")) if r.workload == "infer"}
    # held out: no cell repeats a public record's model, machine, GPUs and shape
    assert not {cell(r) for r in held} & public


@pytest.mark.parametrize(("name", "count"), [("foundry_heldout.yaml", 138),
                                             ("dgxc_heldout.yaml", 217),
                                             ("torchtitan_heldout.yaml", 28)])
def test_held_out_training_records_are_valid_and_not_public_measurements(name, count) -> None:
    # llm-foundry: 120 rows of the 2023-10 tables + 18 of the 2024-01 one that zrt prices;
    # dgxc: the rows of v24.11.1-v25.05.05 left after duplicates, public rows and proxies;
    # torchtitan: Tables 1-6 of its 2024-12 page (3+4+3+2+2+4 = 18), the async-TP page's 12
    # less its 4 float8-rowwise ones (the format's fp8 cannot say rowwise) = 8, Trainy's 2
    from zrt_core.validate import check_record, load_records

    held = load_records(ROOT / "benchmarks" / "data" / name)
    seen: set[str] = set()
    for record in held:
        check_record(record, seen)
        seen.add(record.id)
    assert len(held) == count

    def run(r):  # model, machine, GPUs, precision and the measured step
        return (r.model_type, r.hardware, r.num_gpus, r.raw.get("precision"),
                r.measured.get("step_time_s"))

    public = {run(r) for r in load_records(suite_path("public")) if r.workload == "train"}
    assert not {run(r) for r in held} & public
