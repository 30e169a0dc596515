"""Nemotron-H's Mamba-2 mixers as production kernels: one SSD scan / state-update node."""

from __future__ import annotations

import pytest

from zrt_core.ir.graph import Category, Phase

torch = pytest.importorskip("torch")


def _mamba_ops(graph, layer=0):
    return [n for n in graph.nodes if n.layer_index == layer and n.category == Category.SSM]


def test_one_scan_node_per_mamba_layer_and_phase(captured):
    r = captured("nemotron_h")
    assert [n.op for n in _mamba_ops(r.graphs[Phase.PREFILL])] == ["zrt.ssd_chunk_scan.default"]
    assert [n.op for n in _mamba_ops(r.graphs[Phase.TRAIN_FORWARD])] == \
        ["zrt.ssd_chunk_scan.default"]
    assert [n.op for n in _mamba_ops(r.graphs[Phase.DECODE])] == \
        ["zrt.ssm_state_update.default"]
    assert [n.op for n in _mamba_ops(r.graphs[Phase.TRAIN_BACKWARD])] == \
        ["zrt.ssd_chunk_scan_backward.default"]
    # no einsum-spelled scan left in the mixer: the projections and the causal conv1d
    mixer = [(n.op, n.module_path) for n in r.graphs[Phase.PREFILL].nodes
             if n.layer_index == 0 and n.category == Category.MATMUL]
    assert mixer == [("aten.mm.default", "model.layers.0.mixer.in_proj"),
                     ("aten.convolution.default", "model.layers.0.mixer"),
                     ("aten.mm.default", "model.layers.0.mixer.out_proj")]


def test_scan_flops_and_bytes(captured):
    g = captured("nemotron_h").graphs[Phase.PREFILL]
    (scan,) = _mamba_ops(g)
    x, _dt, _a, b = scan.inputs[:4]
    assert x.shape == (2, 16, 4, 32) and b.shape == (2, 16, 2, 16)
    assert scan.attrs["chunk_size"] == 8
    # per token: 4 heads · (4·16·32 + 9·32 + 3·32) + 2 groups · 9 · 16 = 10016; 2 · 16 tokens
    assert scan.flops == 2 * 16 * 10016
    # bytes: inputs and outputs only, no chunk intermediates
    assert scan.bytes == sum(t.nbytes for t in scan.inputs) + sum(t.nbytes for t in scan.outputs)


def test_decode_state_update_writes_the_state(captured):
    g = captured("nemotron_h").graphs[Phase.DECODE]
    (step,) = _mamba_ops(g)
    state = step.inputs[0]
    assert state.shape == (2, 4, 32, 16)
    assert step.bytes_written == step.outputs[0].nbytes + state.nbytes
    # 5 per state element + 2 per input element: 5 · 4096 + 2 · 256 = 20992
    assert step.flops == 5 * state.numel + 2 * step.inputs[1].numel


def test_patched_mixer_matches_hf_numerically(tiny, patch_keeps_a_training_step):
    """A real tiny Nemotron-H: logits and gradients equal with and without the patch."""
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.mamba import mamba_kernels_context
    from zrt_core.capture.sources import transformers_config

    config = transformers_config({**tiny["nemotron_h"], "hybrid_override_pattern": "M*M-"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    model.train()
    ids = torch.randint(0, 512, (2, 12))
    patch_keeps_a_training_step(model, ids, mamba_kernels_context(config, None))


def test_patch_is_scoped(captured):
    from transformers.models.nemotron_h import modeling_nemotron_h as m

    from zrt_core.capture import mamba

    captured("nemotron_h")
    assert m.mamba2_chunk_scan is not mamba._chunk_scan
    assert m.mamba2_selective_state_update is not mamba._state_update


_HYBRID_MAMBA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                     mamba_n_heads=8, mamba_d_head=16, mamba_expand=2, mamba_n_groups=1,
                     mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8)


@pytest.mark.parametrize("config", [
    dict(_HYBRID_MAMBA, model_type="bamba", attn_layer_indices=[1]),
    dict(_HYBRID_MAMBA, model_type="granitemoehybrid", layer_types=["mamba", "attention"],
         num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32),
], ids=["bamba", "granitemoehybrid"])
def test_mamba2_hybrids_run_the_kernels_and_match_the_count(host, config):
    """Bamba and Granite 4.0-H call the same Mamba-2 entry points as Nemotron-H: one scan
    node per Mamba layer and phase, and every phase's FLOPs match the analytic count (the
    check that refused both before their Mamba layers were counted)."""
    from zrt_core.capture.api import capture

    r = capture(config, batch=2, seq_len=16, host=host)
    for phase, op in ((Phase.PREFILL, "zrt.ssd_chunk_scan.default"),
                      (Phase.DECODE, "zrt.ssm_state_update.default"),
                      (Phase.TRAIN_BACKWARD, "zrt.ssd_chunk_scan_backward.default")):
        assert [n.op for n in _mamba_ops(r.graphs[phase])] == [op]
        assert _mamba_ops(r.graphs[phase], layer=1) == []  # the attention layer
    for phase, check in r.flops_checks.items():
        assert check.gap is not None and abs(check.gap) < 0.10, (phase, check.gap)


def test_falcon_h1_runs_attention_and_the_scan_side_by_side(host):
    """Falcon-H1's layers hold attention and a Mamba-2 mixer in parallel: one scan node and
    one attention node in every layer, and the count agrees (both mixers, the MLP)."""
    from zrt_core.capture.api import capture
    from zrt_core.modelmath.flops import param_counts

    config = dict(model_type="falcon_h1", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=256, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8,
                  mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=8)
    r = capture(config, batch=2, seq_len=16, host=host)
    g = r.graphs[Phase.PREFILL]
    assert [n.op for n in _mamba_ops(g)] == ["zrt.ssd_chunk_scan.default"]
    assert [n.op for n in g.nodes if n.layer_index == 0 and n.category == Category.ATTENTION] \
        == ["zrt.attention.default"]
    for phase, check in r.flops_checks.items():
        assert check.gap is not None and abs(check.gap) < 0.10, (phase, check.gap)
    assert param_counts(config).total == r.params.total
