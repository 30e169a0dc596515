"""HardwareSpec: strict YAML loading (every error names the file and the field), tiers, the
peak-rate fallbacks and the pack loader."""

from __future__ import annotations

import types

import attrs
import pytest

from zrt_core.errors import SpecError, ZrtError
from zrt_core.hardware import (
    CacheTier,
    ComputeSpec,
    Efficiency,
    HardwareSpec,
    InterconnectTier,
    MemorySpec,
    load_specs,
    power_limited_clock,
    spec_summary,
)
from zrt_core.plugins import hookimpl


def _load(tmp_path, text: str, name: str = "toy_gpu.yaml") -> HardwareSpec:
    path = tmp_path / name
    path.write_text(text)
    return HardwareSpec.from_yaml(path)


def test_a_valid_spec_loads_every_field(toy_spec_file):
    spec = HardwareSpec.from_yaml(toy_spec_file)
    assert spec.id == "toy_gpu" and spec.vendor == "toy" and spec.name == "Toy GPU 16GB"
    assert spec.aliases == ("toy", "toy-16g")
    assert spec.compute == ComputeSpec(fp32_tflops=10, tf32_tflops=40, bf16_tflops=80,
                                       fp16_tflops=80, fp8_tflops=160, fp4_tflops=None,
                                       int8_tops=160)
    assert spec.memory == MemorySpec(capacity_gb=16, bandwidth_gb_per_s=1000,
                                     caches=(CacheTier("l2", 8, 4000),))
    assert spec.memory.capacity_bytes == 16e9
    assert spec.interconnect == (
        InterconnectTier("link", bandwidth_gb_per_s=100, latency_us=2, devices=4,
                         efficiency=0.75),
        InterconnectTier("net", bandwidth_gb_per_s=25, latency_us=5, devices=None,
                         efficiency=0.8),  # the default
    )
    assert (spec.power_w, spec.price_per_device_hour_usd) == (300, 1.5)
    assert spec.efficiency == attrs.evolve(Efficiency(), matmul=0.8, memory=0.9,
                                           launch_overhead_us=3)
    assert spec.source_file == str(toy_spec_file)


def test_spec_is_frozen(toy_spec_file):
    spec = HardwareSpec.from_yaml(toy_spec_file)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.power_w = 1  # type: ignore[misc]


# Each case changes one line of the toy spec and expects the message to name the field.
BAD_FIELDS = [
    ("id: toy_gpu", "id: toy_gpu\ncolour: red", "toy_gpu.yaml: unknown key 'colour'"),
    ("fp8: 160", "fp8: 160, fp9: 1", "toy_gpu.yaml: compute: unknown key 'fp9'"),
    ("bandwidth_gb_per_s: 1000", "bandwidth_gb_per_s: -1",
     "toy_gpu.yaml: memory.bandwidth_gb_per_s must be > 0, got -1"),
    ("bandwidth_gb_per_s: 1000", "bandwidth_gb_per_s: 0",
     "toy_gpu.yaml: memory.bandwidth_gb_per_s must be > 0, got 0"),
    ("{name: link, bandwidth_gb_per_s: 100", "{name: link, bandwidth_gb_per_s: 0",
     "toy_gpu.yaml: interconnect[0].bandwidth_gb_per_s must be > 0, got 0"),
    ("{name: net, bandwidth_gb_per_s: 25", "{name: net, bandwidth_gb_per_s: -25",
     "toy_gpu.yaml: interconnect[1].bandwidth_gb_per_s must be > 0, got -25"),
    ("latency_us: 2,", "latency_us: -2,",
     "toy_gpu.yaml: interconnect[0].latency_us must be >= 0, got -2"),
    ("capacity_gb: 16", "capacity_gb: sixteen",
     "toy_gpu.yaml: memory.capacity_gb must be a number, got 'sixteen'"),
    ("capacity_gb: 16", "capacity_gb: .nan",
     "toy_gpu.yaml: memory.capacity_gb must be a finite number, got nan"),
    ("bf16: 80, ", "", "toy_gpu.yaml: compute.bf16 is required"),
    ("capacity_mb: 8", "capacity_mb: 8, size: 1",
     "toy_gpu.yaml: memory.caches[0]: unknown key 'size'"),
    ("efficiency: {matmul: 0.8", "efficiency: {matmul: 1.2",
     "toy_gpu.yaml: efficiency.matmul must be <= 1.0, got 1.2"),
    ("efficiency: {matmul: 0.8", "efficiency: {matmal: 0.8",
     "toy_gpu.yaml: efficiency: unknown key 'matmal'"),
    ("efficiency: 0.75}", "efficiency: 1.5}",
     "toy_gpu.yaml: interconnect[0].efficiency must be <= 1.0, got 1.5"),
    ("devices: 4,", "devices: 4.5,",
     "toy_gpu.yaml: interconnect[0].devices must be an integer, got 4.5"),
    ("aliases: [toy, toy-16g]", "aliases: [toy, Toy-16G]",
     "toy_gpu.yaml: aliases[1] must be a lower-case name"),
    ("id: toy_gpu", "id: Toy-GPU", "toy_gpu.yaml: id 'Toy-GPU' must be lower-case"),
    ("power_w: 300", "power_w: 0", "toy_gpu.yaml: power_w must be > 0, got 0"),
    ("efficiency: {matmul: 0.8", "efficiency: {comm_overlap_sms: 8, matmul: 0.8",
     "toy_gpu.yaml: efficiency.comm_overlap_sms (8) must be fewer than parallel_units (0)"),
    ("name: Toy GPU 16GB\n", "", "toy_gpu.yaml: name is required"),
    ("int8: 160}", "int8: 160, power_limited_clock: 0}",
     "toy_gpu.yaml: compute.power_limited_clock must be > 0, got 0"),
]


