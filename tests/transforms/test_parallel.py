"""Parallel transforms on tiny captured llama / gpt2 / qwen3-moe graphs: exact per-rank
shapes, FLOPs and bytes, and the collectives each layout inserts with their bytes.

Shapes: llama has hidden 128, 4 heads of 32 (2 KV heads), FFN 256, vocab 512; captures run
batch 2 × 16 tokens (32 tokens), bf16 (2 bytes). Causal attention over 16 tokens sees
16·17/2 = 136 (query, key) pairs per head.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.errors import LayoutError
from zrt_core.ir.graph import Category, OpGraph, OpNode
from zrt_core.modelinfo import ModelDims
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec, check_layout
from zrt_core.transforms.base import TransformContext
from zrt_core.transforms.parallel import (
    ParallelTransform,
    PipelinePlan,
    TPPlan,
    apply_phases,
    boundary_bytes,
    stage_graph,
    view_groups,
)

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
GPT2 = dict(model_type="gpt2", n_embd=128, n_layer=2, n_head=4, vocab_size=512,
            n_positions=64, bos_token_id=0, eos_token_id=0)
QWEN3_MOE = dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256,
                 moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                 vocab_size=512, mlp_only_layers=[0])

OPT = dict(model_type="opt", hidden_size=128, ffn_dim=256, num_hidden_layers=2,
           num_attention_heads=4, vocab_size=512, word_embed_proj_dim=128,
           max_position_embeddings=256, pad_token_id=1, bos_token_id=0, eos_token_id=0)
BLOOM = dict(model_type="bloom", hidden_size=128, n_layer=2, n_head=4, vocab_size=512)
MIXTRAL = dict(LLAMA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
QWEN2 = dict(LLAMA, model_type="qwen2")
DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
                   moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                   topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                   kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32,
                   v_head_dim=32, vocab_size=512)

_CAPTURES: dict[tuple, Any] = {}


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager(autoload=False)


@pytest.fixture(scope="module")
def captured(host):
    from zrt_core.capture.api import capture

    def run(config: dict[str, Any], phases: tuple[str, ...]) -> Any:
        key = (repr(sorted(config.items())), phases)
        if key not in _CAPTURES:
            _CAPTURES[key] = capture(config, phases=phases, batch=2, seq_len=16, host=host)
        return _CAPTURES[key]

    return run


def _ctx(host, result, parallel: Parallel, train: TrainSpec | None = None) -> TransformContext:
    layout = check_layout(parallel, result.dims, train=train)
    return TransformContext(dims=result.dims, hardware=_toy_hardware(), parallel=layout,
                            host=host, train=train)


def _toy_hardware():
    from zrt_core.hardware import HardwareSpec

    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "toy", "vendor": "toy",
        "compute": {"fp32": 10, "bf16": 80, "fp16": 80},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": 8}, {"name": "net", "bandwidth_gb_per_s": 25,
                                          "latency_us": 5, "devices": None}]})


def _layer0(g: OpGraph, module: str, op: str = "aten.mm.default") -> OpNode:
    return next(n for n in g.nodes if n.layer_index == 0 and n.module_path.endswith(module)
                and n.op == op)


def _collectives(g: OpGraph, kind: str | None = None) -> list[OpNode]:
    return [n for n in g.nodes if n.category == Category.COLLECTIVE
            and (kind is None or n.attrs["collective"] == kind)]


def _matmul_flops(g: OpGraph) -> int:
    return sum(n.flops * g.multiplicity(n) for n in g.nodes if n.category == Category.MATMUL)


def _check_structure(g: OpGraph) -> None:
    ids = [n.id for n in g.nodes]
    assert len(ids) == len(set(ids)), "node ids must stay unique"
    position = {i: k for k, i in enumerate(ids)}
    for a, b in g.edges:
        assert a in position and b in position
        assert position[a] < position[b], f"edge {a}->{b} points backwards"


# -- tensor parallelism ----------------------------------------------------------------------


def test_tp2_llama_prefill_per_rank_shapes_flops_and_collectives(host, captured):
    r = captured(LLAMA, ("prefill", "decode"))
    out = apply_phases(r.graphs, _ctx(host, r, Parallel(tp=2)))
    g, g0 = out["prefill"], r.graphs["prefill"]
    _check_structure(g)
    q = _layer0(g, "q_proj")
    # 32 tokens x 128 in, q_proj's 128 outputs split in two: 2*32*128*64 = 524288
    assert [t.shape for t in q.inputs] == [(32, 128), (128, 64)]
    assert q.flops == 524_288
    k = _layer0(g, "k_proj")
    # 2 KV heads of 32 split in two: 2*32*128*32 = 262144
    assert k.outputs[0].shape == (32, 32) and k.flops == 262_144
    down = _layer0(g, "down_proj")
    # row-parallel: 256/2 = 128 inputs per rank: 2*32*128*128 = 1048576
    assert [t.shape for t in down.inputs] == [(32, 128), (128, 128)]
    attn = _layer0(g, "self_attn", "zrt.attention.default")
    # 2 of 4 heads, 1 of 2 KV heads: 2 * b2 * h2 * 136 pairs * (32 + 32) = 69632
    assert [t.shape for t in attn.inputs] == [(2, 2, 16, 32), (2, 1, 16, 32), (2, 1, 16, 32)]
    assert attn.flops == 69_632
    # every matmul's work halves exactly: sum per rank x tp == unsharded
    assert _matmul_flops(g) * 2 == _matmul_flops(g0)

    reduces = _collectives(g, "all_reduce")
    in_layer = [n for n in reduces if n.layer_index == 0]
    # after o_proj and after down_proj, each 32 tokens x 128 x 2 bytes = 8192
    assert [n.attrs["bytes"] for n in in_layer] == [8192, 8192]
    assert [n.module_path for n in in_layer] == ["model.layers.0.self_attn.o_proj",
                                                 "model.layers.0.mlp.down_proj"]
    # the vocabulary-parallel embedding's partial sums, once, outside the layers
    embed = [n for n in reduces if n.layer_index is None]
    assert [(n.module_path, n.attrs["bytes"]) for n in embed] == [("model.embed_tokens", 8192)]
    for n in reduces:
        assert (n.attrs["group"], n.attrs["group_size"], n.attrs["span"]) == ("tp", 2, 2)
    # serving gathers the last token's logits: 2 x 512 x 2 bytes = 2048
    gathers = _collectives(g, "all_gather")
    assert [(n.module_path, n.attrs["bytes"]) for n in gathers] == [("lm_head", 2048)]


def test_tp2_llama_decode_shards_the_kv_cache_it_carries(host, captured):
    r = captured(LLAMA, ("prefill", "decode"))
    ctx = _ctx(host, r, Parallel(tp=2))
    for shared in (True, False):  # with prefill's layouts, and alone (cat unification)
        g = apply_phases(r.graphs, ctx)["decode"] if shared else \
            ParallelTransform().apply(r.graphs["decode"], ctx)
        attn = _layer0(g, "self_attn", "zrt.attention.default")
        # one query token; 1 of 2 KV heads over 16 cached + 1 new positions
        assert [t.shape for t in attn.inputs] == [(2, 2, 1, 32), (2, 1, 17, 32),
                                                  (2, 1, 17, 32)]
        cat = next(n for n in g.nodes if n.layer_index == 0 and n.op == "aten.cat.default"
                   and n.outputs[0].shape == (2, 1, 17, 32))
        assert cat.inputs[0].shape == (2, 1, 16, 32)


def test_kv_heads_replicate_when_tp_exceeds_them(host, captured):
    r = captured(LLAMA, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(tp=4)))
    k = _layer0(g, "k_proj")
    # 2 KV heads over 4 ranks: each rank holds one whole head (32 outputs), replicated
    assert k.inputs[1].shape == (128, 32)
    attn = _layer0(g, "self_attn", "zrt.attention.default")
    # 1 of 4 query heads, 1 KV head: 2 * 2 * 1 * 136 * 64 = 34816
    assert [t.shape[1] for t in attn.inputs] == [1, 1, 1] and attn.flops == 34_816


def test_gpt2_fused_qkv_conv1d_splits_into_per_rank_heads(host, captured):
    r = captured(GPT2, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(tp=2)))
    _check_structure(g)
    c_attn = _layer0(g, "attn.c_attn", "aten.addmm.default")
    # Conv1D weight [in, out] = [128, 384] split on out: 2*32*128*192 = 1572864
    assert c_attn.inputs[2].shape == (128, 192) and c_attn.flops == 1_572_864
    split = next(n for n in g.nodes if n.layer_index == 0 and n.op == "aten.split.Tensor")
    assert [t.shape for t in split.outputs] == [(2, 16, 64)] * 3
    assert split.attrs["split_size"] == 64
    assert _matmul_flops(g) * 2 == _matmul_flops(r.graphs["prefill"])
    # c_proj (attention) and c_proj (MLP) are row-parallel: two all-reduces per layer
    assert len([n for n in _collectives(g, "all_reduce") if n.layer_index == 0]) == 2


def test_sequence_parallel_training_megatron_collectives(host, captured):
    r = captured(LLAMA, ("train_forward", "train_backward"))
    train = TrainSpec(micro_batch=2, global_batch=2, seq_len=16)
    out = apply_phases(r.graphs, _ctx(host, r, Parallel(tp=2, sp=True), train))
    fwd, bwd = out["train_forward"], out["train_backward"]
    _check_structure(fwd)
    _check_structure(bwd)
    layer = [n for n in _collectives(fwd) if n.layer_index == 0]
    # per layer: gather before qkv, scatter after o_proj, gather before gate/up, scatter
    # after down; every message the full 32 x 128 bf16 buffer = 8192 bytes
    assert [n.attrs["collective"] for n in layer] == ["all_gather", "reduce_scatter",
                                                     "all_gather", "reduce_scatter"]
    assert {n.attrs["bytes"] for n in layer} == {8192}
    norm_mean = next(n for n in fwd.nodes if n.layer_index == 0 and n.op == "aten.mean.dim")
    assert norm_mean.inputs[0].numel == 16 * 128  # the norm runs on 32 / 2 tokens
    assert _matmul_flops(fwd) * 2 == _matmul_flops(r.graphs["train_forward"])
    assert _matmul_flops(bwd) * 2 == _matmul_flops(r.graphs["train_backward"])
    # backward: the input gradients of the column-parallel q/k/v and gate/up projections
    # are reduce-scattered (their sum, once per pair of norms)
    bwd_layer = [n for n in _collectives(bwd, "reduce_scatter") if n.layer_index == 0]
    assert len(bwd_layer) == 2 and {n.attrs["bytes"] for n in bwd_layer} == {8192}
    # and gathered: the output gradients of o_proj and down (sequence-split) before their
    # input-gradient GEMMs, and the saved norm outputs once each for the weight gradients
    # of q/k/v and of gate/up (TransformerEngine's fused QKV and FC1 linears re-gather
    # their input once; the capture's separate projections read views of it)
    gathers = [n for n in _collectives(bwd, "all_gather") if n.layer_index == 0]
    assert len(gathers) == 4 and {n.attrs["bytes"] for n in gathers} == {8192}


def test_tp_without_sp_backward_all_reduces_input_gradients(host, captured):
    r = captured(LLAMA, ("train_forward", "train_backward"))
    train = TrainSpec(micro_batch=2, global_batch=2, seq_len=16)
    out = apply_phases(r.graphs, _ctx(host, r, Parallel(tp=2, sp=False), train))
    bwd_layer = [n for n in _collectives(out["train_backward"]) if n.layer_index == 0]
    assert [n.attrs["collective"] for n in bwd_layer] == ["all_reduce", "all_reduce"]
    assert {n.attrs["bytes"] for n in bwd_layer} == {8192}


# -- expert parallelism ----------------------------------------------------------------------


def test_ep_across_dp_ranks_all_to_all_around_the_grouped_gemms(host, captured):
    r = captured(QWEN3_MOE, ("prefill",))
    g0 = r.graphs["prefill"]
    g = ParallelTransform().apply(g0, _ctx(host, r, Parallel(dp=4, ep=4)))
    _check_structure(g)
    a2a = _collectives(g, "all_to_all")
    # dispatch and combine of 32 tokens x top-2 x 128 x 2 bytes = 16384 per rank, of which
    # (ep-1)/ep = 3/4 leave the rank: 12288
    assert [n.attrs["moe"] for n in a2a] == ["dispatch", "combine"]
    assert {n.attrs["bytes"] for n in a2a} == {16384}
    assert {n.attrs["sent_bytes"] for n in a2a} == {12288}
    assert {(n.attrs["group"], n.attrs["group_size"], n.attrs["span"]) for n in a2a} == \
        {("ep", 4, 4)}
    up = next(n for n in g.nodes if n.op == "aten._grouped_mm.default" and n.layer_index == 1)
    # 8 experts / 4 ranks = 2 local experts; balanced routing brings 64 rows (the rank's
    # own token count x top-2), 32 per local expert: 2*64*128*128 = 2097152, as unsharded
    assert up.inputs[1].shape == (2, 128, 128) and up.attrs["group_rows"] == (32, 32)
    up0 = next(n for n in g0.nodes if n.op == "aten._grouped_mm.default"
               and n.layer_index == 1)
    assert up.flops == up0.flops == 2_097_152
    # only the local experts' weights are read: 2 x 128 x 128 x 2 bytes = 65536 (of 262144)
    assert up.bytes_read - up0.bytes_read == 65_536 - 262_144


def test_ep_inside_tp_ranks_runs_local_rows_and_reduces_once(host, captured):
    r = captured(QWEN3_MOE, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"],
                                  _ctx(host, r, Parallel(tp=4, ep=4, etp=1)))
    assert not _collectives(g, "all_to_all")
    up = next(n for n in g.nodes if n.op == "aten._grouped_mm.default" and n.layer_index == 1)
    # every TP rank holds all 32 tokens: 64 rows / 4 ranks = 16, on 2 local experts
    assert up.inputs[0].shape == (16, 128) and up.attrs["group_rows"] == (8, 8)
    moe_reduce = [n for n in _collectives(g, "all_reduce") if n.layer_index == 1
                  and ("experts" in n.module_path or n.module_path.endswith(".mlp"))]
    assert len(moe_reduce) == 1 and moe_reduce[0].attrs["bytes"] == 32 * 128 * 2


def test_expert_tensor_parallel_splits_expert_ffn(host, captured):
    r = captured(QWEN3_MOE, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(tp=2)))
    up = next(n for n in g.nodes if n.op == "aten._grouped_mm.default" and n.layer_index == 1)
    down = [n for n in g.nodes if n.op == "aten._grouped_mm.default" and n.layer_index == 1][1]
    # packed gate|up of 2 x 64 split per rank: [8, 128, 64]; down [8, 32, 128]
    assert up.inputs[1].shape == (8, 128, 64) and down.inputs[1].shape == (8, 32, 128)
    assert _matmul_flops(g) < _matmul_flops(r.graphs["prefill"])


# -- context parallelism ---------------------------------------------------------------------


def test_ring_attention_passes_kv_blocks_and_splits_the_work(host, captured):
    r = captured(LLAMA, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"], _ctx(host, r, Parallel(cp=2)))
    _check_structure(g)
    ring = _collectives(g, "send_recv")
    layer = [n for n in ring if n.layer_index == 0]
    # (cp-1) = 1 step of the local K and V blocks: 2 x (2 x 2 x 8 x 32 x 2 bytes) = 4096
    assert len(layer) == 1 and layer[0].attrs["bytes"] == 4096
    assert (layer[0].attrs["group"], layer[0].attrs["overlap"]) == ("cp", "consumer")
    attn = _layer0(g, "self_attn", "zrt.attention.default")
    # local queries (8 of 16) against the whole sequence; work = whole / cp:
    # 2 * 2 * 4 * 136 * 64 / 2 = 69632
    assert attn.inputs[0].shape == (2, 4, 8, 32) and attn.inputs[1].shape == (2, 2, 16, 32)
    assert attn.flops == 69_632
    down = _layer0(g, "down_proj")
    assert down.inputs[0].shape == (16, 256)  # 32 tokens / cp 2


def test_ulysses_all_to_all_swaps_sequence_and_heads(host, captured):
    r = captured(LLAMA, ("prefill",))
    g = ParallelTransform().apply(r.graphs["prefill"],
                                  _ctx(host, r, Parallel(cp=2, cp_kind="ulysses")))
    layer = [n for n in _collectives(g, "all_to_all") if n.layer_index == 0]
    # q, k, v before attention, the output after: q 2x4x8x32x2 = 4096, k/v 2048, out 4096
    assert [n.attrs["bytes"] for n in layer] == [4096, 2048, 2048, 4096]
    attn = _layer0(g, "self_attn", "zrt.attention.default")
    assert [t.shape for t in attn.inputs] == [(2, 2, 16, 32), (2, 1, 16, 32), (2, 1, 16, 32)]


CP_FAMILIES = {"gpt2": GPT2, "opt": OPT, "bloom": BLOOM, "llama": LLAMA, "qwen2": QWEN2,
               "mixtral": MIXTRAL, "qwen3_moe": QWEN3_MOE, "deepseek_v3": DEEPSEEK_V3}
ALL_PHASES = ("prefill", "train_forward", "train_backward")


def _token_independent(node: OpNode) -> bool:
    """What CP leaves whole: ops with no axis of 16 tokens, 2 × 16 rows or 2 × 16 × 2 routed
    rows (top-2 MoE) — prefill's head past the last-position slice (one rank computes the
    logits), a tied embedding's two weight gradients summed, per-head constants."""
    return not any({16, 32, 64} & set(t.shape) for t in (*node.inputs, *node.outputs))


