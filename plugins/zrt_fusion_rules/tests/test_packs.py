"""The cuda, ascend and generic packs load, reach the host through the hook, and every rule
fuses something in a small captured model of the families they target (no dead rules)."""

from __future__ import annotations

from typing import Any

import pytest
from zrt_fusion_rules.plugin import RULES_DIR, load_packs

from zrt_core.ir.graph import OpGraph
from zrt_core.plugins import get_plugin_manager
from zrt_core.transforms.fusion import PLATFORMS, FusionRulePack, fuse, packs_for_platform

_LLAMA_LIKE = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)

#: Tiny configs (hidden 128, 3 layers) of the families the packs are written for.
TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", **_LLAMA_LIKE),
    "gpt2": dict(model_type="gpt2", n_embd=128, n_layer=3, n_head=4, vocab_size=512,
                 n_positions=256, bos_token_id=0, eos_token_id=0),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                      moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, num_experts=8,
                      num_experts_per_tok=2, vocab_size=512, mlp_only_layers=[0]),
    "gemma2": dict(model_type="gemma2", head_dim=32, sliding_window=8, **_LLAMA_LIKE),
    # group-limited routing: pointwise masks and casts around the router's top-k
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
                        moe_intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                        num_experts_per_tok=2, n_group=2, topk_group=1,
                        n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                        q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32,
                        v_head_dim=32, vocab_size=512),
}


@pytest.fixture(scope="module")
def packs() -> list[FusionRulePack]:
    return load_packs()


@pytest.fixture(scope="module")
def graphs() -> dict[str, dict[str, OpGraph]]:
    """Every phase of every tiny model (batch 2, 16 tokens), captured with the core only."""
    from zrt_core.capture.api import capture

    host = get_plugin_manager(autoload=False)
    return {family: dict(capture(config, host=host, batch=2, seq_len=16).graphs)
            for family, config in TINY.items()}


def fused_counts(graph: OpGraph) -> dict[str, int]:
    return dict(graph.meta.get("fusion", {}).get("fused", {}))


def test_one_pack_per_platform_with_unique_rule_names(packs):
    assert sorted(RULES_DIR.glob("*.yaml")) and [p.name for p in packs] == [
        "ascend", "cuda", "generic"]
    assert {p.platform for p in packs} == set(PLATFORMS)
    for p in packs:
        assert p.source.endswith(f"{p.name}.yaml")
        for rule in p.rules:
            assert rule.kernel and rule.reference, f"{p.name}/{rule.name}"
    ascend = next(p for p in packs if p.name == "ascend")
    assert all(r.kernel.startswith("torch_npu.") for r in ascend.rules)


def test_the_hook_contributes_the_packs_to_the_host():
    host = get_plugin_manager()
    assert {"ascend", "cuda", "generic"} <= set(host.fusion_rules.keys())
    for name in ("ascend", "cuda", "generic"):
        assert host.fusion_rules.distribution_of(name) == "zrt-fusion-rules"


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_rule_of_a_platform_fuses_something(packs, graphs, platform):
    chosen = packs_for_platform(platform, packs)
    used: set[str] = set()
    for phases in graphs.values():
        for graph in phases.values():
            used.update(fused_counts(fuse(graph, chosen)))
    own = {f"{p.name}/{r.name}" for p in chosen if p.platform == platform for r in p.rules}
    assert own - used == set()


def test_router_ops_stay_router_kernels_on_every_platform(packs, graphs):
    """The capture marks a router's ops moe_router; whatever each platform fuses of them
    (its router kernel, the generic pointwise rule for the rest) keeps that category."""
    for platform in PLATFORMS:
        chosen = packs_for_platform(platform, packs)
        for phase, graph in graphs["deepseek_v3"].items():
            fused = fuse(graph, chosen)
            router = [n for n in fused.nodes if n.module_class.endswith("Router")
                      and not n.zero_cost]
            assert router, (platform, phase)
            gemm = [n for n in router if n.category == "matmul"]
            assert gemm and all(n.op == "aten.mm.default" for n in gemm)
            assert {n.category for n in router} == {"matmul", "moe_router"}, (platform, phase)
        counts = fused_counts(fuse(graphs["deepseek_v3"]["prefill"], chosen))
        assert counts.get("generic/router_pointwise", 0) >= 1, platform


