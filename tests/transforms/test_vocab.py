"""The vocabulary the frameworks allocate (zrt_core.transforms.vocab): the padding rules, the
graph rewrite, and the training and serving estimates that apply them."""

from __future__ import annotations

import pytest

from zrt_core.ir.graph import OpGraph
from zrt_core.transforms.vocab import pad_vocabulary, padded_vocab

from ..cost.builders import op_node, tensor


@pytest.mark.parametrize(("vocab", "framework", "tp", "rows"), [
    # Megatron: a multiple of 128 x TP
    (50257, "megatron", 1, 50304),    # 393 x 128
    (50257, "megatron", 8, 51200),    # 50 x 1,024
    (128256, "megatron", 1, 128256),  # 1,002 x 128: already a multiple
    (128256, "megatron", 8, 129024),  # 126 x 1,024 (125.25 rounded up)
    # vLLM: a multiple of 64, and of TP (lcm)
    (50257, "vllm", 1, 50304),        # 786 x 64
    (50257, "vllm", 3, 50304),        # lcm 192: 262 x 192
    (50257, "sglang", 1, 50304),      # SGLang keeps vLLM's VocabParallelEmbedding
    # TensorRT-LLM: a multiple of TP only
    (50257, "trtllm", 1, 50257),
    (50257, "trtllm", 8, 50264),      # 6,283 x 8
    # eager PyTorch (zrt diff): as the config says
    (50257, "transformers", 8, 50257),
])
def test_padded_vocab(vocab, framework, tp, rows):
    assert padded_vocab(vocab, framework, tp) == rows


def _head_graph(vocab: int) -> OpGraph:
    # an output layer x[16, 64] @ W[vocab, 64]ᵀ and the softmax over its logits
    head = op_node("aten.mm.default", "matmul", [tensor(16, 64), tensor(64, vocab, param="w")],
                   [tensor(16, vocab)], flops=2 * 16 * 64 * vocab, formula="mm")
    soft = op_node("aten._softmax.default", "reduction", [tensor(16, vocab)],
                   [tensor(16, vocab)], flops=5 * 16 * vocab, formula="test")
    other = op_node("aten.mm.default", "matmul", [tensor(16, 64), tensor(64, 64, param="v")],
                    [tensor(16, 64)], flops=2 * 16 * 64 * 64, formula="mm")
    return OpGraph(phase="prefill", nodes=[other, head, soft], edges=[(head.id, soft.id)])


def test_padding_rewrites_the_vocabulary_dimension_and_recounts_the_work():
    before = _head_graph(1001)
    (g,), note = pad_vocabulary((before,), 1001, 1024, other_dims=(64, 16))
    other, head, soft = g.nodes
    assert head.inputs[1].shape == (64, 1024) and head.outputs[0].shape == (16, 1024)
    # the registered mm formula on the new shapes: 2 x 16 x 64 x 1024
    assert head.flops == 2 * 16 * 64 * 1024
    # an op without a formula the registry knows is scaled by its output: 5 x 16 x 1024
    assert soft.outputs[0].shape == (16, 1024) and soft.flops == 5 * 16 * 1024
    # a node without the vocabulary is kept as it was
    assert other is before.nodes[0]
    assert note == "vocabulary padded from 1001 to 1024 rows, as the framework allocates it"


def test_no_padding_when_aligned_or_ambiguous():
    g = _head_graph(1024)
    (same,), note = pad_vocabulary((g,), 1024, 1024)
    assert same is g and note is None
    # a vocabulary of the hidden size's length cannot be told apart from it: left alone
    g = _head_graph(64)
    (same,), note = pad_vocabulary((g,), 64, 128, other_dims=(64, 16))
    assert same is g and note == ("vocabulary 64 not padded to 128: another dimension has "
                                  "the same size")
    # nor one of a weight other than a [vocabulary, hidden] matrix (experts as wide as it)
    experts = op_node("aten._grouped_mm.default", "matmul",
                      [tensor(16, 64), tensor(4, 64, 1001, param="experts.w")],
                      [tensor(16, 1001)], flops=2 * 16 * 64 * 1001, formula="mm")
    g = OpGraph(phase="prefill", nodes=[*_head_graph(1001).nodes, experts], edges=[])
    (same,), note = pad_vocabulary((g,), 1001, 1024, other_dims=(64, 16))
    assert same is g and note.startswith("vocabulary 1001 not padded to 1024")


# a llama whose vocabulary (1,001) is a multiple of nothing
ODD = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, vocab_size=1001)
TOY = {"id": "toy_gpu", "name": "Toy GPU", "vendor": "toy",
       "compute": {"fp32": 10, "bf16": 100, "fp16": 100, "fp8": 200},
       "memory": {"capacity_gb": 4, "bandwidth_gb_per_s": 1000},
       "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                         "devices": None}],
       "efficiency": {"matmul": 0.8, "memory": 0.8, "launch_overhead_us": 2}}


def _head_rows(graph) -> set[int]:
    """The vocabulary rows of the output layer's forward GEMMs."""
    return {n.outputs[0].shape[-1] for n in graph.nodes
            if n.category == "matmul" and n.module_path.endswith("lm_head")}


@pytest.mark.parametrize(("engine", "tp", "rows"), [
    ("vllm", 1, {1024}),     # 16 x 64
    ("vllm", 2, {512}),      # 1,024 over 2 ranks
    ("trtllm", 1, {1001}),   # TensorRT-LLM pads to TP only
    ("trtllm", 2, {501}),    # ceil(1,001 / 2)
])
def test_serving_graphs_carry_the_engines_vocabulary(engine, tp, rows):
    from zrt_core.capture.api import capture
    from zrt_core.estimate import CapturedModel
    from zrt_core.estimate.inference import _Estimator
    from zrt_core.hardware import HardwareSpec
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import InferSpec, Parallel, check_layout

    host = get_plugin_manager(autoload=False)
    cap = CapturedModel.from_capture(capture(ODD, phases=("prefill", "decode"), batch=1,
                                             seq_len=32, host=host))
    est = _Estimator(cap, HardwareSpec.from_mapping(TOY), check_layout(Parallel(tp=tp),
                     cap.dims), InferSpec(input_len=32, output_len=32), host, engine)
    assert _head_rows(est.graph("decode", 4, 40)) == rows
    padded = [n for n in est.notes if n.startswith("vocabulary padded")]
    assert padded == ([] if rows == {1001} else
                      [f"vocabulary padded from 1001 to {max(rows) * tp} rows, as the "
                       f"framework allocates it ({engine})"])


def test_training_graphs_carry_megatrons_vocabulary():
    from zrt_core.estimate.training import capture_for_training, estimate_training
    from zrt_core.hardware import HardwareSpec
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import Parallel, TrainSpec

    host = get_plugin_manager(autoload=False)
    tiny = capture_for_training(ODD, 2, 32, host=host, use_cache=False)
    report = estimate_training(ODD, HardwareSpec.from_mapping(TOY), Parallel(tp=2, dp=1),
                               TrainSpec(micro_batch=2, global_batch=2, seq_len=32),
                               host=host, captured=tiny)
    # 128 x 2 = 256: 1,001 -> 4 x 256 = 1,024 rows, 512 on each rank
    assert ("vocabulary padded from 1001 to 1024 rows, as the framework allocates it "
            "(Megatron: a multiple of 128 × TP)") in report.notes