@pytest.mark.parametrize("cp_kind", ["ring", "ulysses"])
@pytest.mark.parametrize("family", CP_FAMILIES)
def test_context_parallel_splits_the_sequence_of_every_family(host, captured, family, cp_kind):
    # Every rank computes 1/cp of every token-wise op (embedding lookups, norms, GEMMs,
    # loss) and of the attention, whether the token ids reach the embedding directly or
    # through a view (GPT-2, OPT) and the positions come from arange (GPT-2, llama's RoPE)
    # or from a cumulative sum over an all-ones mask (OPT).
    r = captured(CP_FAMILIES[family], ALL_PHASES)
    out = apply_phases({p: r.graphs[p] for p in ALL_PHASES},
                       _ctx(host, r, Parallel(cp=2, cp_kind=cp_kind)))
    for phase in ALL_PHASES:
        g0, g1 = r.graphs[phase], out[phase]
        _check_structure(g1)
        rank = g1.by_id()
        attention = [0, 0]
        for n in g0.nodes:
            if not n.flops:
                continue
            m = rank[n.id]
            if n.category == Category.ATTENTION:
                attention[0] += n.flops * g0.multiplicity(n)
                attention[1] += m.flops * g1.multiplicity(m)
            elif _token_independent(n):
                assert m.flops == n.flops, (phase, n.op, n.module_path)
            else:
                assert 2 * m.flops == n.flops, (phase, n.op, n.module_path, m.inputs)
        assert attention[0] > 0 and 2 * attention[1] == attention[0], phase
        layer0 = {(c.attrs["collective"], c.attrs["cp_kind"] if "cp_kind" in c.attrs else None)
                  for c in _collectives(g1) if c.attrs["group"] == "cp" and c.layer_index == 0}
        assert layer0 == ({("send_recv", "ring")} if cp_kind == "ring"
                          else {("all_to_all", "ulysses")}), (phase, layer0)


