"""In-network reductions (NVLS, NVLS-Tree, CollNet/SHARP) and NCCL-style algorithm selection.

The toy network here: t0 = 4 devices, 100 GB/s x 0.5 = 5e10 B/s, alpha 1 us, NVLS at
100 x 0.4 = 4e10 B/s; t1 = unbounded, 10 GB/s x 1.0 = 1e10 B/s, alpha 10 us, SHARP unless a
test turns it off. NCCL's constants: NVLS 25 us (+ 18 us across the network), CollNet
Direct 31 us + 0.4 us per local peer, tree bandwidth x 0.9.
"""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cost.collective_table import collective_table
from zrt_core.cost.collectives import collective_cost
from zrt_core.cost.errors import CostError
from zrt_core.errors import SpecError
from zrt_core.hardware import HardwareSpec, InterconnectTier
from zrt_core.ir.graph import LayerTemplate, OpGraph

from .builders import make_toy, op_node, tensor


def _fabric(sharp: bool = True, nvls: float | None = 0.4) -> HardwareSpec:
    return evolve(make_toy(), interconnect=[
        InterconnectTier(name="t0", bandwidth_gb_per_s=100, latency_us=1, devices=4,
                         efficiency=0.5, nvls_efficiency=nvls),
        InterconnectTier(name="t1", bandwidth_gb_per_s=10, latency_us=10, devices=None,
                         efficiency=1.0, sharp=sharp),
    ])


def test_nvls_all_reduce_inside_one_switch_wins_large_messages_only():
    hw = _fabric()
    big = collective_cost("all_reduce", 1e8, 4, 4, hw)
    # nvls: each device moves S each way at 4e10: 1e8 / 4e10 = 2.5e-3 + 25 us;
    # ring: 2*3/4 * 1e8 / 5e10 = 3e-3 + 2*3*1 us = 3.006e-3
    assert big.detail["algorithm"] == "nvls"
    assert big.time_s == pytest.approx(2.525e-3, rel=1e-12)
    assert big.detail["candidates_s"]["ring"] == pytest.approx(3.006e-3, rel=1e-12)
    small = collective_cost("all_reduce", 1e4, 4, 4, hw)
    # ring 3e-7 + 6e-6 = 6.3e-6 beats nvls 2.5e-7 + 25e-6: NVLS's start-up loses small ones
    assert small.detail["algorithm"] == "ring"
    assert small.time_s == pytest.approx(6.3e-6, rel=1e-12)
    assert small.detail["candidates_s"]["nvls"] == pytest.approx(25.25e-6, rel=1e-12)


def test_nvls_all_gather_moves_the_ring_bytes_at_the_nvls_rate():
    hw = _fabric()
    cost = collective_cost("all_gather", 1.6e8, 4, 4, hw, algorithm="nvls")
    # 3/4 * 1.6e8 / 4e10 = 3e-3 + 25 us; the ring (2.4e-3 + 3 us) is picked unforced
    assert cost.rule == "nvls_all_gather"
    assert cost.time_s == pytest.approx(3.025e-3, rel=1e-12)
    assert collective_cost("all_gather", 1.6e8, 4, 4, hw).detail["algorithm"] == "ring"


def test_nvls_with_sharp_across_the_network():
    cost = collective_cost("all_reduce", 1e8, 16, 16, _fabric())
    # nvls + SHARP: max(1e8 / 4e10, (1e8 / 4 per NIC) / 1e10) = 2.5e-3 + (25 + 18) us
    assert cost.detail["algorithm"] == "nvls"
    assert cost.time_s == pytest.approx(2.543e-3, rel=1e-12)
    c = cost.detail["candidates_s"]
    # ring: min(5e10, 4 * 1e10) = 4e10; 2*15/16 * 1e8 / 4e10 = 4.6875e-3;
    # steps 2*(16-4)*1 + 2*(4-1)*10 = 84 us
    assert c["ring"] == pytest.approx(4.7715e-3, rel=1e-12)
    # nvls_tree across r = 4 domains (f = 2): 2e8 / (0.9 * 4 * 1e10) = 5.5556e-3
    # + 25 us + 2 * log2(4) * 10 us = 65 us
    assert c["nvls_tree"] == pytest.approx(2e8 / 3.6e10 + 65e-6, rel=1e-12)
    # collnet: inner reduce-scatter + all-gather 2*3/4 * 1e8 / 5e10 = 3e-3 against SHARP's
    # 2.5e-3; latency 2*(1 + 0.4*3) us + 31 us = 35.4 us
    assert c["collnet"] == pytest.approx(3.0354e-3, rel=1e-12)


