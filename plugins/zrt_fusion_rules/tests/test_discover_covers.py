"""``zrt fusion discover`` on families whose rules ship: the draft covers every shipped rule
that fires on their eager graphs — each fused op lies in a drafted candidate marked covered
by that rule, and each shipped kernel inside one candidate is reproduced by the draft alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from zrt_fusion_rules.plugin import load_packs

from zrt_core.ir.graph import OpGraph, OpNode
from zrt_core.plugins import get_plugin_manager
from zrt_core.transforms.fusion import PLATFORMS, FusionRulePack, fuse, packs_for_platform
from zrt_core.transforms.fusion.discover import HEAVY, discover

_LLAMA_LIKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)

#: RMSNorm + RoPE + SwiGLU (llama), LayerNorm + GELU written out (gpt2), router, grouped
#: GEMMs and the MoE dispatch/combine (qwen3_moe); the loss in each.
TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_LLAMA_LIKE),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=512,
                 n_positions=256, bos_token_id=0, eos_token_id=0),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512, mlp_only_layers=[0]),
}

#: Shipped rules that join ops of two candidates: the residual add is the decoder layer's
#: own op and the norm its sub-module's, and the decoder layer holds over 30 ops, so no
#: drafted kernel spans both; their ops are marked covered instead.
SPANNING = {"cuda/add_rms_norm", "ascend/npu_add_rms_norm"}


@pytest.fixture(scope="module")
def packs() -> list[FusionRulePack]:
    return load_packs()


@pytest.fixture(scope="module")
def graphs() -> dict[str, dict[str, OpGraph]]:
    from zrt_core.capture.api import capture

    host = get_plugin_manager(autoload=False)
    return {family: dict(capture(config, host=host, batch=1, seq_len=16).graphs)
            for family, config in TINY.items()}


def _leaves(node: OpNode) -> list[OpNode]:
    if not node.fused_from:
        return [node]
    return [leaf for m in node.fused_from for leaf in _leaves(m)]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_draft_covers_every_shipped_rule(packs, graphs, platform):
    fired: set[str] = set()
    reproduced: set[str] = set()
    for family, phases in graphs.items():
        found = discover(phases, packs, platform, model=family)
        draft = found.pack(include_covered=True)  # every drafted rule, covered ones too
        for phase, graph in phases.items():
            candidate = {nid: c for c in found.candidates for g in c.groups
                         if g.phase == phase for nid in g.node_ids}
            group = {nid: g for c in found.candidates for g in c.groups
                     if g.phase == phase and not g.inside for nid in g.node_ids}
            drafted = [{m.id for m in _leaves(n)} for n in fuse(graph, [draft]).nodes
                       if n.fused_from]
            for node in fuse(graph, packs_for_platform(platform, packs)).nodes:
                if not node.fused_from:
                    continue
                rule = node.attrs["fusion_rule"]
                fired.add(rule)
                ops = [m for m in _leaves(node) if not m.zero_cost]
                where = (family, phase, rule)
                # marked: every op it fuses is in a candidate that names it
                for m in ops:
                    assert rule in candidate[m.id].covered_by, (*where, m.op)
                # reproduced: its ops other than GEMMs, when in one candidate, are fused
                # together by the drafted pack alone
                light = {m.id for m in ops if m.category not in HEAVY}
                if len({id(group[i]) for i in light}) > 1:
                    assert rule in SPANNING, where
                elif len(light) >= 2:
                    assert any(light <= d for d in drafted), where
                    reproduced.add(rule)
    own = {f"{p.name}/{r.name}" for p in packs for r in p.rules if p.platform == platform}
    assert own & fired, platform  # the families exercise the platform's own pack
    if platform == "cuda":
        # every shipped cuda rule fusing two or more non-GEMM ops here is reproduced; the
        # others fuse one op (attention, a grouped GEMM, native_layer_norm, the MoE
        # dispatch or combine: nothing for a draft to join) or span two candidates
        assert reproduced == {
            "cuda/cross_entropy", "cuda/cross_entropy_backward",
            "cuda/flash_attention_kvcache", "cuda/gelu", "cuda/gelu_backward",
            "cuda/moe_topk_softmax", "cuda/moe_topk_softmax_backward", "cuda/rms_norm",
            "cuda/rms_norm_backward", "cuda/rotary_embedding", "cuda/rotary_embedding_backward",
            "cuda/swiglu", "cuda/swiglu_backward", "generic/pointwise"}


def test_candidates_the_shipped_packs_fuse_are_commented_out(packs, graphs):
    found = discover(graphs["llama"], packs, "cuda", model="llama")
    status = {c.name: c.status for c in found.candidates}
    # the norm's eight ops are cuda/rms_norm, the MLP's silu·mul cuda/swiglu; the position
    # ids (arange + add) are fused by no shipped rule
    assert status["llama_rms_norm"] == status["llama_mlp"] == "covered"
    assert status["llama_model"] == "new"
    text = found.to_yaml()
    assert "  # - name: llama_rms_norm" in text and "  - name: llama_model" in text
    assert "llama_rms_norm" not in [r.name for r in found.pack().rules]
