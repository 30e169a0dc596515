"""The Ascend pack: every spec loads, ids and aliases resolve, the 910C is modelled per die,
and the plugin is found through its entry point. Needs only zrt-core."""

from __future__ import annotations

import importlib.metadata as md
import re

import pytest
import zrt_ascend.plugin

from zrt_core.plugins import ENTRY_POINT_GROUP, get_plugin_manager

IDS = ("ascend_910b", "ascend_910c", "ascend_910c_superpod")


@pytest.fixture(scope="module")
def host():
    """A host with the core and this pack only, whatever else is installed."""
    h = get_plugin_manager(autoload=False)
    h.register(zrt_ascend.plugin, "zrt_ascend", distribution="zrt-ascend")
    return h


def test_the_pack_ships_exactly_the_three_ids(host):
    assert sorted(host.hardware.keys()) == list(IDS)
    assert sorted(p.stem for p in zrt_ascend.plugin.HARDWARE_DIR.glob("*.yaml")) == list(IDS)


@pytest.mark.parametrize(("alias", "hw_id"), [
    ("910b", "ascend_910b"), ("910c", "ascend_910c"), ("910C", "ascend_910c"),
    ("cloudmatrix384", "ascend_910c_superpod"), ("cm384", "ascend_910c_superpod"),
])
def test_short_aliases_resolve(host, alias, hw_id):
    assert host.hardware.resolve(alias) == hw_id


def test_910c_is_one_die_half_of_the_published_package(host):
    die = host.hardware.get("910c")
    # CloudMatrix384 paper: 752 TFLOPS fp16, 128 GB at 3.2 TB/s per 2-die package.
    assert die.compute.fp16_tflops * 2 == 752
    assert die.memory.capacity_gb * 2 == 128
    assert die.memory.bandwidth_gb_per_s * 2 == 3200
    assert die.compute.fp8_tflops is None


@pytest.mark.parametrize(("hw_id", "tiers"), [
    # (name, GB/s per direction per device, devices)
    ("ascend_910b", [("hccs", 196, 8), ("roce", 25, None)]),           # 392/2; 200 GE / 8
    ("ascend_910c", [("sio", 224, 2), ("hccs", 196, 16), ("roce", 25, None)]),
    # 384 NPUs x 2 dies = 768 devices in one UB domain; 400 Gb/s per NPU / 2 dies / 8 = 25
    ("ascend_910c_superpod",
     [("sio", 224, 2), ("ub_l1", 196, 16), ("ub_l2", 196, 768), ("roce", 25, None)]),
])
def test_interconnect_tiers(host, hw_id, tiers):
    spec = host.hardware.get(hw_id)
    assert [(t.name, t.bandwidth_gb_per_s, t.devices) for t in spec.interconnect] == tiers
    assert spec.scale_up_devices == tiers[-2][2]


def test_superpod_groups_up_to_768_devices_stay_on_ub(host):
    spec = host.hardware.get("ascend_910c_superpod")
    assert spec.tier_for(16).name == "ub_l1"
    assert spec.tier_for(17).name == "ub_l2"
    assert spec.tier_for(768).name == "ub_l2"
    assert spec.tier_for(769).name == "roce"


def test_every_compute_and_memory_figure_has_a_source_comment():
    number_line = re.compile(r"^\s+(fp32|tf32|bf16|fp16|fp8|fp4|int8|capacity_gb|"
                             r"bandwidth_gb_per_s):\s*[0-9]")
    for path in zrt_ascend.plugin.HARDWARE_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if number_line.match(line):
                assert "#" in line, f"{path.name}: no source comment on {line.strip()!r}"


def test_the_entry_point_names_this_module():
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "zrt_ascend"]
    assert [(ep.value, ep.dist.name) for ep in eps] == [("zrt_ascend.plugin", "zrt-ascend")]


def test_autoloaded_host_attributes_the_specs_to_the_distribution(monkeypatch):
    monkeypatch.delenv("ZRT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("ZRT_DISABLE_PLUGINS", raising=False)
    host = get_plugin_manager()
    assert host.hardware.distribution_of("910b") == "zrt-ascend"
    info = {i.name: i for i in host.plugin_infos()}["zrt_ascend"]
    assert sorted(info.contributions["zrt_hardware_specs"]) == list(IDS)
