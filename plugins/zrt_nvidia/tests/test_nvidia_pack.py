"""The NVIDIA pack: every spec loads, ids and aliases resolve, figures are dense and per
direction, and the plugin is found through its entry point. Needs only zrt-core."""

from __future__ import annotations

import importlib.metadata as md
import re

import pytest
import zrt_nvidia.plugin

from zrt_core.plugins import ENTRY_POINT_GROUP, get_plugin_manager

IDS = (
    "nvidia_a100_sxm_80g", "nvidia_b200", "nvidia_b300", "nvidia_gb200_nvl72",
    "nvidia_gb300_nvl72", "nvidia_h100_sxm", "nvidia_h200", "nvidia_h800",
)


@pytest.fixture(scope="module")
def host():
    """A host with the core and this pack only, whatever else is installed."""
    h = get_plugin_manager(autoload=False)
    h.register(zrt_nvidia.plugin, "zrt_nvidia", distribution="zrt-nvidia")
    return h


def test_the_pack_ships_exactly_the_eight_ids_one_file_each(host):
    assert sorted(host.hardware.keys()) == sorted(IDS)
    files = sorted(p.stem for p in zrt_nvidia.plugin.HARDWARE_DIR.glob("*.yaml"))
    assert files == sorted(IDS)
    for spec in host.hardware:
        assert spec.source_file.endswith(f"{spec.id}.yaml")
        assert spec.vendor == "nvidia"


@pytest.mark.parametrize(("alias", "hw_id"), [
    ("a100", "nvidia_a100_sxm_80g"), ("h100", "nvidia_h100_sxm"), ("H100", "nvidia_h100_sxm"),
    ("h800", "nvidia_h800"), ("h200", "nvidia_h200"), ("b200", "nvidia_b200"),
    ("b300", "nvidia_b300"), ("gb200", "nvidia_gb200_nvl72"), ("gb300", "nvidia_gb300_nvl72"),
])
def test_short_aliases_resolve(host, alias, hw_id):
    assert host.hardware.resolve(alias) == hw_id


@pytest.mark.parametrize(("hw_id", "bf16", "fp8", "fp4", "hbm_gb", "hbm_gb_per_s"), [
    # Cross-checked with ../shared/validation/hardware_specs.yaml (dense figures).
    ("nvidia_a100_sxm_80g", 312, None, None, 80, 2039),
    ("nvidia_h100_sxm", 989.4, 1978.9, None, 80, 3350),
    ("nvidia_h800", 989.4, 1978.9, None, 80, 3350),
    ("nvidia_h200", 989.4, 1978.9, None, 141, 4800),
    ("nvidia_b200", 2250, 4500, 9000, 180, 8000),        # 36/72/144 PF sparse / 8 GPUs / 2
    ("nvidia_gb200_nvl72", 2500, 5000, 10000, 186, 8000),  # 360/720/1440 PF sparse / 72 / 2
    ("nvidia_b300", 2250, 4500, 14000, 270, 8000),
    ("nvidia_gb300_nvl72", 2500, 5000, 15000, 279, 8000),  # 1,080 PF dense fp4 / 72 = 15
])
def test_dense_compute_and_memory(host, hw_id, bf16, fp8, fp4, hbm_gb, hbm_gb_per_s):
    spec = host.hardware.get(hw_id)
    assert spec.compute.bf16_tflops == bf16
    assert spec.compute.fp16_tflops == bf16
    assert spec.compute.fp8_tflops == fp8
    assert spec.compute.fp4_tflops == fp4
    assert spec.memory.capacity_gb == hbm_gb
    assert spec.memory.bandwidth_gb_per_s == hbm_gb_per_s


