"""The recorder on a tiny Llama: nodes, modules, phases, dataflow, serialisation."""

from __future__ import annotations

from collections import Counter

import pytest

from zrt_core.ir.graph import Category, OpGraph, Phase


def test_every_phase_is_captured_with_meta(captured):
    r = captured("llama")
    assert tuple(r.graphs) == Phase.CAPTURED
    for phase, g in r.graphs.items():
        assert g.phase == phase
        assert g.meta["model_type"] == "llama"
        assert g.meta["batch"] == 2 and g.meta["seq_len"] == 16
        assert g.meta["torch_version"] and g.meta["transformers_version"]
        assert g.missing_formulas == ()
    assert r.graphs["decode"].meta["kv_len"] == 16


def test_one_attention_node_per_layer_per_phase(captured):
    r = captured("llama")
    # 3 layers of one kind: the template is captured once and counted 3 times
    (template,) = r.templates
    assert template.kind == "dense" and template.indices == (0, 1, 2)
    for phase in (Phase.PREFILL, Phase.DECODE, Phase.TRAIN_FORWARD):
        g = r.graphs[phase]
        attention = [n for n in g.nodes if n.category == Category.ATTENTION]
        assert [n.op for n in attention] == ["zrt.attention.default"]
        assert attention[0].module_path == "model.layers.0.self_attn"
        assert attention[0].layer_index == 0 and attention[0].layer_kind == "dense"
        assert g.multiplicity(attention[0]) == 3
    backward = [n for n in r.graphs[Phase.TRAIN_BACKWARD].nodes
                if n.category == Category.ATTENTION]
    assert [n.op for n in backward] == ["zrt.attention_backward.default"]


def test_attention_shapes_and_flops(captured):
    g = captured("llama").graphs[Phase.PREFILL]
    (att,) = [n for n in g.nodes if n.op == "zrt.attention.default"]
    q, k, _v = att.inputs
    assert q.shape == (2, 4, 16, 32) and k.shape == (2, 2, 16, 32)  # GQA: K/V not repeated
    assert att.attrs["is_causal"] is True and att.attrs["window"] == 0
    # causal pairs per head: 16·17/2 = 136; 2 (B) · 4 (H) · 136 · 2 · (32 + 32) = 139264
    assert att.flops == 139264


def test_decode_attends_to_the_prefill_cache(captured):
    g = captured("llama").graphs[Phase.DECODE]
    (att,) = [n for n in g.nodes if n.op == "zrt.attention.default"]
    q, k, _v = att.inputs
    assert q.shape == (2, 4, 1, 32) and k.shape == (2, 2, 17, 32)
    # one query sees 17 keys: 2 · 4 · 17 · 2 · 64 = 17408
    assert att.flops == 17408


def test_prefill_computes_logits_for_the_last_position_only(captured):
    r = captured("llama")
    (head,) = [n for n in r.graphs[Phase.PREFILL].nodes
               if n.module_path == "lm_head" and n.category == Category.MATMUL]
    assert head.outputs[0].shape == (2, 512)         # B rows, not B·S
    heads = [n for n in r.graphs[Phase.TRAIN_FORWARD].nodes
             if n.module_path == "lm_head" and n.category == Category.MATMUL]
    assert heads[0].outputs[0].shape == (32, 512)    # training: every position


def test_views_are_kept_and_free(captured):
    g = captured("llama").graphs[Phase.PREFILL]
    views = [n for n in g.nodes if n.category == Category.VIEW]
    assert {n.op for n in views} >= {"aten.view.default", "aten.t.default",
                                     "aten.transpose.int"}
    assert all(n.zero_cost and n.flops == 0 and n.bytes == 0 for n in views)
    assert all(o.is_view for n in views if n.op == "aten.t.default" for o in n.outputs)


def test_weights_are_named(captured):
    g = captured("llama").graphs[Phase.PREFILL]
    (mm,) = [n for n in g.nodes if n.module_path == "model.layers.0.self_attn.q_proj"
             and n.op == "aten.mm.default"]
    assert mm.inputs[1].param == "model.layers.0.self_attn.q_proj.weight"


def test_edges_follow_dataflow_and_form_a_dag(captured):
    import networkx as nx

    g = captured("llama").graphs[Phase.PREFILL]
    dag = g.to_networkx()
    assert nx.is_directed_acyclic_graph(dag)
    by_id = g.by_id()
    for a, b in g.edges:
        produced = {t.tensor_id for t in by_id[a].outputs}
        read = {t.tensor_id for t in by_id[b].inputs}
        assert produced & read, (by_id[a].op, by_id[b].op)
    (att,) = [n for n in g.nodes if n.op == "zrt.attention.default"]
    # the attention output feeds the o_proj matmul through a view
    o_proj = next(n for n in g.nodes if n.module_path.endswith("o_proj")
                  and n.op == "aten.mm.default")
    assert nx.has_path(dag, att.id, o_proj.id)


def test_tensor_ids_are_unique_across_phases_and_link_saved_activations(captured):
    r = captured("llama")
    produced: dict[str, set[int]] = {}
    for phase, g in r.graphs.items():
        produced[phase] = {t.tensor_id for n in g.nodes for t in n.outputs}
    inference = produced[Phase.PREFILL] | produced[Phase.DECODE]
    assert not (inference & produced[Phase.TRAIN_FORWARD])
    # backward reads activations that training forward produced (saved for backward)
    bwd_reads = {t.tensor_id for n in r.graphs[Phase.TRAIN_BACKWARD].nodes for t in n.inputs}
    assert bwd_reads & produced[Phase.TRAIN_FORWARD]


