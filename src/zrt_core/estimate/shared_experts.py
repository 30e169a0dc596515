"""Serving's shared experts on their own stream (``--moe-shared-expert-overlap``): the time
they hide under the routed path's EP all-to-all, from the multi-stream schedule."""

from __future__ import annotations

from zrt_core.cost.pricing import CostedGraph
from zrt_core.ir.graph import Category, OpGraph, OpNode
from zrt_core.transforms.parallel import replace_graph


def _is_shared(node: OpNode) -> bool:
    # DeepSeek-V2/V3 ``mlp.shared_experts``, Qwen2-MoE ``mlp.shared_expert`` (and its gate)
    return ".shared_expert" in (node.module_path or "")


def shared_experts_issued_early(graph: OpGraph) -> OpGraph:
    """``graph`` with each MoE layer's shared-expert kernels issued right after the layer's
    first EP collective (the dispatch), as an engine running them on a side stream issues
    them (SGLang's DeepSeek MoE under DeepEP, TensorRT-LLM's ``maybe_execute_in_parallel``
    on ``aux_stream``): with the EP collectives asynchronous, the compute stream runs them
    while the dispatch is in flight instead of after the combine. A layer without an EP
    collective or without shared experts keeps its order. Dependencies do not change: the
    shared experts read only the MoE layer's input, which precedes the dispatch."""
    nodes = list(graph.nodes)
    out: list[OpNode] = []
    i = 0
    while i < len(nodes):
        layer = nodes[i].layer_index
        j = i
        while j < len(nodes) and nodes[j].layer_index == layer:
            j += 1
        run = nodes[i:j]
        i = j
        shared = [n for n in run if _is_shared(n)]
        first_ep = next((k for k, n in enumerate(run) if n.category == Category.COLLECTIVE
                         and n.attrs.get("group") == "ep"), None)
        if layer is None or not shared or first_ep is None \
                or run.index(shared[0]) < first_ep:
            out.extend(run)
            continue
        rest = [n for n in run if not _is_shared(n)]
        cut = rest.index(run[first_ep]) + 1
        out.extend(rest[:cut] + shared + rest[cut:])
    return replace_graph(graph, nodes=out)


def hidden_shared_s(costed: CostedGraph) -> float:
    """The serial sum of a stage's kernels minus its schedule with the shared experts issued
    beside the dispatch and the EP collectives asynchronous (``OverlapRules.serving(
    ep_async=True)``): what the overlap saves per step, ``>= 0``."""
    from zrt_core.schedule.scheduler import OverlapRules, schedule_phase

    timeline = schedule_phase(shared_experts_issued_early(costed.graph), costed.costs,
                              OverlapRules.serving(ep_async=True))
    return max(0.0, costed.total_time_s - timeline.makespan_s)
