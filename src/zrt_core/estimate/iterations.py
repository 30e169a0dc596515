"""One serving iteration's parts and the steady state's scheduling rules: time by role
(attention, head, the rest), the routed experts' share, the prompt tokens an iteration
admits, the admission bound, and the attention-DP iteration (docs/inference-model.md)."""

from __future__ import annotations

import re

from zrt_core.cost.pricing import CostedGraph
from zrt_core.ir.graph import Category
from zrt_core.transforms.parallel import op_base


def roles(costed: list[CostedGraph], pp: int) -> list[dict[str, float]]:
    """Per stage, time split into attention (and the cache writes feeding it), the head
    (what runs after the last layer) and the body (the rest)."""
    out = []
    for c in costed:
        g = c.graph
        layer_pos = [i for i, n in enumerate(g.nodes) if n.layer_index is not None]
        last = layer_pos[-1] if layer_pos else -1
        attn = head = rest = 0.0
        for i, n in enumerate(g.nodes):
            t = c.cost(n).time_s * g.multiplicity(n)
            if n.category == Category.ATTENTION or op_base(n.op) == "kv_cache_write":
                attn += t
            elif n.layer_index is None and i > last and not (
                    n.category == Category.COLLECTIVE and n.attrs.get("group") == "pp"):
                head += t
            else:
                rest += t
        out.append({"attention": attn, "head": head, "body": rest})
    del pp
    return out


#: A routed expert's module (``mlp.experts``, ``feed_forward.experts``,
#: ``block_sparse_moe.experts``), not a shared expert's (``shared_experts``).
_ROUTED_EXPERTS = re.compile(r"(^|\.)experts(\.|$)")


def routed_expert_s(costed: CostedGraph) -> float:
    """Time of one stage's routed-expert nodes (grouped GEMMs, their activation, dispatch,
    combine and all-to-alls): what the expert group shares under attention DP."""
    g = costed.graph
    return sum(costed.cost(n).time_s * g.multiplicity(n) for n in g.nodes
               if n.module_path and _ROUTED_EXPERTS.search(n.module_path))


def prompt_chunk(c: int, budget_tokens: int, isl: int, chunked: bool) -> int:
    """Prompt tokens a mixed iteration admits beside ``c`` decoding sequences: whole
    prompts only without chunked prefill (the rest of the budget idles), a prompt split
    across iterations when it is longer than the free budget or chunking is on."""
    free = max(budget_tokens - c, 1)
    if free >= isl and not chunked:
        return (free // isl) * isl
    return min(free, c * isl)


def admission_limited(c: int, budget_tokens: int, isl: int, osl: int, chunked: bool) -> int:
    """The most sequences, at most ``c``, that stay busy in steady state: a sequence lives
    ``osl`` iterations and its prompt takes ``isl`` of the prompt tokens the iterations
    admit (:func:`prompt_chunk`), so ``n × isl ≤ osl × chunk(n)`` (fixed-length
    requests: the slots a finished wave frees are refilled no faster than that). A
    TensorRT-LLM run without chunked context on a long prompt and a short output (2048/128
    on one H200: 3584 tokens a step admit one prompt each iteration, so ~128 sequences run,
    not the 193 the KV cache holds) is bounded by it; otherwise it returns ``c``."""
    if c * isl <= osl * prompt_chunk(c, budget_tokens, isl, chunked):
        return c
    lo, hi = 1, c  # chunk(n) grows as n falls: the largest n that satisfies it
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * isl <= osl * prompt_chunk(mid, budget_tokens, isl, chunked):
            lo = mid
        else:
            hi = mid - 1
    return lo


def attention_dp_iteration(*, t_gen: float, t_mix: float, routed_gen: float, routed_mix: float,
                           n_mixed: float, osl: int, ranks: int) -> dict[str, float]:
    """The mean iteration under attention data parallelism, where the ranks run their own
    requests but meet at every MoE layer: an iteration lasts as long as its slowest rank's
    attention module ("the iteration time is dominated by the slowest rank", TensorRT-LLM
    tech blog 10, *ADP Balance Strategy*), so a prompt on any one of the ``ranks`` slows
    all of them, while the routed experts' extra rows are shared over the expert group. A
    rank carries a prompt in ``p = n_mixed / osl`` of its iterations, placed independently
    of the other ranks' (the default round-robin scheduler, without
    ``attention_dp_config.enable_balance``), so some rank does in ``q = 1 − (1 − p)^ranks``
    of them:

        iteration = t_gen + q · Δ_attention + p · Δ_experts

    with Δ = ``t_mix − t_gen`` the mixed iteration's extra time over the decode iteration,
    split into its routed-expert part (``routed_mix − routed_gen``: the ``experts`` modules'
    grouped GEMMs, dispatch and combine) and the rest.
    """
    delta = max(t_mix - t_gen, 0.0)
    experts = min(max(routed_mix - routed_gen, 0.0), delta)
    rank = n_mixed / osl
    anyone = 1.0 - (1.0 - rank) ** ranks
    return {"rank_mixed_fraction": rank, "any_rank_mixed_fraction": anyone,
            "delta_attention_s": delta - experts, "delta_experts_s": experts,
            "iteration_s": t_gen + anyone * (delta - experts) + rank * experts}
