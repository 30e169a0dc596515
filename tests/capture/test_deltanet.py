"""Qwen3-Next's Gated DeltaNet mixers as production kernels: one chunked / recurrent node."""

from __future__ import annotations

import pytest

from zrt_core.ir.graph import Category, Phase

torch = pytest.importorskip("torch")

#: Three Gated DeltaNet layers and one gated full-attention layer, MoE with a shared expert.
QWEN3_NEXT = dict(model_type="qwen3_next", hidden_size=64, intermediate_size=64,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  shared_expert_intermediate_size=32, vocab_size=256,
                  layer_types=["linear_attention"] * 3 + ["full_attention"],
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def result(host):
    from zrt_core.capture.api import capture

    return capture(QWEN3_NEXT, batch=2, seq_len=16, host=host)


def _delta(graph, layer=0):
    return [n for n in graph.nodes if n.layer_index == layer and n.category == Category.SSM]


def test_one_delta_node_per_linear_layer_and_phase(result):
    ops = {phase: [n.op for n in _delta(result.graphs[phase])] for phase in result.graphs}
    assert ops[Phase.PREFILL] == ["zrt.gated_delta_chunk.default"]
    assert ops[Phase.TRAIN_FORWARD] == ["zrt.gated_delta_chunk.default"]
    assert ops[Phase.DECODE] == ["zrt.gated_delta_recurrent.default"]
    assert ops[Phase.TRAIN_BACKWARD] == ["zrt.gated_delta_chunk_backward.default"]
    # no per-chunk fallback left: the mixer's other nodes are its projections, the
    # convolution, the gates and the norm (a few dozen, not the fallback's hundreds)
    mixer = [n for n in result.graphs[Phase.PREFILL].nodes
             if n.layer_index == 0 and "linear_attn" in n.module_path
             and n.category != Category.VIEW]
    assert len(mixer) < 40
    assert not any(n.op.startswith("aten.linalg_solve_triangular") for n in mixer)


def test_chunk_and_recurrent_flops(result):
    (chunk,) = _delta(result.graphs[Phase.PREFILL])
    q, _k, v = chunk.inputs[:3]
    assert q.shape == (2, 16, 2, 16) and v.shape == (2, 16, 4, 8)
    assert chunk.attrs["chunk_size"] == 64
    # per value head and token 2·(2·64·16 + 64·8 + 3·16·8) = 5888; 4 heads, 2 · 16 tokens
    assert chunk.flops == 2 * 16 * 4 * 5888
    (back,) = _delta(result.graphs[Phase.TRAIN_BACKWARD])
    assert back.flops == 2 * chunk.flops
    (step,) = _delta(result.graphs[Phase.DECODE])
    # one token per sequence: 7 · 16 · 8 per value head, 4 heads, 2 sequences
    assert step.flops == 2 * 4 * 7 * 16 * 8
    # the state it writes: [batch, value heads, key dim, value dim] in fp32
    assert step.outputs[1].shape == (2, 4, 16, 8) and step.outputs[1].dtype == "float32"


def test_capture_equals_the_analytic_count(result, matches_count):
    """Every phase's captured FLOPs equal the analytic reference (gated attention's doubled
    q_proj, the DeltaNet projections, the shared-expert gate, the mixer terms) within 5%:
    at hidden 64 the elementwise work the analytic count leaves out (norms, gates,
    activations, routing) is 2-3% of the capture; at Qwen3-Next-80B's size it is 0.1-0.2%
    (prefill, decode and training forward at 2,048 tokens)."""
    matches_count(QWEN3_NEXT, result, 16, 0.05)


def test_params_equal_the_built_model():
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.sources import transformers_config
    from zrt_core.modelmath.flops import param_counts

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(transformers_config(QWEN3_NEXT))
    assert param_counts(QWEN3_NEXT).total == sum(p.numel() for p in model.parameters())


def test_patched_mixer_matches_hf_numerically(patch_keeps_a_training_step):
    """A real tiny Qwen3-Next: logits and gradients equal with and without the patch, for a
    sequence longer than one chunk."""
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.deltanet import deltanet_kernels_context
    from zrt_core.capture.sources import transformers_config

    config = transformers_config(QWEN3_NEXT)
    torch.manual_seed(0)
    # float32: the experts' grouped GEMM has no float64 kernel
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    ids = torch.randint(0, 256, (2, 70))
    patch_keeps_a_training_step(model, ids, deltanet_kernels_context(config, None))


def test_decode_step_matches_hf_numerically():
    """Prefill then one decode token through the cache: the recurrent node gives HF's
    logits."""
    from transformers import AutoModelForCausalLM

    from zrt_core.capture.deltanet import deltanet_kernels_context
    from zrt_core.capture.sources import transformers_config

    config = transformers_config(QWEN3_NEXT)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = torch.randint(0, 256, (1, 9))

    def run():
        with torch.no_grad():
            out = model(input_ids=ids[:, :8], use_cache=True)
            step = model(input_ids=ids[:, 8:], past_key_values=out.past_key_values,
                         use_cache=True)
        return step.logits

    ref = run()
    with deltanet_kernels_context(config, None):
        got = run()
    torch.testing.assert_close(got, ref)


@pytest.mark.needs("zrt-nvidia")
def test_tensor_parallel_splits_the_heads_and_the_state():
    """TP 2 serving: each rank holds half the value heads, so the fixed recurrent state per
    sequence halves with the KV cache."""
    from zrt_core.estimate.inference import estimate_inference
    from zrt_core.strategy import InferSpec, Parallel

    spec = InferSpec(input_len=16, output_len=4, batch=2)
    one = estimate_inference(QWEN3_NEXT, "h100", Parallel(tp=1), spec)
    two = estimate_inference(QWEN3_NEXT, "h100", Parallel(tp=2), spec)
    fixed_1 = one.memory.kv_by_layer_kind["linear_attention"][1]
    fixed_2 = two.memory.kv_by_layer_kind["linear_attention"][1]
    # per linear layer and sequence: conv state (2·2·16 + 4·8 = 96 channels × 4 positions,
    # the kernel's width, bf16) + recurrent state (4 heads × 16 × 8, fp32) = 768 + 2048
    # bytes; 3 layers
    assert fixed_1 == 3 * (96 * 4 * 2 + 4 * 16 * 8 * 4)
    assert fixed_2 * 2 == fixed_1
