"""How long pricing a 30k-node graph takes (the budget is well under 100 ms).

Builds a synthetic full-depth training graph — 60 decoder layers of 500 nodes each (GEMMs,
fused attention, norms, elementwise, views, TP collectives), every node with its own ids,
module path and autograd sequence number as a capture would give — and prices it with the
installed backends (measured tables included where the hardware has them). A second run
makes every layer's shapes distinct, so no node shares a price: the worst case.

    python benchmarks/bench_cost.py [--hardware nvidia_h100_sxm] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from _bench import result

from zrt_core.cost.pricing import build_backends, node_price_key, price_graph
from zrt_core.ir.graph import LayerTemplate, OpGraph, OpNode, TensorMeta
from zrt_core.plugins import get_plugin_manager

LAYERS = 60
NODES_PER_LAYER = 500
TARGET_MS = 100.0


def _t(*shape: int, dtype: str = "bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype)


def synthetic_graph(*, distinct: bool) -> OpGraph:
    """``LAYERS × NODES_PER_LAYER`` nodes; ``distinct`` varies the token count per layer."""
    nodes: list[OpNode] = []
    nid = 0
    hidden, ffn, heads, d = 4096, 14336, 32, 128
    for layer in range(LAYERS):
        tokens = 4096 + (layer * 16 if distinct else 0)
        x, h = _t(tokens, hidden), _t(tokens, ffn)
        q = _t(1, heads, tokens, d)
        pattern = [
            ("aten.mm.default", "matmul", [x, _t(hidden, 3 * hidden)], [_t(tokens, 3 * hidden)],
             2 * tokens * hidden * 3 * hidden, {}),
            ("zrt.attention", "attention", [q, q, q], [q],
             4 * heads * tokens * tokens // 2 * d, {"is_causal": True}),
            ("aten.mm.default", "matmul", [x, _t(hidden, hidden)], [x],
             2 * tokens * hidden * hidden, {}),
            ("comm.all_reduce", "collective", [x], [x], 0,
             {"collective": "all_reduce", "group": "tp", "group_size": 8, "span": 8,
              "bytes": x.nbytes}),
            ("aten.rms_norm.default", "norm", [x], [x], 4 * tokens * hidden, {}),
            ("aten.mm.default", "matmul", [x, _t(hidden, ffn)], [h],
             2 * tokens * hidden * ffn, {}),
            ("aten.silu.default", "elementwise", [h], [h], tokens * ffn, {}),
            ("aten.mul.Tensor", "elementwise", [h, h], [h], tokens * ffn, {}),
            ("aten.mm.default", "matmul", [h, _t(ffn, hidden)], [x],
             2 * tokens * hidden * ffn, {}),
            ("aten.add.Tensor", "elementwise", [x, x], [x], tokens * hidden, {}),
            ("aten.view.default", "view", [x], [x], 0, {}),
            ("aten.t.default", "view", [x], [x], 0, {}),
        ]
        for i in range(NODES_PER_LAYER):
            op, cat, ins, outs, flops, attrs = pattern[i % len(pattern)]
            nid += 1
            nodes.append(OpNode(
                id=nid, op=op, category=cat, phase="train_forward", inputs=ins, outputs=outs,
                module_path=f"model.layers.{layer}.block{i}", layer_index=layer,
                flops=flops, bytes_read=sum(t.nbytes for t in ins),
                bytes_written=sum(t.nbytes for t in outs), formula=op,
                zero_cost=cat == "view", attrs={**attrs, "seq_nr": nid}))
    templates = [LayerTemplate("dense", i, (i,)) for i in range(LAYERS)]
    return OpGraph(phase="train_forward", nodes=nodes, templates=templates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", default="nvidia_h100_sxm")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    host = get_plugin_manager()
    hardware = host.hardware_spec(args.hardware)
    backends = build_backends(hardware, host)
    print(f"hardware {hardware.id}; backends {[b.name for b in backends]}")
    for distinct in (False, True):
        graph = synthetic_graph(distinct=distinct)
        keys = len({node_price_key(n) for n in graph.nodes})
        runs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            costed = price_graph(graph, hardware, host, backends=backends)
            runs.append(time.perf_counter() - start)
        best, median = min(runs), statistics.median(runs)
        label = "distinct shapes per layer" if distinct else "repeated layers"
        print(f"{label:26s} {len(graph.nodes)} nodes, {keys} distinct prices: "
              f"best {best * 1e3:.1f} ms, median {median * 1e3:.1f} ms "
              f"({median / len(graph.nodes) * 1e6:.2f} us/node); "
              f"serial time {costed.total_time_s * 1e3:.1f} ms")
        result(f"pricing {len(graph.nodes)} nodes, {label}", best * 1e3, TARGET_MS, "ms")


if __name__ == "__main__":
    main()