def test_context_parallel_gpt2_collectives_and_shapes(host, captured):
    # GPT-2: hidden 128, 4 heads of 32, batch 2 × 16 tokens; cp = 2 keeps 8 tokens a rank.
    r = captured(GPT2, ALL_PHASES)
    out = apply_phases({p: r.graphs[p] for p in ALL_PHASES}, _ctx(host, r, Parallel(cp=2)))
    fwd, bwd = out["train_forward"], out["train_backward"]
    wte, wpe = [n for n in fwd.nodes if n.op == "aten.embedding.default"]
    assert wte.inputs[1].shape == (2, 8) and wte.outputs[0].shape == (2, 8, 128)
    assert wpe.inputs[1].shape == (1, 8)  # positions 8 of 16 (arange split like the ids)
    c_fc = _layer0(fwd, "mlp.c_fc", "aten.addmm.default")
    # 16 local tokens: 2 × 16 × 128 × 512 = 2,097,152 FLOPs (half of the 32 tokens')
    assert c_fc.inputs[1].shape == (16, 128) and c_fc.flops == 2_097_152
    # ring: K and V blocks of 2 × 4 × 8 × 32 × 2 bytes = 4096 each pass cp - 1 = 1 step:
    # 8192 bytes forward; backward passes K, V and their gradients: 16384
    (ring_f,) = [c for c in _collectives(fwd, "send_recv") if c.layer_index == 0]
    (ring_b,) = [c for c in _collectives(bwd, "send_recv") if c.layer_index == 0]
    assert (ring_f.attrs["bytes"], ring_b.attrs["bytes"]) == (8192, 16384)
    # the loss over 16 of 32 tokens is a partial sum: its value and token count are
    # all-reduced over cp (4-byte fp32 scalars), as Megatron averages the loss over CP
    loss = [c for c in _collectives(fwd, "all_reduce") if c.attrs["group"] == "cp"]
    assert [c.attrs["bytes"] for c in loss] == [4, 4]