@pytest.mark.parametrize(("old", "new", "message"), BAD_FIELDS,
                         ids=[m.split(": ", 1)[1][:40] for _o, _n, m in BAD_FIELDS])
def test_a_bad_field_is_named_with_its_file(tmp_path, toy_yaml, old, new, message):
    assert old in toy_yaml
    with pytest.raises(SpecError) as err:
        _load(tmp_path, toy_yaml.replace(old, new, 1))
    assert str(err.value).startswith(str(tmp_path / message.split(":")[0]) + ":")
    assert message.split(":", 1)[1] in str(err.value)
    assert isinstance(err.value, ZrtError) and err.value.exit_code == 2


@pytest.mark.parametrize(("tiers", "message"), [
    # devices must grow from the inside out ...
    ("[{name: a, bandwidth_gb_per_s: 100, latency_us: 1, devices: 8},"
     " {name: b, bandwidth_gb_per_s: 50, latency_us: 1, devices: 8},"
     " {name: c, bandwidth_gb_per_s: 10, latency_us: 1, devices: null}]",
     "interconnect[1].devices (8) must be larger than the tier inside it (8)"),
    ("[{name: a, bandwidth_gb_per_s: 100, latency_us: 1, devices: 72},"
     " {name: b, bandwidth_gb_per_s: 50, latency_us: 1, devices: 8},"
     " {name: c, bandwidth_gb_per_s: 10, latency_us: 1, devices: null}]",
     "interconnect[1].devices (8) must be larger than the tier inside it (72)"),
    # ... the outermost is unbounded, and only it ...
    ("[{name: a, bandwidth_gb_per_s: 100, latency_us: 1, devices: 8},"
     " {name: b, bandwidth_gb_per_s: 50, latency_us: 1, devices: 64}]",
     "interconnect[1].devices must be null on the outermost tier"),
    ("[{name: a, bandwidth_gb_per_s: 100, latency_us: 1, devices: null},"
     " {name: b, bandwidth_gb_per_s: 50, latency_us: 1, devices: null}]",
     "interconnect[0].devices is null but it is not the outermost tier"),
    # ... a tier links at least two devices, and there is at least one tier.
    ("[{name: a, bandwidth_gb_per_s: 100, latency_us: 1, devices: 1},"
     " {name: b, bandwidth_gb_per_s: 50, latency_us: 1, devices: null}]",
     "interconnect[0].devices must be at least 2, got 1"),
    ("[]", "interconnect is required (at least one tier)"),
])
def test_tier_rules_name_the_file_and_tier(tmp_path, toy_yaml, tiers, message):
    start = toy_yaml.index("interconnect:")
    end = toy_yaml.index("power_w:")
    text = toy_yaml[:start] + f"interconnect: {tiers}\n" + toy_yaml[end:]
    with pytest.raises(SpecError) as err:
        _load(tmp_path, text)
    assert str(err.value).startswith(f"{tmp_path / 'toy_gpu.yaml'}: {message}")


