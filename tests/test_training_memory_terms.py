"""Training memory terms that follow the real framework's mechanism: the MoE combine keeps no
expert output (Megatron-Core weighs the activation by the router probabilities), a Mamba-2
mixer keeps its convolution's input only (the memory-efficient path re-runs the convolution)
and a run's ``grad_reduce_in_fp32`` sets the gradient buffer's dtype."""

from __future__ import annotations

import pytest

from zrt_core.estimate.training import case_from_record, saved_activation_bytes
from zrt_core.ir.graph import Category, LayerTemplate, OpGraph, OpNode, Phase, TensorMeta
from zrt_core.strategy import TrainSpec
from zrt_core.transforms.training import grad_dtype

T, K, H, F = 4, 2, 8, 6  # tokens, top-k, hidden, expert FFN width of the toy MoE layer
ROWS = T * K


def _t(shape: tuple[int, ...], tid: int, param: str | None = None,
       dtype: str = "bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, tensor_id=tid, param=param)


def _node(nid: int, op: str, category: str, phase: str, inputs, outputs) -> OpNode:
    return OpNode(id=nid, op=op, category=category, phase=phase, inputs=inputs,
                  outputs=outputs, module_path="layers.0.mlp", layer_index=0,
                  layer_kind="moe", flops=0, bytes_read=0, bytes_written=0, formula=op)


def _moe_graphs() -> tuple[OpGraph, OpGraph]:
    """dispatch → grouped up (H×F) → gelu → grouped down (F×H) → weighted combine, and the
    backward reading what each step keeps."""
    fw, bw = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    x, idx, w = _t((T, H), 1), _t((T, K), 2, dtype="int64"), _t((T, K), 3, dtype="float32")
    routed, row = _t((ROWS, H), 4), _t((ROWS,), 5, dtype="int64")
    up, act, down, y = _t((ROWS, F), 6), _t((ROWS, F), 7), _t((ROWS, H), 8), _t((T, H), 9)
    up_w, down_w = _t((K, H, F), 20, "layers.0.up"), _t((K, F, H), 21, "layers.0.down")
    fwd = [
        _node(0, "zrt.moe_dispatch.default", Category.MOE_DISPATCH, fw, (x, idx), (routed, row)),
        _node(1, "aten._grouped_mm.default", Category.MATMUL, fw, (routed, up_w), (up,)),
        _node(2, "aten.gelu.default", Category.ELEMENTWISE, fw, (up,), (act,)),
        _node(3, "aten._grouped_mm.default", Category.MATMUL, fw, (act, down_w), (down,)),
        _node(4, "zrt.moe_combine.default", Category.MOE_COMBINE, fw, (down, row, w), (y,)),
    ]
    dy, ddown, dw, dact, dup, droute = (_t((T, H), 30), _t((ROWS, H), 31),
                                        _t((T, K), 32, dtype="float32"), _t((ROWS, F), 33),
                                        _t((ROWS, F), 34), _t((ROWS, H), 35))
    bwd = [  # the loss's gradient first: produced in the backward, not kept from forward
        _node(9, "aten.ones_like.default", Category.ELEMENTWISE, bw, (), (dy,)),
        _node(0, "zrt.moe_combine_backward.default", Category.MOE_COMBINE, bw,
              (dy, down, row, w), (ddown, dw)),
        _node(1, "aten._grouped_mm.default", Category.MATMUL, bw, (ddown, down_w), (dact,)),
        _node(2, "aten._grouped_mm.default", Category.MATMUL, bw, (act, ddown),
              (_t((K, F, H), 36),)),
        _node(3, "aten.gelu_backward.default", Category.ELEMENTWISE, bw, (dact, up), (dup,)),
        _node(4, "aten._grouped_mm.default", Category.MATMUL, bw, (dup, up_w), (droute,)),
        _node(5, "aten._grouped_mm.default", Category.MATMUL, bw, (routed, dup),
              (_t((K, H, F), 37),)),
    ]
    templates = [LayerTemplate("moe", 0, (0,))]
    meta = {"batch": 1, "seq_len": T}
    return OpGraph(fw, fwd, [], templates, meta), OpGraph(bw, bwd, [], templates, meta)


def test_moe_combine_keeps_the_routing_but_not_the_expert_output() -> None:
    fwd, bwd = _moe_graphs()
    saved = saved_activation_bytes(fwd, bwd)
    # kept: routed rows 8×8 bf16 = 128 B (up's weight gradient), gelu input 8×6 bf16 = 96 B,
    # gelu output 8×6 bf16 = 96 B (down's weight gradient), row ids 8 int64 = 64 B and the
    # router weights 4×2 fp32 = 32 B (the combine's backward): 416 B. Not kept: the expert
    # output 8×8 bf16 = 128 B that the captured combine's backward reads (Megatron-Core
    # multiplies the probabilities into the activation and un-permutes unweighted).
    assert saved == {0: 128 + 96 + 96 + 64 + 32}


def test_expert_output_read_by_another_backward_op_is_still_kept() -> None:
    fwd, bwd = _moe_graphs()
    down = fwd.nodes[3].outputs[0]
    extra = _node(6, "aten.mul.Tensor", Category.ELEMENTWISE, Phase.TRAIN_BACKWARD,
                  (down, bwd.nodes[1].inputs[0]), (_t((ROWS, H), 38),))
    bwd2 = OpGraph(bwd.phase, [*bwd.nodes, extra], [], list(bwd.templates.values()), bwd.meta)
    # the 8×8 bf16 expert output (128 B) is now read by a backward op of its own
    assert saved_activation_bytes(fwd, bwd2) == {0: 416 + 128}


@pytest.mark.parametrize(("precision", "fp32", "dtype"), [
    ("bf16", True, "float32"), ("bf16", False, "bfloat16"), ("mxfp8", False, "bfloat16"),
    ("fp16", True, "float16"), ("fp16", False, "float16"), ("fp32", False, "float32")])
def test_gradient_buffer_dtype_follows_grad_reduce_in_fp32(precision: str, fp32: bool,
                                                           dtype: str) -> None:
    assert grad_dtype(precision, fp32) == dtype


def _record(source: str) -> dict:
    return {"id": "x-1", "workload": "train", "hardware": "nvidia_h100_sxm", "num_gpus": 8,
            "seq_len": 128, "global_batch": 8, "micro_batch": 1, "precision": "bf16",
            "source": source, "parallel": {"tp": 1, "pp": 1, "cp": 1, "dp": 8},
            "model": {"hf_config": {"model_type": "llama", "hidden_size": 64,
                                    "num_hidden_layers": 2, "num_attention_heads": 4,
                                    "num_key_value_heads": 4, "intermediate_size": 128,
                                    "vocab_size": 256}}}


def test_megatron_bridge_records_keep_bf16_gradients() -> None:
    mb = case_from_record(_record("NVIDIA Megatron-Bridge performance summary"))
    other = case_from_record(_record("MLPerf Training v5.0"))
    assert mb.train.grad_reduce_in_fp32 is False
    assert any("grad_reduce_in_fp32=False" in a for a in mb.assumptions)
    assert other.train.grad_reduce_in_fp32 is True
    assert TrainSpec(micro_batch=1, global_batch=8, seq_len=8).to_json()[
        "grad_reduce_in_fp32"] is True


# the tiny GPT-2 of tests/test_training_estimate.py: 4 layers of 49,984 parameters, the
# embeddings 8,192 + 16,384 and the final norm 128 outside them (the LM head tied)
TINY = {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 256}
LAYER_PARAMS, OUTER_PARAMS = 4 * 49984, 8192 + 16384 + 128
PARAMS = LAYER_PARAMS + OUTER_PARAMS  # 224640


@pytest.fixture(scope="module")
def tiny():
    from zrt_core.estimate.training import capture_for_training
    from zrt_core.plugins import get_plugin_manager

    return capture_for_training(TINY, 2, 64, host=get_plugin_manager(), use_cache=False)


def _memory(tiny, **train):
    from zrt_core.estimate.training import estimate_training
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import Parallel

    spec = TrainSpec(micro_batch=2, global_batch=16, seq_len=64, zero=1, **train)
    return estimate_training(TINY, "nvidia_h100_sxm", Parallel(dp=2), spec,
                             host=get_plugin_manager(), captured=tiny).memory


@pytest.mark.needs("zrt-nvidia")
def test_bf16_gradient_buffer_halves_the_gradients(tiny) -> None:
    # fp32 main gradients: 4 B per parameter; grad_reduce_in_fp32=False: 2 B (bf16)
    assert _memory(tiny).gradients_bytes == 4 * PARAMS
    assert _memory(tiny, grad_reduce_in_fp32=False).gradients_bytes == 2 * PARAMS


@pytest.mark.needs("zrt-nvidia")
def test_fp8_params_drop_the_bf16_copy_of_the_layer_weights(tiny) -> None:
    # fp8 (per-tensor scales, no block scales): TE's row- and column-wise fp8 copies of every
    # parameter, 2 × 1 B × 224,640, beside the bf16 weights 2 B × 224,640 = 898,560 B
    assert _memory(tiny, precision="fp8").weights_bytes == 2 * PARAMS + 2 * PARAMS
    # fp8_param_gather: the layers' bf16 copy (2 B × 199,936) is gone; the embeddings and
    # final norm stay bf16 (2 B × 24,704): 49,408 + 449,280 = 498,688 B
    assert _memory(tiny, precision="fp8", quantized_params=True).weights_bytes == \
        2 * OUTER_PARAMS + 2 * PARAMS == 498688
    # without a low-precision recipe the flag changes nothing
    assert _memory(tiny, quantized_params=True).weights_bytes == 2 * PARAMS


def test_megatron_bridge_fp8_records_keep_fp8_weights_only() -> None:
    rec = _record("NVIDIA Megatron-Bridge performance summary")
    assert case_from_record({**rec, "precision": "fp8"}).train.quantized_params is True
    assert case_from_record(rec).train.quantized_params is False  # bf16
    deepseek = {**rec, "precision": "fp8", "model": {**rec["model"], "name": "DeepSeek-V3"}}
    # DeepSeek-V3's H100 perf config sets fp8_param_gather = False
    assert case_from_record(deepseek).train.quantized_params is False


def test_search_candidates_carry_the_runs_gradient_and_weight_storage() -> None:
    from zrt_core.modelinfo import ModelDims
    from zrt_core.search.evaluate import train_spec
    from zrt_core.search.space import TrainSpace, enumerate_train

    dims = ModelDims(model_type="toy", hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16,
                     ffn=128, vocab=256)
    space = TrainSpace(gpus=(2,), global_batch=8, seq_len=64, tp=(1,), pp=(1,), cp=(1,),
                       vp=(1,), micro_batch=(1,), recompute=("none",), sharding=("zero1",),
                       grad_reduce_in_fp32=False, quantized_params=True)
    cands, _ = enumerate_train(space, dims, 8)
    assert cands
    specs = {(s.grad_reduce_in_fp32, s.quantized_params)
             for s in (train_spec(c, 8, 64) for c in cands)}
    assert specs == {(False, True)}


# one Mamba-2 layer: hidden 64, 4 heads of 16 (d_inner 64), one group of state 8, conv width 4
MAMBA = {"model_type": "nemotron_h", "hybrid_override_pattern": "M", "num_hidden_layers": 1,
         "hidden_size": 64, "intermediate_size": 32, "mlp_hidden_act": "relu2",
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 1,
         "conv_kernel": 4, "expand": 1, "chunk_size": 8, "vocab_size": 128,
         "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.mark.needs("zrt-nvidia")
def test_mamba_mixer_keeps_the_convolution_input_not_what_the_scan_reads(monkeypatch) -> None:
    # Megatron's mamba_split_conv1d_scan_combined re-runs conv1d and its SiLU in backward:
    # of the convolution's [1, 80, 16 + 3] output and the SiLU's [1, 80, 16] (the scan's x,
    # B, C; conv channels 64 + 2·8 = 80) nothing is kept: 80·19·2 + 80·16·2 = 5,600 B fewer
    # than when the scan and the activation's backward keep their inputs
    from zrt_core.estimate.training import activations, capture_for_training, estimate_training
    from zrt_core.plugins import get_plugin_manager
    from zrt_core.strategy import Parallel

    host = get_plugin_manager()
    captured = capture_for_training(MAMBA, 1, 16, host=host, use_cache=False)

    def saved() -> float:
        return estimate_training(MAMBA, "nvidia_h100_sxm", Parallel(),
                                 TrainSpec(micro_batch=1, global_batch=1, seq_len=16),
                                 host=host, captured=captured
                                 ).memory.activation_bytes_per_microbatch

    mem_eff = saved()
    monkeypatch.setattr(activations, "_split_conv1d_scans", lambda forward, base: {})
    assert saved() - mem_eff == 80 * 19 * 2 + 80 * 16 * 2


@pytest.mark.parametrize(("release", "kernel"), [("26.04", "te_inplace"),
                                                 ("25.09", "te_inplace"),
                                                 ("26.08", "fused")])
def test_megatron_bridge_releases_keep_the_loss_gradient_in_the_logits(release: str,
                                                                       kernel: str) -> None:
    # TE's fused loss up to 2.17 writes the gradient into the bf16 logits and keeps them;
    # 26.08's container TE is not pinned at the bundled snapshot: the fp32 kernel
    case = case_from_record(_record(f"NVIDIA Megatron-Bridge performance summary, NeMo "
                                    f"{release} (performance-summary.md)"))
    assert case.cross_entropy == kernel
    assert (kernel == "te_inplace") == any("TE 2.17" in a for a in case.assumptions)


def test_te_inplace_loss_keeps_the_logits_dtype_gradient_once() -> None:
    # the fused loss saves its [8, 16] fp32 log-softmax (and autograd's detach of it): 512 B
    # as the fused (fp32) kernel; TE's in-place kernel keeps the bf16 logits instead, 8·16·2
    # = 256 B; the int64 labels 8·8 B and the toy's incoming 4 B loss gradient either way
    from attrs import evolve

    from zrt_core.transforms.training import inplace_cross_entropy

    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    logits, labels = _t((8, 16), 30), _t((8,), 31, dtype="int64")
    up, soft, alias = (_t((8, 16), 37, dtype="float32"), _t((8, 16), 32, dtype="float32"),
                       _t((8, 16), 36, dtype="float32"))
    loss = _t((), 33, dtype="float32")
    members = (_node(1, "aten._to_copy.default", Category.COPY, F, (logits,), (up,)),
               _node(2, "aten._log_softmax.default", "loss", F, (up,), (soft,)),
               _node(3, "aten.detach.default", Category.VIEW, F, (soft,), (alias,)),
               _node(4, "aten.nll_loss_forward.default", "loss", F, (soft, labels), (loss,)))
    ce = evolve(_node(0, "fused.cross_entropy", "loss", F, (logits, labels), (soft, loss)),
                fused_from=members)
    bwd = OpGraph(Bk, [_node(0, "fused.cross_entropy_backward", "loss", Bk,
                             (_t((), 35, dtype="float32"), soft, labels, alias),
                             (_t((8, 16), 34),))])
    fwd = OpGraph(F, [ce])
    assert saved_activation_bytes(fwd, bwd) == {0: 8 * 16 * 4 + 8 * 8 + 4}
    f2, b2 = inplace_cross_entropy(fwd, bwd)
    assert saved_activation_bytes(f2, b2) == {0: 8 * 16 * 2 + 8 * 8 + 4}
    # only what is kept changes: the kernels' traffic stays the fused loss's
    assert (f2.nodes[0].bytes, b2.nodes[0].bytes) == (ce.bytes, bwd.nodes[0].bytes)