# -- pipeline stages -------------------------------------------------------------------------


def test_pipeline_plan_and_stage_graphs(host, captured):
    r = captured(LLAMA, ("prefill",))
    g = r.graphs["prefill"]
    plan = PipelinePlan.build(2, pp=2)
    assert [s.layers for s in plan.stages] == [(0,), (1,)]
    assert plan.layer_counts(g) == [{"dense": 1}, {"dense": 1}]
    p = check_layout(Parallel(pp=2), r.dims)
    first, last = stage_graph(g, plan, 0, p), stage_graph(g, plan, 1, p)
    # the hidden states leaving a stage: 2 x 16 x 128 x 2 bytes = 8192
    assert boundary_bytes(g) == 8192
    assert first.nodes[-1].attrs["direction"] == "send" and first.nodes[-1].attrs["bytes"] \
        == 8192
    assert last.nodes[0].attrs["direction"] == "recv"
    assert any(n.op == "aten.embedding.default" for n in first.nodes)
    assert not any(n.op == "aten.embedding.default" for n in last.nodes)
    assert any(n.module_path == "lm_head" for n in last.nodes)
    assert [t.indices for t in last.templates.values()] == [(1,)]
    assert {n.attrs["group"] for n in (first.nodes[-1], last.nodes[0])} == {"pp"}
    with pytest.raises(LayoutError, match="does not divide the 2 layers"):
        PipelinePlan.build(2, pp=4)


