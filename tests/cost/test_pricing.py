"""price_graph: per-node backend selection by priority, the shape cache, totals, coverage."""

from __future__ import annotations

import pytest

from zrt_core import hookimpl
from zrt_core.cost.backend import CostBackendSpec, NodeCost, PriceSource
from zrt_core.cost.errors import CostError
from zrt_core.cost.measured import MeasuredTable
from zrt_core.cost.pricing import OUTSIDE_LAYERS, price_graph
from zrt_core.cost.roofline import RooflineBackend
from zrt_core.ir.graph import LayerTemplate, OpGraph
from zrt_core.plugins import get_plugin_manager

from .builders import mm_node, op_node, tensor


class FixedBackend:
    """Prices the categories it is given at a fixed time; counts its calls."""

    def __init__(self, name: str, times: dict[str, float], source: str) -> None:
        self.name, self.times, self.source, self.calls = name, times, source, 0

    def price(self, node):
        self.calls += 1
        t = self.times.get(node.category)
        if t is None:
            return None
        return NodeCost(time_s=t, backend=self.name, rule="fixed", source=self.source)


@pytest.fixture
def graph() -> OpGraph:
    x = tensor(1024, 1024)
    nodes = [
        op_node("aten.embedding.default", "embedding", [x], [x]),
        mm_node(512, 512, 512, layer_index=0, seq_nr=1),
        op_node("aten.rms_norm.default", "norm", [x], [x], layer_index=0),
        op_node("aten.view.default", "view", [x], [x], layer_index=0),
        mm_node(512, 512, 512, layer_index=3, seq_nr=2),
    ]
    return OpGraph(phase="prefill", nodes=nodes,
                   templates=[LayerTemplate("dense", 0, (0, 1, 2)), LayerTemplate("moe", 3, (3,))])


@pytest.fixture
def host_with(toy):
    def make(*backends_and_priorities):
        class Plugin:
            @hookimpl
            def zrt_cost_backends(self):
                return [CostBackendSpec(name=b.name, factory=lambda hw, host, b=b: b, priority=p)
                        for b, p in backends_and_priorities]

        host = get_plugin_manager(autoload=False)
        host.register(Plugin(), name="fixed")
        return host

    return make


def test_each_node_goes_to_the_highest_priority_backend_that_prices_it(toy, graph, host_with):
    a = FixedBackend("a", {"matmul": 1e-3}, PriceSource.MEASURED)
    b = FixedBackend("b", {"matmul": 5.0, "norm": 2e-3}, PriceSource.INTERPOLATED)
    costed = price_graph(graph, toy, host_with((b, 5), (a, 10)))
    assert costed.backends == ("a", "b", "roofline")
    emb = graph.nodes[0]
    assert [costed.cost(n).backend for n in graph.nodes] == [
        "roofline", "a", "b", "roofline", "a"]
    # embedding: 2 * 2097152 bytes over 1e12 B/s + 2 us launch
    assert costed.cost(emb).time_s == pytest.approx(6.194304e-6, rel=1e-12)
    # dense layer x3: 3 * (1e-3 + 2e-3); moe layer x1: 1e-3
    assert costed.total_time_s == pytest.approx(6.194304e-6 + 9e-3 + 1e-3, rel=1e-12)
    assert dict(costed.time_by_layer_kind) == pytest.approx(
        {OUTSIDE_LAYERS: 6.194304e-6, "dense": 9e-3, "moe": 1e-3}, rel=1e-12)
    assert dict(costed.time_by_category) == pytest.approx(
        {"embedding": 6.194304e-6, "matmul": 4e-3, "norm": 6e-3, "view": 0.0}, rel=1e-12)
    assert dict(costed.time_by_backend) == pytest.approx(
        {"roofline": 6.194304e-6, "a": 4e-3, "b": 6e-3}, rel=1e-12)


def test_coverage_counts_executed_ops_and_time(toy, graph, host_with):
    a = FixedBackend("a", {"matmul": 1e-3}, PriceSource.MEASURED)
    b = FixedBackend("b", {"norm": 2e-3}, PriceSource.INTERPOLATED)
    cov = price_graph(graph, toy, host_with((a, 10), (b, 5))).coverage
    # executed ops: embedding 1 (roofline), matmul 3 + 1 (measured), norm 3 (interpolated),
    # view 3 (free): 11 in all
    assert dict(cov.ops) == pytest.approx(
        {"measured": 4 / 11, "interpolated": 3 / 11, "roofline": 1 / 11, "free": 3 / 11})
    total = 6.194304e-6 + 1e-2
    assert dict(cov.time) == pytest.approx(
        {"measured": 4e-3 / total, "interpolated": 6e-3 / total,
         "roofline": 6.194304e-6 / total, "free": 0.0}, rel=1e-12)


def test_identical_nodes_are_priced_once(toy, graph):
    a = FixedBackend("a", {"matmul": 1e-3}, PriceSource.MEASURED)
    price_graph(graph, toy, None, backends=[a, RooflineBackend(toy)])
    # five nodes, two of them the same 512^3 GEMM (different layer and seq_nr): 4 prices
    assert a.calls == 4


def test_measured_tables_from_plugins_price_what_they_cover(toy, tmp_path):
    path = tmp_path / "toy_gemm.csv"
    path.write_text("hardware_id,op,dtype,m,n,k,time_us,source\n"
                    "toy,gemm,bfloat16,512,512,512,9.5,test\n", encoding="utf-8")

    class Tables:
        @hookimpl
        def zrt_measured_tables(self):
            return [MeasuredTable(name="toy/gemm", hardware_id="toy", path=str(path))]

    host = get_plugin_manager(autoload=False)
    host.register(Tables(), name="tables")
    x = tensor(64, 64)
    graph = OpGraph(phase="prefill",
                    nodes=[mm_node(512, 512, 512), op_node("aten.add.Tensor", "elementwise",
                                                           [x, x], [x])])
    costed = price_graph(graph, toy, host)
    assert costed.backends == ("measured", "roofline")
    assert [costed.cost(n).source for n in graph.nodes] == ["measured", "roofline"]
    assert costed.cost(graph.nodes[0]).time_s == pytest.approx(9.5e-6)
    assert costed.coverage.ops["measured"] == 0.5


def test_a_node_no_backend_prices_is_an_error(toy, graph):
    with pytest.raises(CostError, match=r"no cost backend priced node \d+ \(aten.embedding"):
        price_graph(graph, toy, None, backends=[])


def test_without_host_or_backends_is_an_error(toy, graph):
    with pytest.raises(CostError, match="needs a plugin host or a list of backends"):
        price_graph(graph, toy, None)


def test_the_core_registers_measured_above_roofline():
    specs = {s.name: s.priority for s in get_plugin_manager(autoload=False).cost_backends}
    assert specs == {"measured": 100, "roofline": -1000}