def test_nvls_tree_between_two_domains_halves_the_tree_traffic():
    hw = _fabric(sharp=False)
    cost = collective_cost("all_reduce", 1e8, 8, 8, hw)
    # two domains: each the root of one tree and a leaf of the other (f = 1):
    # max(1e8 / 4e10, 1e8 / (0.9 * 4 * 1e10)) = 2.7778e-3 + 25 us + 2*1*10 us
    assert cost.detail["algorithm"] == "nvls_tree"
    assert cost.time_s == pytest.approx(1e8 / 3.6e10 + 45e-6, rel=1e-12)
    # ring: 2*7/8 * 1e8 / 4e10 = 4.375e-3 + 2*(8-2)*1 + 2*(2-1)*10 = 32 us
    assert cost.detail["candidates_s"]["ring"] == pytest.approx(4.407e-3, rel=1e-12)
    assert "nvls" not in cost.detail["candidates_s"]
    assert "collnet" not in cost.detail["candidates_s"]
    with pytest.raises(CostError, match="sharp"):
        collective_cost("all_reduce", 1e8, 8, 8, hw, algorithm="nvls")


def test_strided_group_uses_sharp_alone():
    # one member per t0 domain (dp over 4 nodes): NVLS cannot help, SHARP (CollNet) can:
    # 1e8 / 1e10 = 1e-2 + 31 us against the ring's 2*3/4 * 1e8 / 1e10 = 1.5e-2 + 60 us
    cost = collective_cost("all_reduce", 1e8, 4, 16, _fabric())
    assert cost.detail["algorithm"] == "collnet"
    assert cost.time_s == pytest.approx(1.0031e-2, rel=1e-12)
    assert "nvls" not in cost.detail["candidates_s"]


def test_without_in_network_hardware_nothing_changes(toy):
    cost = collective_cost("all_reduce", 1e8, 64, 64, toy)
    assert set(cost.detail["candidates_s"]) == {"ring", "tree", "hierarchical"}
    with pytest.raises(CostError, match="no nvls_efficiency"):
        collective_cost("all_reduce", 1e8, 4, 4, toy, algorithm="nvls")
    with pytest.raises(CostError, match="no sharp"):
        collective_cost("all_reduce", 1e8, 64, 64, toy, algorithm="collnet")


def test_pack_fields_parse_and_reject_bad_values(toy_yaml):
    import yaml

    data = yaml.safe_load(toy_yaml)
    data["interconnect"][0]["nvls_efficiency"] = 0.6
    data["interconnect"][1]["sharp"] = True
    spec = HardwareSpec.from_mapping(data)
    assert spec.interconnect[0].nvls_efficiency == 0.6
    assert (spec.interconnect[0].sharp, spec.interconnect[1].sharp) == (False, True)
    data["interconnect"][1]["sharp"] = "yes"
    with pytest.raises(SpecError, match=r"interconnect\[1\].sharp must be true or false"):
        HardwareSpec.from_mapping(data)
    data["interconnect"][1]["sharp"] = False
    data["interconnect"][0]["nvls_efficiency"] = 1.5
    with pytest.raises(SpecError, match=r"nvls_efficiency must be <= 1.0"):
        HardwareSpec.from_mapping(data)