# -- the plan and the engine ---------------------------------------------------------------


def test_module_name_rules_agree_with_transformers_plans(captured):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for config in (LLAMA, QWEN3_MOE):
        r = captured(config, ("prefill",))
        plan = TPPlan.from_mapping(CONFIG_MAPPING[config["model_type"]].base_model_tp_plan)
        names = {t.param for n in r.graphs["prefill"].nodes for t in n.inputs if t.param}
        for name in names:
            if name.startswith("lm_head") or "embed" in name:
                continue  # the plan covers the decoder layers only
            assert plan.style_of(name) == TPPlan().style_of(name), name


def test_view_groups_pair_reshaped_axes():
    assert view_groups((1, 512, 4096), (512, 4096)) == [([0, 1], [0]), ([2], [1])]
    assert view_groups((512, 4096), (1, 512, 32, 128)) == [([0], [0, 1]), ([1], [2, 3])]


def test_layout_errors_name_the_dimension():
    dims = ModelDims.from_config(LLAMA)
    with pytest.raises(LayoutError, match="attention heads"):
        check_layout(Parallel(tp=3), dims)
    with pytest.raises(LayoutError, match="2 attention heads per TP rank"):
        check_layout(Parallel(tp=2, cp=4, cp_kind="ulysses"), dims)  # 4 heads / tp 2 = 2
    with pytest.raises(LayoutError, match="KV heads"):
        check_layout(Parallel(tp=4), ModelDims.from_config({**LLAMA, "num_key_value_heads": 3,
                                                            "num_attention_heads": 12}))
