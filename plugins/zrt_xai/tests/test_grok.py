"""zrt-xai: Grok-1 as a model type transformers lacks — loaded through the entry point, built
by the capture from its published architecture, and estimated like any family."""

from __future__ import annotations

import importlib.metadata as md

import pytest

from zrt_core.capture.api import capture
from zrt_core.ir.graph import Phase
from zrt_core.plugins import ENTRY_POINT_GROUP, PluginHost, get_plugin_manager

# h=64, 2 layers, 4 query / 2 KV heads of 16, 4 experts top-2 of width 128, vocab 256
TINY = {"model_type": "grok-1", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256,
        "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return get_plugin_manager()


@pytest.fixture(scope="module")
def prefill(host):
    return capture(TINY, phases=(Phase.PREFILL,), batch=1, seq_len=32, host=host)


def test_entry_point_and_contributions(host) -> None:
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "zrt_xai"]
    assert len(eps) == 1 and eps[0].value == "zrt_xai.plugin"
    assert host.model_types.distribution_of("grok-1") == "zrt-xai"
    assert host.models.get("xai-org/grok-1").key == "grok-1"


def test_released_config_and_expert_width() -> None:
    from zrt_xai.grok import GrokConfig, ffn_size

    assert ffn_size(6144, 8) == 32768  # int(8 · 6144) · 2 // 3 = 32768, a multiple of 8
    c = GrokConfig()
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.num_local_experts, c.num_experts_per_tok, c.vocab_size) == (
        6144, 64, 48, 8, 128, 8, 2, 131072)
    assert c.tie_word_embeddings and c.rope_parameters["rope_theta"] == 10000.0


def test_parameters_of_the_tiny_model(prefill) -> None:
    # per layer: q 64·64 + k, v 64·32 each + o 64·64 = 12288; router 4·64 = 256; experts
    # 4 · (2·128·64 + 128·64) = 98304; four RMSNorms 4·64 = 256 → 111104. Two layers,
    # the tied embedding 256·64 = 16384 and the final norm 64: 222208 + 16384 + 64 = 238656
    assert prefill.params.total == 238656
    # active: experts count 2 of 4 → 238656 − 98304 = 140352
    assert prefill.params.active == 140352


def test_graph_has_grok_mechanisms(prefill) -> None:
    g = prefill.graphs[Phase.PREFILL]
    layer0 = [n for n in g.nodes if n.layer_index == 0]
    # sandwich norms: four RMSNorms per layer
    norms = {n.module_path.rsplit(".", 1)[-1] for n in layer0 if n.op == "aten.rsqrt.default"}
    assert norms == {"input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"}
    attn = next(n for n in layer0 if n.op == "zrt.attention.default")
    # logits × attn_output_multiplier (128^-½ in the release), then 30·tanh(x/30)
    assert attn.attrs["softcap"] == 30.0 and attn.attrs["scale"] == pytest.approx(128 ** -0.5)
    assert [t.shape for t in attn.inputs[:2]] == [(1, 4, 32, 16), (1, 2, 32, 16)]  # GQA
    # two of four experts per token: 32 tokens · 2 = 64 rows, balanced 16 per expert;
    # the expert is a tanh-GeLU gated unit
    grouped = [n for n in layer0 if n.op == "aten._grouped_mm.default"]
    assert [n.attrs["group_rows"] for n in grouped] == [(16, 16, 16, 16)] * 2
    assert any(n.op == "aten.gelu.default" and n.attrs["approximate"] == "tanh"
               for n in layer0)


def test_flops_match_the_analytic_reference(prefill) -> None:
    check = prefill.flops_checks[Phase.PREFILL]
    # the reference counts the matmuls and attention; norms, rotary and the softcap add ~2%
    assert abs(check.gap) < 0.03


def test_without_the_plugin_a_grok_config_is_one_line(monkeypatch) -> None:
    from zrt_core.errors import ModelError

    monkeypatch.setenv("ZRT_DISABLE_PLUGINS", "zrt_xai")
    bare = get_plugin_manager()
    with pytest.raises(ModelError, match=r"unknown model_type 'grok-1'.*a zrt plugin that "
                                         r"supplies 'grok-1'"):
        capture(TINY, phases=(Phase.PREFILL,), batch=1, seq_len=32, host=bare)


def test_training_estimate_with_expert_parallel_folding(host) -> None:
    from zrt_core.estimate.training import estimate_training
    from zrt_core.strategy import Parallel, TrainSpec

    if "h100" not in host.hardware:
        pytest.skip("prices on zrt-nvidia's H100, not installed beside this plugin")

    # the dgxc layout in miniature: ep 4 × etp 1 folded over tp 2 × dp 4 (ep does not divide
    # dp alone); the expert gradients reduce over 2 · 4 / 4 = 2 ranks spanning the 8
    p = Parallel(tp=2, pp=2, ep=4, etp=1, dp=4)
    r = estimate_training(TINY, "h100", p, TrainSpec(micro_batch=1, global_batch=8, seq_len=32),
                          host=host, use_cache=False)
    assert r.step_time_s > 0
    assert (r.parallel.span("ep"), r.parallel.span("edp")) == ((4, 4), (2, 8))
    assert r.exposed_comm_s["ep"] + r.hidden_comm_s["ep"] > 0
    # the collectives the transforms inserted (the estimate's transformed graphs, cached):
    # (kind, group, members, consecutive ranks spanned)
    from zrt_core.estimate.training import _TRANSFORMED

    _captured, fwd, _bwd, bwd_sync, *_ = next(v for v in reversed(_TRANSFORMED.values()))
    found = {(n.attrs["collective"], n.attrs["group"], n.attrs["group_size"], n.attrs["span"])
             for g in (fwd, bwd_sync) for n in g.nodes if n.attrs.get("collective")}
    assert {("all_to_all", "ep", 4, 4), ("all_reduce", "edp", 2, 8),
            ("all_reduce", "dp", 4, 8)} <= found