def test_a_repeated_key_is_an_error_with_its_line(tmp_path, toy_yaml):
    text = toy_yaml.replace("power_w: 300", "power_w: 300\npower_w: 400")
    with pytest.raises(SpecError) as err:
        _load(tmp_path, text)
    line = text.splitlines().index("power_w: 400") + 1
    assert str(err.value).startswith(
        f"{tmp_path / 'toy_gpu.yaml'}: line {line} is not valid YAML "
        "(key 'power_w' appears twice)")


def test_broken_yaml_syntax_names_file_and_line(tmp_path):
    with pytest.raises(SpecError) as err:
        _load(tmp_path, "id: toy_gpu\nname: [unclosed\n")
    assert str(err.value).startswith(f"{tmp_path / 'toy_gpu.yaml'}: line 3 is not valid YAML")
    assert err.value.hint == "fix the syntax and run again"


def test_a_missing_file_and_a_non_mapping_are_errors(tmp_path):
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read"):
        HardwareSpec.from_yaml(tmp_path / "nope.yaml")
    with pytest.raises(SpecError) as err:
        _load(tmp_path, "- just\n- a list\n")
    assert str(err.value) == f"{tmp_path / 'toy_gpu.yaml'}: expected a mapping, got list"


def test_tiers_are_checked_when_built_in_code_too():
    with pytest.raises(SpecError, match="code_gpu: interconnect needs at least one tier"):
        HardwareSpec(id="code_gpu", name="x", vendor="x",
                     compute=ComputeSpec(fp32_tflops=1, bf16_tflops=1, fp16_tflops=1),
                     memory=MemorySpec(capacity_gb=1, bandwidth_gb_per_s=1), interconnect=())


def test_tier_for_picks_the_innermost_domain_that_holds_the_group(toy_spec_file):
    spec = HardwareSpec.from_yaml(toy_spec_file)
    assert [spec.tier_for(n).name for n in (1, 2, 4, 5, 1000)] == [
        "link", "link", "link", "net", "net"]
    assert spec.devices_per_node == 4
    assert spec.scale_up_tier.name == "link" and spec.scale_up_devices == 4


def test_scale_up_is_the_largest_bounded_tier(tmp_path, toy_yaml):
    start, end = toy_yaml.index("interconnect:"), toy_yaml.index("power_w:")
    text = toy_yaml[:start] + (
        "interconnect:\n"
        "  - {name: die, bandwidth_gb_per_s: 224, latency_us: 0.2, devices: 2}\n"
        "  - {name: node, bandwidth_gb_per_s: 196, latency_us: 0.5, devices: 16}\n"
        "  - {name: pod, bandwidth_gb_per_s: 196, latency_us: 5.5, devices: 768}\n"
        "  - {name: roce, bandwidth_gb_per_s: 25, latency_us: 5.5, devices: null}\n"
    ) + toy_yaml[end:]
    spec = _load(tmp_path, text)
    assert spec.devices_per_node == 2
    assert (spec.scale_up_tier.name, spec.scale_up_devices) == ("pod", 768)
    row = spec_summary(spec)
    assert (row["scale_up"], row["scale_up_devices"], row["scale_up_gb_per_s"],
            row["scale_out_gb_per_s"]) == ("pod", 768, 196, 25)


def test_peak_rates_fall_back_to_the_next_wider_type(toy_spec_file):
    c = HardwareSpec.from_yaml(toy_spec_file).compute
    assert c.peak_tflops("bfloat16") == 80
    assert c.peak_tflops("float8_e4m3fn") == 160
    assert c.peak_tflops("nvfp4") == 160      # no fp4 units: runs at the fp8 rate
    assert c.peak_tflops("float32") == 40      # tf32
    no_fp8 = attrs.evolve(c, fp8_tflops=None, tf32_tflops=None)
    assert no_fp8.peak_tflops("nvfp4") == 80   # fp4 -> fp8 -> bf16
    assert no_fp8.peak_tflops("float32") == 10  # tf32 -> fp32
    with pytest.raises(SpecError, match="no compute rate for dtype 'complex64'"):
        c.peak_tflops("complex64")