def test_collective_table_names_the_algorithm_per_group():
    hw = _fabric()
    t = tensor(1024)
    nodes = [op_node("comm.all_reduce", "collective", [t], [t], layer_index=0, group="tp",
                     collective="all_reduce", group_size=4, span=4, bytes=1e8),
             op_node("comm.all_reduce", "collective", [t], [t], group="tp",
                     collective="all_reduce", group_size=4, span=4, bytes=1e4),
             op_node("comm.all_reduce", "collective", [t], [t], group="dp",
                     collective="all_reduce", group_size=1, span=1, bytes=1e8)]
    graph = OpGraph(phase="train_forward", nodes=nodes,
                    templates={0: LayerTemplate(kind="dense", representative=0,
                                                indices=(0, 1, 2))})
    costs = {n.id: collective_cost("all_reduce", n.attrs["bytes"], n.attrs["group_size"],
                                   n.attrs["span"], hw) for n in nodes}
    table = collective_table([("forward", graph, costs)])
    # the layer's all-reduce runs 3 times (nvls, 2.525e-3 each), the other once (ring,
    # 6.3e-6); the one-rank dp group exchanges nothing and is left out
    assert list(table) == ["forward/tp/all_reduce"]
    row = table["forward/tp/all_reduce"]
    assert (row["calls"], row["algorithms"], row["algorithm"]) == (4, {"nvls": 3, "ring": 1},
                                                                   "nvls")
    assert row["bytes"] == pytest.approx(3e8 + 1e4)
    assert row["time_s"] == pytest.approx(3 * 2.525e-3 + 6.3e-6, rel=1e-12)


@pytest.mark.needs("zrt-nvidia")
def test_h100_all_reduce_reaches_the_published_nvls_bus_bandwidth():
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager()
    h100 = host.hardware_spec("h100")
    cost = collective_cost("all_reduce", 2**30, 8, 8, h100)
    # 2^30 / (450e9 * 0.61) = 3.91163e-3 + 25 us = 3.93663e-3; nccl-tests busBw
    # 2*7/8 * 2^30 / 3.93663e-3 = 477 GB/s (published ~480); the ring: 360 GB/s
    assert cost.detail["algorithm"] == "nvls"
    assert cost.time_s == pytest.approx(2**30 / 274.5e9 + 25e-6, rel=1e-12)
    assert 1.75 * 2**30 / cost.time_s / 1e9 == pytest.approx(477.3, abs=0.1)
    a100 = host.hardware_spec("a100")  # NVSwitch gen 2: no NVLink SHARP
    assert collective_cost("all_reduce", 2**30, 8, 8, a100).detail["algorithm"] == "ring"


def test_runs_without_nvls_drop_it_from_the_fabric():
    from zrt_core.estimate.engine import engine_profile

    hw = _fabric()
    off = hw.without_in_network(nvls=True, sharp=False)
    assert (off.interconnect[0].nvls_efficiency, off.interconnect[1].sharp) == (None, True)
    assert hw.without_in_network(nvls=False, sharp=False) is hw
    # the serving engines run their own all-reduce kernels: the ring of the first test,
    # 2*3/4 * 1e8 / 5e10 + 6 us
    served = engine_profile("trtllm").hardware(hw)
    cost = collective_cost("all_reduce", 1e8, 4, 4, served)
    assert (cost.detail["algorithm"], cost.time_s) == ("ring", pytest.approx(3.006e-3))


def test_megatron_bridge_records_run_with_nvls_off():
    from zrt_core.estimate.training import case_from_record

    record = {"id": "x", "workload": "train", "model": {"name": "m", "hf_config": {
        "model_type": "gpt2"}}, "hardware": "nvidia_h100_sxm", "num_gpus": 8, "seq_len": 64,
        "global_batch": 8, "parallel": {"tp": 1, "pp": 1, "dp": 8}, "notes": ""}
    bridge = case_from_record({**record, "source": "NVIDIA Megatron-Bridge performance "
                                                   "summary"})
    assert bridge.nvls is False
    assert any("NCCL_NVLS_ENABLE=0" in a for a in bridge.assumptions)
    assert case_from_record({**record, "source": "NVIDIA Megatron-LM README"}).nvls is True