def test_llama_on_cuda(packs, graphs):
    cuda = packs_for_platform("cuda", packs)
    llama = graphs["llama"]
    # one template layer: input norm, attention (q and k RoPE), post-attention norm (with
    # the residual add when serving), MLP; then the final norm; the rotary cos/sin
    # computation is left to the generic pack
    assert fused_counts(fuse(llama["prefill"], cuda)) == {
        "cuda/rms_norm": 2, "cuda/rotary_embedding": 2, "cuda/flash_attention": 1,
        "cuda/add_rms_norm": 1, "cuda/swiglu": 1, "generic/pointwise": 1}
    assert fused_counts(fuse(llama["decode"], cuda)) == {
        "cuda/rms_norm": 2, "cuda/rotary_embedding": 2, "cuda/flash_attention_kvcache": 1,
        "cuda/add_rms_norm": 1, "cuda/swiglu": 1, "generic/pointwise": 1}
    assert fused_counts(fuse(llama["train_forward"], cuda)) == {
        "cuda/rms_norm": 3, "cuda/rotary_embedding": 2, "cuda/flash_attention": 1,
        "cuda/swiglu": 1, "cuda/cross_entropy": 1, "generic/pointwise": 1}
    backward = fuse(llama["train_backward"], cuda)
    assert fused_counts(backward) == {
        "cuda/rms_norm_backward": 3, "cuda/rotary_embedding_backward": 2,
        "cuda/flash_attention_backward": 1, "cuda/swiglu_backward": 1,
        "cuda/cross_entropy_backward": 1}
    # 180 captured ops become 94; FLOPs are kept
    assert (len(llama["train_backward"].nodes), len(backward.nodes)) == (180, 94)
    assert backward.totals().flops == llama["train_backward"].totals().flops


def test_fused_add_rms_norm_bytes_on_cuda(packs, graphs):
    out = fuse(graphs["llama"]["prefill"], packs_for_platform("cuda", packs))
    (node,) = [n for n in out.nodes if n.attrs.get("fusion_rule") == "cuda/add_rms_norm"]
    assert node.attrs["kernel"] == "vLLM fused_add_rms_norm"
    # 32 tokens × 128 hidden bf16: read residual 8192 + attention output 8192 + weight 256
    # → 16640; write the new residual 8192 + the normalised 8192 → 16384
    assert (node.bytes_read, node.bytes_written) == (16640, 16384)


def test_attention_keeps_what_the_pricing_reads(packs, graphs):
    from zrt_core.cost.opdims import attention_dims, is_backward

    for platform in ("cuda", "ascend"):
        chosen = packs_for_platform(platform, packs)
        decode = fuse(graphs["llama"]["decode"], chosen)
        (attn,) = [n for n in decode.nodes if n.category == "attention"]
        dims = attention_dims(attn)
        # one new query over the 16 cached tokens and itself
        assert (dims.b, dims.h, dims.h_kv, dims.s_q, dims.s_kv, dims.d) == (2, 4, 2, 1, 17, 32)
        backward = fuse(graphs["llama"]["train_backward"], chosen)
        (grad,) = [n for n in backward.nodes if n.category == "attention"]
        assert is_backward(grad) and attention_dims(grad).s_kv == 16


@pytest.mark.parametrize("platform", PLATFORMS)
def test_packs_fuse_every_graph_once(packs, graphs, platform):
    chosen = packs_for_platform(platform, packs)
    for phases in graphs.values():
        for graph in phases.values():
            once = fuse(graph, chosen)
            assert fuse(once, chosen) is once
            assert once.totals().flops == graph.totals().flops
            assert once.totals().bytes <= graph.totals().bytes
            position = {n.id: i for i, n in enumerate(once.nodes)}
            assert all(position[a] < position[b] for a, b in once.edges)