def test_to_json_holds_every_field(toy_spec_file):
    data = HardwareSpec.from_yaml(toy_spec_file).to_json()
    assert data["interconnect"][1] == {"name": "net", "bandwidth_gb_per_s": 25.0,
                                       "latency_us": 5.0, "devices": None, "efficiency": 0.8,
                                       "nvls_efficiency": None, "sharp": False,
                                       "all_to_all_efficiency": None}
    assert data["memory"]["caches"] == [{"name": "l2", "capacity_mb": 8.0,
                                         "bandwidth_gb_per_s": 4000.0}]
    assert data["aliases"] == ["toy", "toy-16g"]


def test_load_specs_reads_a_directory_in_name_order(tmp_path, toy_yaml):
    (tmp_path / "b_gpu.yaml").write_text(toy_yaml.replace("toy", "b"))
    (tmp_path / "a_gpu.yaml").write_text(toy_yaml.replace("toy", "a"))
    (tmp_path / "notes.txt").write_text("not a spec")
    assert [s.id for s in load_specs(tmp_path)] == ["a_gpu", "b_gpu"]


def test_load_specs_refuses_an_empty_pack(tmp_path):
    with pytest.raises(SpecError) as err:
        load_specs(tmp_path)
    assert str(err.value).startswith(f"{tmp_path}: no hardware specs (*.yaml) found")


def test_aliases_resolve_through_the_registry(core_host, register_plugin, toy_spec_file):
    spec = HardwareSpec.from_yaml(toy_spec_file)

    @hookimpl
    def zrt_hardware_specs():
        return [spec]

    register_plugin(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "toy")
    for name in ("toy_gpu", "toy", "TOY-16G"):
        assert core_host.hardware_spec(name) is spec


def test_the_power_limited_clock_scales_every_compute_rate_and_nothing_else(tmp_path, toy_yaml):
    plain = _load(tmp_path, toy_yaml)
    assert plain.compute.power_limited_clock == 1.0
    assert plain.power_limited() is plain          # 1: the spec itself, no copy
    spec = _load(tmp_path, toy_yaml.replace("int8: 160}", "int8: 160, power_limited_clock: 1.25}"))
    hot = spec.power_limited()
    assert hot is spec.power_limited()             # one object per spec (price caches key on it)
    c = hot.compute
    # toy rates x 1.25: fp32 10 -> 12.5, tf32 40 -> 50, bf16/fp16 80 -> 100, fp8 and int8
    # 160 -> 200; no fp4 units stay none; the scaled spec is not scaled again
    assert (c.fp32_tflops, c.tf32_tflops, c.bf16_tflops, c.fp16_tflops, c.fp8_tflops,
            c.int8_tops, c.fp4_tflops) == (12.5, 50, 100, 100, 200, 200, None)
    assert c.power_limited_clock == 1.0 and hot.power_limited() is hot
    # memory, links and the datasheet spec itself are untouched
    assert hot.memory == spec.memory and hot.interconnect == spec.interconnect
    assert spec.compute.bf16_tflops == 80


def test_power_limited_clock_is_the_cube_root_law_against_a_reference(tmp_path, toy_yaml):
    ref = _load(tmp_path, toy_yaml.replace("efficiency: {", "efficiency: {parallel_units: 100, "))
    # 8 x the SMs (8^(2/3) = 4) at 8 x the power (8^(1/3) = 2) and twice the bf16 peak:
    # 4 * 2 / 2 = 4
    big = _load(tmp_path, toy_yaml.replace("efficiency: {", "efficiency: {parallel_units: 800, ")
                .replace("power_w: 300", "power_w: 2400").replace("bf16: 80", "bf16: 160"))
    assert power_limited_clock(big, ref) == pytest.approx(4.0)
    assert power_limited_clock(ref, ref) == pytest.approx(1.0)
    with pytest.raises(SpecError, match=r"needs power_w and efficiency\.parallel_units"):
        power_limited_clock(_load(tmp_path, toy_yaml), ref)