def test_backward_ops_are_attributed_to_their_forward_module(captured):
    r = captured("llama")
    fwd = r.graphs[Phase.TRAIN_FORWARD]
    bwd = r.graphs[Phase.TRAIN_BACKWARD]
    by_seq = {n.attrs["seq_nr"]: n for n in fwd.nodes if "seq_nr" in n.attrs}
    linked = [n for n in bwd.nodes if "fwd_seq_nr" in n.attrs]
    for n in linked:
        f = by_seq[n.attrs["fwd_seq_nr"]]
        assert (n.module_path, n.layer_index) == (f.module_path, f.layer_index)
    # every backward op is linked to a forward op, except the loss seed (ones_like) and
    # the gradient accumulation into parameters (attributed through the parameter)
    unlinked = [n for n in bwd.nodes if "fwd_seq_nr" not in n.attrs]
    assert [n.op for n in unlinked if n.module_class != "AccumulateGrad"] == \
        ["aten.ones_like.default"]
    layer_ops = Counter(n.module_path.split(".")[3] for n in bwd.nodes
                        if n.layer_index == 0 and n.module_path.count(".") >= 3)
    assert layer_ops["self_attn"] > 0 and layer_ops["mlp"] > 0


def test_json_round_trip_is_exact(captured):
    for g in captured("llama").graphs.values():
        text = g.dumps()
        back = OpGraph.loads(text)
        assert back == g
        assert back.dumps() == text


@pytest.mark.parametrize("phase", Phase.CAPTURED)
def test_single_phase_capture_matches_the_full_run(captured, phase):
    alone = captured("llama", phases=(phase,)).graphs[phase]
    full = captured("llama").graphs[phase]
    assert alone.totals() == full.totals()


def test_tied_heads_stay_tied(captured):
    # gpt2 ties lm_head to wte: parameters count the table once, and the head matmul reads
    # the embedding's weight
    r = captured("gpt2")
    # wte 512·128 + wpe 256·128 + 3 layers · (12·128² + 13·128) + ln_f 2·128 = 758912 − 65536
    assert r.params.total == 693376
    g = r.graphs["prefill"]
    (head,) = [n for n in g.nodes if n.module_path == "lm_head" and n.op == "aten.mm.default"]
    assert head.inputs[1].param == "transformer.wte.weight"


def test_every_position_gets_logits_when_asked(captured):
    r = captured("llama", phases=("prefill",), last_token_logits=False)
    g = r.graphs["prefill"]
    (head,) = [n for n in g.nodes if n.module_path == "lm_head" and n.op == "aten.mm.default"]
    assert head.outputs[0].shape == (32, 512) and g.meta["logits_positions"] == 16


def test_a_multimodal_config_captures_its_language_model(host, tiny):
    from zrt_core.capture.api import capture

    text = {**tiny["gemma3"], "model_type": "gemma3_text"}
    vision = {"model_type": "siglip_vision_model", "hidden_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 128, "image_size": 32,
              "patch_size": 8}
    r = capture({"model_type": "gemma3", "text_config": text, "vision_config": vision},
                phases=("prefill",), batch=1, seq_len=16, host=host)
    assert r.model_type == "gemma3_text"
    assert [t.kind for t in r.templates] == ["sliding_attention", "full_attention"]
    assert any("capturing the language model" in w for w in r.warnings)
    assert r.config["hidden_size"] == 128


def test_qwen3_vl_moe_captures_its_text_layers_as_qwen3_moe(host):
    """transformers builds Qwen3-VL's text model only inside the multimodal model; its
    layers are Qwen3-MoE's, which zrt captures (the FLOP check holds: the analytic count
    reads the text config as qwen3_moe)."""
    from zrt_core.capture.api import capture
    from zrt_core.modelmath.flops import param_counts

    text = {"model_type": "qwen3_vl_moe_text", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "vocab_size": 256, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": [4, 2, 2], "mrope_interleaved": True}}
    vision = {"model_type": "qwen3_vl_moe", "depth": 1, "hidden_size": 32, "num_heads": 2,
              "out_hidden_size": 64}
    config = {"model_type": "qwen3_vl_moe", "text_config": text, "vision_config": vision}
    r = capture(config, batch=2, seq_len=16, host=host)
    assert r.model_type == "qwen3_moe"
    assert any("capturing the language model as qwen3_moe" in w for w in r.warnings)
    assert any(n.op == "aten._grouped_mm.default" for n in r.graphs["prefill"].nodes)
    for phase, check in r.flops_checks.items():
        assert check.gap is not None and abs(check.gap) < 0.10, (phase, check.gap)
    assert param_counts(config).total == r.params.total


def test_qwen2_5_vl_captures_its_text_layers_as_qwen2(host):
    """Qwen2.5-VL's text model, too, exists only inside the multimodal model; its layers are
    Qwen2's (biased q/k/v), captured as such and counted as such."""
    from zrt_core.capture.api import capture
    from zrt_core.modelmath.flops import param_counts

    text = {"model_type": "qwen2_5_vl_text", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                "mrope_section": [2, 3, 3]}}
    vision = {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": 64,
              "intermediate_size": 64}
    config = {"model_type": "qwen2_5_vl", "text_config": text, "vision_config": vision}
    r = capture(config, phases=("prefill", "train_forward"), batch=2, seq_len=16, host=host)
    assert r.model_type == "qwen2"
    assert any("capturing the language model as qwen2" in w for w in r.warnings)
    for phase, check in r.flops_checks.items():
        assert check.gap is not None and abs(check.gap) < 0.10, (phase, check.gap)
    assert param_counts(config).total == r.params.total