@pytest.mark.parametrize(("hw_id", "tiers"), [
    # (name, GB/s per direction, devices): NVLink total / 2; NIC Gb/s / 8.
    ("nvidia_a100_sxm_80g", [("nvlink3", 300, 8), ("infiniband_hdr", 25, None)]),   # 600/2, 200/8
    ("nvidia_h100_sxm", [("nvlink4", 450, 8), ("infiniband_ndr", 50, None)]),       # 900/2, 400/8
    ("nvidia_h800", [("nvlink4", 200, 8), ("infiniband_ndr", 50, None)]),           # 400/2, 400/8
    ("nvidia_h200", [("nvlink4", 450, 8), ("infiniband_ndr", 50, None)]),
    ("nvidia_b200", [("nvlink5", 900, 8), ("infiniband_ndr", 50, None)]),           # 1800/2
    ("nvidia_b300", [("nvlink5", 900, 8), ("infiniband_xdr", 100, None)]),          # 800/8
    ("nvidia_gb200_nvl72", [("nvlink5", 900, 72), ("infiniband_ndr", 50, None)]),
    ("nvidia_gb300_nvl72", [("nvlink5", 900, 72), ("infiniband_xdr", 100, None)]),
])
def test_interconnect_tiers(host, hw_id, tiers):
    spec = host.hardware.get(hw_id)
    assert [(t.name, t.bandwidth_gb_per_s, t.devices) for t in spec.interconnect] == tiers
    assert spec.scale_up_devices == tiers[0][2]
    assert spec.tier_for(tiers[0][2] + 1) is spec.interconnect[-1]


def test_efficiencies_are_fractions_and_power_is_given(host):
    for spec in host.hardware:
        e = spec.efficiency
        for value in (e.matmul, e.attention, e.memory, *[t.efficiency for t in spec.interconnect]):
            assert 0 < value <= 1
        assert spec.power_w is not None and spec.power_w >= 400


# The die whose efficiency fractions were measured, per family; every other pack of the
# family gives its power-limited clock against it.
CLOCK_REFERENCE = {"nvidia_b200": ("nvidia_gb200_nvl72", "nvidia_b300", "nvidia_gb300_nvl72"),
                   "nvidia_h100_sxm": ("nvidia_h200", "nvidia_h800")}


def test_each_power_limited_clock_is_the_cube_root_law_against_its_reference(host):
    from zrt_core.hardware import power_limited_clock

    specs = {s.id: s for s in host.hardware}
    # (units, power, bf16) against B200's (148, 1000 W, 2250): GB200 (148, 1200, 2500)
    # 1.2^(1/3) / (2500/2250) = 0.956; B300 (160, 1100, 2250) (160/148)^(2/3) * 1.1^(1/3) =
    # 1.087; GB300 (160, 1400, 2500) 1.0535 * 1.1187 / 1.1111 = 1.061; Hopper's three are one
    # die at 132 SMs and 700 W each: 1
    want = {"nvidia_gb200_nvl72": 0.956, "nvidia_b300": 1.087, "nvidia_gb300_nvl72": 1.061,
            "nvidia_h200": 1.0, "nvidia_h800": 1.0}
    for ref, members in CLOCK_REFERENCE.items():
        assert specs[ref].compute.power_limited_clock == 1.0
        for hw_id in members:
            spec = specs[hw_id]
            assert round(power_limited_clock(spec, specs[ref]), 3) == want[hw_id]
            assert spec.compute.power_limited_clock == want[hw_id]
    assert specs["nvidia_a100_sxm_80g"].compute.power_limited_clock == 1.0


def test_fp8_capable_parts_carry_an_fp8_matmul_efficiency(host):
    for spec in host.hardware:
        assert (spec.efficiency.matmul_fp8 is not None) == (spec.compute.fp8_tflops is not None)


def test_every_compute_and_memory_figure_has_a_source_comment():
    number_line = re.compile(r"^\s+(fp32|tf32|bf16|fp16|fp8|fp4|int8|capacity_gb|"
                             r"bandwidth_gb_per_s|power_w):\s*[0-9]")
    for path in zrt_nvidia.plugin.HARDWARE_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if number_line.match(line) or line.startswith("power_w:"):
                assert "#" in line, f"{path.name}: no source comment on {line.strip()!r}"


def test_the_entry_point_names_this_module():
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "zrt_nvidia"]
    assert [(ep.value, ep.dist.name) for ep in eps] == [("zrt_nvidia.plugin", "zrt-nvidia")]


def test_autoloaded_host_attributes_the_specs_to_the_distribution(monkeypatch):
    monkeypatch.delenv("ZRT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("ZRT_DISABLE_PLUGINS", raising=False)
    host = get_plugin_manager()
    assert host.hardware.distribution_of("h100") == "zrt-nvidia"
    info = {i.name: i for i in host.plugin_infos()}["zrt_nvidia"]
    assert info.hooks == ("zrt_hardware_specs", "zrt_measured_tables")
    assert sorted(info.contributions["zrt_hardware_specs"]) == sorted(IDS)
