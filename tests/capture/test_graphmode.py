"""Graph mode (torch.compile → AOTAutograd aten graphs) against eager capture on tiny
configs: same FLOPs and bytes within 1%. Compiling costs seconds per family, so the test
covers one dense, one grouped-GEMM MoE and one MLA+MoE family; benchmarks/bench_graphmode.py
--families compares every bundled family (docs/graph-mode.md)."""

from __future__ import annotations

import pytest

from zrt_core.capture.graphmode import CompileError, module_path
from zrt_core.ir.graph import Phase

TOLERANCE = 0.01


def _totals(result):
    return {phase: g.totals() for phase, g in result.graphs.items()}


#: dense attention+MLP; MoE through the grouped-GEMM experts patch (group_rows annotations
#: must survive Dynamo); DeepSeek-V3's MLA and routed experts
FAMILIES = ("llama", "qwen3_moe", "deepseek_v3")


@pytest.mark.parametrize("family", FAMILIES)
def test_graph_mode_matches_eager_flops_and_bytes(captured, family):
    eager = captured(family)
    graph = captured(family, graph_mode=True)
    assert list(graph.graphs) == list(Phase.CAPTURED)
    for phase, e in _totals(eager).items():
        g = graph.graphs[phase].totals()
        assert g.flops == pytest.approx(e.flops, rel=TOLERANCE), phase
        assert g.bytes == pytest.approx(e.bytes, rel=TOLERANCE), phase
    assert graph.graphs[Phase.PREFILL].meta["capture_mode"] == "graph"
    assert eager.graphs[Phase.PREFILL].meta["capture_mode"] == "eager"


def test_graph_mode_keeps_layer_attribution(captured):
    graph = captured("llama", graph_mode=True)
    eager = captured("llama")
    def layers(result, phase):
        return {(n.layer_index, n.module_class) for n in result.graphs[phase].nodes
                if n.layer_index is not None and not n.zero_cost}

    for phase in Phase.CAPTURED:
        # every module that runs ops inside a decoder layer in eager mode does so in graph
        # mode too: modules are read from nn_module_stack (fwd_nn_module_stack in backward)
        assert layers(graph, phase) == layers(eager, phase), phase


def test_untraceable_model_is_one_line_pointing_to_eager(host, tiny, monkeypatch):
    # a model whose norm calls importlib at run time: Dynamo skips importlib, so under
    # fullgraph=True the trace fails (what the DeepSeek MLA patch did before it read
    # sys.modules); the capture says so in one line and names eager mode
    import importlib

    from transformers.models.llama import modeling_llama

    from zrt_core.capture.api import capture

    original = modeling_llama.LlamaRMSNorm.forward

    def forward(self, hidden_states):
        importlib.import_module("math")
        return original(self, hidden_states)

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)
    with pytest.raises(CompileError) as info:
        capture(tiny["llama"], phases=["prefill"], batch=1, seq_len=8, host=host,
                graph_mode=True)
    text = str(info.value)
    assert "\n" not in text and text.endswith("capture in eager mode (drop --graph-mode)")
    assert "torch.compile cannot trace prefill" in text and "import_module" in text
    assert info.value.exit_code == 2


def test_module_path_from_dynamo_sources():
    assert module_path("L['self'].model.layers[0].mlp") == "model.layers.0.mlp"
    assert module_path("L['args'][0]._modules['lm_head']") == "lm_head"


def _nodes(result) -> dict[str, tuple]:
    """Every node of every phase as JSON (operator, module, layer, FLOPs, bytes, shapes,
    tensor ids, attributes) and the edges; the autograd ``seq_nr`` counts from its phase's
    first (its absolute value depends on what the process traced before)."""
    out = {}
    for phase, g in result.graphs.items():
        nodes = [n.to_json() for n in g.nodes]
        seqs = [a[k] for n in nodes for a in [n.get("attrs", {})]
                for k in ("seq_nr", "fwd_seq_nr") if isinstance(a.get(k), int)]
        for n in nodes:
            for k in ("seq_nr", "fwd_seq_nr"):
                if k in n.get("attrs", {}):
                    n["attrs"][k] -= min(seqs)
        out[phase] = (nodes, g.edges, [t.to_json() for t in g.templates.values()])
    return out


def test_skipping_guards_leaves_every_node_as_it_was(captured, host, tiny, monkeypatch):
    # graph mode builds no Dynamo guards and resets Dynamo before each phase
    # (graphmode_lean.SKIP_GUARDS): the graphs of all four phases, layer templates applied,
    # are the ones the guarded compile records, node for node; a decode that reused
    # prefill's unguarded code would differ in every shape
    from zrt_core.capture import graphmode_lean
    from zrt_core.capture.api import capture

    lean = captured("deepseek_v3", graph_mode=True)
    monkeypatch.setattr(graphmode_lean, "SKIP_GUARDS", False)
    guarded = capture(tiny["deepseek_v3"], host=host, batch=2, seq_len=16, graph_mode=True)
    assert lean.graphs[Phase.PREFILL].templates  # the templates apply
    assert list(_nodes(lean)) == list(Phase.CAPTURED)
    assert _nodes(lean) == _nodes(guarded)
