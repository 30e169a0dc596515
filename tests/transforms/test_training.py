"""Training transforms on hand-built graphs: weight-gradient marks, recompute, precision
recipes, gradient sync, ZeRO-3 gathers, the optimizer step graph and stage splits — exact
numbers with the arithmetic beside them. No torch."""

from __future__ import annotations

import pytest

from zrt_core.errors import SpecError
from zrt_core.hardware import HardwareSpec
from zrt_core.ir.graph import Category, LayerTemplate, OpGraph, OpNode, Phase, TensorMeta
from zrt_core.modelinfo import ModelDims
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec
from zrt_core.transforms.base import TransformContext
from zrt_core.transforms.training import (
    CORE_ATTENTION_ATTR,
    INPUT_GRAD,
    RECOMPUTE_ATTR,
    WEIGHT_GRAD,
    GradientSync,
    ParamGather,
    Precision,
    Recompute,
    UnfusedAttention,
    add_mtp_layers,
    is_expert_param,
    mark_weight_grads,
    optimizer_graph,
    param_inventory,
    precision_plan,
    split_layer_templates,
    unfused_cross_entropy,
)

H, S, B, FFN = 8, 4, 2, 32  # hidden, sequence, batch, FFN width of the toy layer
TOKENS = B * S


def _hw(**compute: float | None) -> HardwareSpec:
    base = {"fp32": 10, "bf16": 100, "fp16": 100, "fp8": 200, "fp4": None}
    base.update(compute)
    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "toy", "vendor": "nvidia",
        "compute": base,
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [
            {"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2, "devices": 8},
            {"name": "net", "bandwidth_gb_per_s": 25, "latency_us": 5, "devices": None}],
    })


def _dims() -> ModelDims:
    return ModelDims(model_type="toy", hidden=H, layers=2, heads=2, kv_heads=2, head_dim=4,
                     ffn=FFN, vocab=16)


def _ctx(parallel: Parallel | None = None, hw: HardwareSpec | None = None,
         train: TrainSpec | None = None) -> TransformContext:
    return TransformContext(dims=_dims(), hardware=hw or _hw(),
                            parallel=parallel or Parallel(), host=get_plugin_manager(
                                autoload=False),
                            train=train or TrainSpec(micro_batch=B, global_batch=8, seq_len=S))


def _t(shape: tuple[int, ...], tid: int | None, param: str | None = None,
       dtype: str = "bfloat16") -> TensorMeta:
    return TensorMeta(shape=shape, dtype=dtype, tensor_id=tid, param=param)


def _node(nid: int, op: str, category: str, phase: str, inputs, outputs, *, layer=0,
          flops: int = 0, **attrs) -> OpNode:
    read = sum(t.nbytes for t in inputs)
    written = sum(t.nbytes for t in outputs)
    return OpNode(id=nid, op=op, category=category, phase=phase, inputs=inputs,
                  outputs=outputs, module_path=f"layers.{layer}.mlp", layer_index=layer,
                  layer_kind="dense" if layer is not None else None, flops=flops,
                  bytes_read=read, bytes_written=written, formula=op, attrs=attrs)


def _graphs() -> tuple[OpGraph, OpGraph]:
    """One layer (template of 2): x → up (H×FFN) → gelu → down (FFN×H), and its backward."""
    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    x, up_w, h1, act, down_w, y = (_t((TOKENS, H), 1), _t((H, FFN), 2, "layers.0.up.weight"),
                                   _t((TOKENS, FFN), 3), _t((TOKENS, FFN), 4),
                                   _t((FFN, H), 5, "layers.0.down.weight"), _t((TOKENS, H), 6))
    fwd = [
        _node(0, "aten.mm.default", Category.MATMUL, F, (x, up_w), (h1,),
              flops=2 * TOKENS * H * FFN, seq_nr=1),
        _node(1, "aten.gelu.default", Category.ELEMENTWISE, F, (h1,), (act,), seq_nr=2),
        _node(2, "aten.mm.default", Category.MATMUL, F, (act, down_w), (y,),
              flops=2 * TOKENS * FFN * H, seq_nr=3),
    ]
    dy, dact, dh1, dx = (_t((TOKENS, H), 10), _t((TOKENS, FFN), 11), _t((TOKENS, FFN), 12),
                         _t((TOKENS, H), 13))
    bwd = [
        _node(0, "aten.mm.default", Category.MATMUL, Bk, (dy, _t((H, FFN), 5,
              "layers.0.down.weight")), (dact,), fwd_seq_nr=3),
        _node(1, "aten.mm.default", Category.MATMUL, Bk, (_t((FFN, TOKENS), 4), dy),
              (_t((FFN, H), 14),), fwd_seq_nr=3),
        _node(2, "aten.gelu_backward.default", Category.ELEMENTWISE, Bk, (dact, h1), (dh1,),
              fwd_seq_nr=2),
        _node(3, "aten.mm.default", Category.MATMUL, Bk, (dh1, _t((FFN, H), 2,
              "layers.0.up.weight")), (dx,), fwd_seq_nr=1),
        _node(4, "aten.mm.default", Category.MATMUL, Bk, (_t((H, TOKENS), 1), dh1),
              (_t((H, FFN), 15),), fwd_seq_nr=1),
    ]
    templates = [LayerTemplate("dense", 0, (0, 1))]
    meta = {"batch": B, "seq_len": S}
    return (OpGraph(F, fwd, [(0, 1), (1, 2)], templates, meta),
            OpGraph(Bk, bwd, [(0, 2), (2, 3), (2, 4)], templates, meta))


# -- weight gradients ------------------------------------------------------------------------


def test_weight_gradient_gemms_are_marked_by_their_forward_weight() -> None:
    fwd, bwd = _graphs()
    marks = [n.attrs.get("grad") for n in mark_weight_grads(fwd, bwd).nodes]
    # dX = dY·Wᵀ reads the weight; dW = Xᵀ·dY writes the weight's shape (FFN×H, H×FFN)
    assert marks == [INPUT_GRAD, WEIGHT_GRAD, None, INPUT_GRAD, WEIGHT_GRAD]


# -- recompute ---------------------------------------------------------------------------------


def test_full_recompute_reruns_the_layer_forward_before_its_backward() -> None:
    fwd, bwd = _graphs()
    out = Recompute("full", fwd).apply(bwd, _ctx())
    assert len(out.nodes) == len(bwd.nodes) + len(fwd.nodes)
    copies = out.nodes[:3]
    assert [n.op for n in copies] == [n.op for n in fwd.nodes]
    assert all(n.attrs[RECOMPUTE_ATTR] and n.phase == Phase.TRAIN_BACKWARD for n in copies)
    assert len({n.id for n in out.nodes}) == len(out.nodes)
    # the backward now reads the recomputed gelu input (tensor 3) and activation (tensor 4)
    recomputed = {t.tensor_id for n in copies for t in n.outputs}
    reads = {t.tensor_id for n in out.nodes[3:] for t in n.inputs}
    assert 3 not in reads and 4 not in reads
    assert reads & recomputed
    # the layer input (tensor 1) is the checkpoint: still read from the forward
    assert 1 in {t.tensor_id for n in out.nodes for t in n.inputs}
    assert out.meta["recompute"] == "full"


def test_selective_recompute_reruns_only_the_attention_core() -> None:
    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    q = _t((1, 2, S, 4), 1)
    out, lse = _t((1, S, 2, 4), 2), _t((1, 2, S), 3, dtype="float32")
    fwd = OpGraph(F, [
        _node(0, "aten.mm.default", Category.MATMUL, F, (_t((S, H), 9), _t((H, H), 8, "w")),
              (_t((S, H), 7),), seq_nr=1),
        _node(1, "zrt.attention.default", Category.ATTENTION, F, (q, q, q), (out, lse),
              seq_nr=2, is_causal=True)], templates=[LayerTemplate("dense", 0, (0,))])
    bwd = OpGraph(Bk, [
        _node(0, "zrt.attention_backward.default", Category.ATTENTION, Bk,
              (_t((1, S, 2, 4), 20), q, q, q, out, lse), (_t((1, 2, S, 4), 21),),
              fwd_seq_nr=2, is_causal=True)], templates=[LayerTemplate("dense", 0, (0,))])
    got = Recompute("selective", fwd).apply(bwd, _ctx())
    assert [n.op for n in got.nodes] == ["zrt.attention.default",
                                         "zrt.attention_backward.default"]
    # the backward reads the recomputed output and softmax statistics
    read = {t.tensor_id for t in got.nodes[1].inputs}
    assert 2 not in read and 3 not in read


def test_recompute_none_is_the_identity_and_unknown_modes_fail() -> None:
    fwd, bwd = _graphs()
    assert Recompute("none", fwd).apply(bwd, _ctx()) is bwd
    with pytest.raises(SpecError, match="unknown recompute mode"):
        Recompute("half", fwd).apply(bwd, _ctx())


def test_unfused_attention_counts_the_full_square_and_keeps_five_bytes_per_score() -> None:
    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    b, h, s, d = 2, 3, 16, 8
    q = _t((b, h, s, d), 1)
    fwd = OpGraph(F, [_node(0, "zrt.attention.default", Category.ATTENTION, F, (q, q, q),
                            (_t((b, s, h, d), 2), _t((b, h, s), 3, dtype="float32")),
                            seq_nr=5, is_causal=True)])
    bwd = OpGraph(Bk, [_node(0, "zrt.attention_backward.default", Category.ATTENTION, Bk,
                             (_t((b, s, h, d), 9), q, q, q), (_t((b, h, s, d), 10),
                                                              _t((b, h, s, d), 11),
                                                              _t((b, h, s, d), 12)),
                             fwd_seq_nr=5, is_causal=True)])
    f2, b2 = UnfusedAttention(dropout=0.1).apply_pair(fwd, bwd)
    assert [n.op for n in f2.nodes] == ["aten.baddbmm.default", "fused.scale_mask_softmax",
                                        "aten.native_dropout.default", "aten.bmm.default"]
    assert all(n.attrs[CORE_ATTENTION_ATTR] for n in f2.nodes)
    # QKᵀ and PV over the full square: 2 · (b·h) · s · s · d = 2 · 6 · 16 · 16 · 8 = 24576
    assert [n.flops for n in f2.nodes if n.category == Category.MATMUL] == [24576, 24576]
    # backward: dP, dV, dQ, dK — four GEMMs of the same size
    assert sum(n.flops for n in b2.nodes if n.category == Category.MATMUL) == 4 * 24576
    # kept for backward: softmax output (2 B), dropout mask (1 B), dropped probabilities
    # (2 B) per score: 5 · b·h·s² = 5 · 2 · 3 · 256 = 7680 bytes
    produced = {t.tensor_id for n in b2.nodes for t in n.outputs}
    kept = {t.tensor_id: t.nbytes for n in b2.nodes for t in n.inputs
            if t.tensor_id not in produced and t.tensor_id not in (1, 9)}
    assert sum(kept.values()) == 7680
    # every batched GEMM writes [b, heads, s, d] — the PV product too, though the fused
    # node's output was [b, s, heads, d]: b·h = 6 products of 16 × 8, not 32 of 3 × 8
    from zrt_core.cost.opdims import gemm_dims

    for n in (*f2.nodes, *b2.nodes):
        if n.category == Category.MATMUL:
            g = gemm_dims(n)
            assert g.batch * g.m * g.n == b * h * s * (s if n.outputs[0].shape[-1] == s
                                                       else d)
            assert g.batch == b * h and g.m == s
    assert [n.outputs[0].shape for n in f2.nodes][-1] == (b, h, s, d)
    assert f2.nodes[-1].outputs[0].tensor_id == 2


def test_megatron_cross_entropy_runs_fp32_passes_over_the_logits() -> None:
    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    logits, labels = _t((TOKENS, 16), 30), _t((TOKENS,), 31, dtype="int64")
    soft, loss = _t((TOKENS, 16), 32, dtype="float32"), _t((), 33, dtype="float32")
    fwd = OpGraph(F, [_node(0, "fused.cross_entropy", "loss", F, (logits, labels),
                            (soft, loss), layer=None)])
    grad = _t((TOKENS, 16), 34)
    bwd = OpGraph(Bk, [_node(0, "fused.cross_entropy_backward", "loss", Bk,
                             (_t((), 35, dtype="float32"), soft, labels), (grad,),
                             layer=None)])
    f2, b2 = unfused_cross_entropy(fwd, bwd)
    assert [n.op for n in f2.nodes] == ["megatron.ce.to_float", "megatron.ce.max",
                                        "megatron.ce.sub_max", "megatron.ce.exp",
                                        "megatron.ce.sum", "megatron.ce.softmax"]
    # 8 × 16 = 128 logits: 38 bytes each forward (2 + 4 read, 4 written by the cast; ...)
    assert sum(n.bytes for n in f2.nodes) == 38 * 128
    assert sum(n.bytes for n in b2.nodes) == 14 * 128
    # the chain keeps the fused node's tensors at its ends and is wired in order
    assert f2.nodes[0].inputs == (logits, labels) and f2.nodes[-1].outputs == (soft, loss)
    assert b2.nodes[-1].outputs == (grad,)
    assert list(f2.edges) == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]



def test_megatron_cross_entropy_keeps_the_softmax_once() -> None:
    # autograd saves a detach of the log-softmax; the fused node made that view, and the
    # unfused chain keeps it as one, so the saved fp32 [8, 16] softmax counts once:
    # 8·16·4 B = 512 B, beside the int64 labels 8·8 B = 64 B (the alias counted apart would
    # add another 512 B); the toy backward reads its incoming fp32 loss gradient (4 B) without
    # making it
    from attrs import evolve

    from zrt_core.estimate.training import saved_activation_bytes

    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    logits, labels = _t((TOKENS, 16), 30), _t((TOKENS,), 31, dtype="int64")
    up, soft, alias = (_t((TOKENS, 16), 37, dtype="float32"),
                       _t((TOKENS, 16), 32, dtype="float32"),
                       _t((TOKENS, 16), 36, dtype="float32"))
    loss = _t((), 33, dtype="float32")
    members = (_node(1, "aten._to_copy.default", Category.COPY, F, (logits,), (up,),
                     layer=None),
               _node(2, "aten._log_softmax.default", "loss", F, (up,), (soft,), layer=None),
               _node(3, "aten.detach.default", Category.VIEW, F, (soft,), (alias,),
                     layer=None),
               _node(4, "aten.nll_loss_forward.default", "loss", F, (soft, labels), (loss,),
                     layer=None))
    ce = evolve(_node(0, "fused.cross_entropy", "loss", F, (logits, labels), (soft, loss),
                      layer=None), fused_from=members)
    bwd = OpGraph(Bk, [_node(0, "fused.cross_entropy_backward", "loss", Bk,
                             (_t((), 35, dtype="float32"), soft, labels, alias),
                             (_t((TOKENS, 16), 34),), layer=None)])
    f2, b2 = unfused_cross_entropy(OpGraph(F, [ce]), bwd)
    assert saved_activation_bytes(f2, b2) == {"head": TOKENS * 16 * 4 + TOKENS * 8 + 4}


# -- precision -----------------------------------------------------------------------------


def test_fp8_runs_linear_gemms_in_e4m3_with_e5m2_gradients_and_one_cast_per_tensor() -> None:
    fwd, bwd = _graphs()
    plan = precision_plan("fp8", _hw())
    assert (plan.recipe, plan.gemm_dtype, plan.grad_dtype) == ("fp8", "float8_e4m3fn",
                                                               "float8_e5m2")
    f8 = Precision(plan).apply(fwd, _ctx())
    gemms = [n for n in f8.nodes if n.category == Category.MATMUL]
    assert all(t.dtype == "float8_e4m3fn" for n in gemms for t in n.inputs)
    casts = [n for n in f8.nodes if n.op == "precision.quantize"]
    # x (8×8) and the gelu output (8×32) are cast: read 2 B, write row- and column-wise 1 B
    assert [(c.bytes_read, c.bytes_written) for c in casts] == [(128, 128), (512, 512)]
    b8 = Precision(plan, forward=fwd).apply(mark_weight_grads(fwd, bwd), _ctx())
    dgrad = b8.nodes[1]  # dact = dY·Wᵀ after dY's cast
    assert [t.dtype for t in dgrad.inputs] == ["float8_e5m2", "float8_e4m3fn"]
    # the backward casts only output gradients (dY, dh1); saved inputs were cast in forward
    assert sum(n.op == "precision.quantize" for n in b8.nodes) == 2


def test_fp8_leaves_the_moe_router_in_the_model_dtype() -> None:
    # Megatron-Core's TopKRouter runs router_gating_linear (F.linear in the activation dtype,
    # or --moe-router-dtype), not a TransformerEngine Linear: fp8_autocast never reaches it
    from attrs import evolve

    F = Phase.TRAIN_FORWARD
    x, gate_w, logits = _t((TOKENS, H), 1), _t((H, 4), 2, "layers.0.mlp.gate.weight"), \
        _t((TOKENS, 4), 3)
    router = evolve(_node(0, "aten.mm.default", Category.MATMUL, F, (x, gate_w), (logits,),
                          flops=2 * TOKENS * H * 4, seq_nr=1),
                    module_path="layers.0.mlp.gate", module_class="Linear")
    fwd, _ = _graphs()
    graph = OpGraph(F, [router, *[evolve(n, id=n.id + 1) for n in fwd.nodes]])
    f8 = Precision(precision_plan("fp8", _hw())).apply(graph, _ctx())
    gemms = [n for n in f8.nodes if n.category == Category.MATMUL]
    assert [t.dtype for t in gemms[0].inputs] == ["bfloat16", "bfloat16"]
    assert all(t.dtype == "float8_e4m3fn" for n in gemms[1:] for t in n.inputs)


def test_block_scaled_recipes_need_blackwell_units_and_fall_back_with_a_note() -> None:
    hopper = _hw()
    assert precision_plan("mxfp8", hopper).recipe == "fp8"
    assert "mxfp8 runs as fp8" in precision_plan("mxfp8", hopper).note
    assert precision_plan("nvfp4", hopper).recipe == "fp8"
    ampere = _hw(fp8=None)
    plan = precision_plan("fp8", ampere)
    assert (plan.recipe, plan.low_precision) == ("bf16", False)
    assert "no fp8 tensor cores" in plan.note
    blackwell = _hw(fp4=400)
    mx = precision_plan("mxfp8", blackwell)
    # one E8M0 scale per 32 values: 1024 values → 1024 + 32 bytes
    assert (mx.recipe, mx.quantized_bytes(1024, "mxfp8")) == ("mxfp8", 1056.0)
    nv = precision_plan("nvfp4", blackwell)
    # E2M1 is half a byte, one E4M3 scale per 16 values: 1024 values → 512 + 64 bytes
    assert (nv.recipe, nv.quantized_bytes(1024, "nvfp4")) == ("nvfp4", 576.0)


def test_per_tensor_fp8_writes_no_transposed_copy_on_blackwell_and_block_scaling_does(
        ) -> None:
    # TransformerEngine creates the transposed FP8 copy only where FP8 GEMMs take the TN
    # layout alone (quantizer.cpp: create_transpose = columnwise_usage &&
    # !nvte_is_non_tn_fp8_gemm_supported(), true from SM 10.0): Hopper writes two copies,
    # datacenter Blackwell (fp4 units) one; MXFP8's column-scaled copy stays
    fwd, _bwd = _graphs()
    blackwell = _hw(fp4=400)
    assert (precision_plan("fp8", _hw()).copies, precision_plan("fp8", blackwell).copies,
            precision_plan("fp8_cs", blackwell).copies,
            precision_plan("mxfp8", blackwell).copies) == (2, 1, 1, 2)
    casts = [n for n in Precision(precision_plan("fp8_cs", blackwell)).apply(fwd, _ctx()).nodes
             if n.op == "precision.quantize"]
    # x (8×8 bf16): the amax pass and the cast read 2 × 128 B, one 64 B copy written; the
    # gelu output (8×32): its amax comes from the activation kernel, 1 × 512 B read, 256 B
    assert [(c.bytes_read, c.bytes_written) for c in casts] == [(256, 64), (512, 256)]
    mx = [n for n in Precision(precision_plan("mxfp8", blackwell)).apply(fwd, _ctx()).nodes
          if n.op == "precision.quantize"]
    # two copies of 64 values + 2 E8M0 scales each = 132 B; of 256 values + 8 scales = 528 B
    assert [(c.bytes_read, c.bytes_written) for c in mx] == [(128, 132), (512, 528)]


def test_nvfp4_casts_read_three_times_and_hadamard_transform_the_weight_gradient_copy(
        ) -> None:
    fwd, _bwd = _graphs()
    plan = precision_plan("nvfp4", _hw(fp4=400))
    # the amax pass (the per-tensor fp32 scale), the cast, the column-wise RHT cast
    assert (plan.amax_pass, plan.hadamard, plan.cast_reads) == (True, True, 3)
    casts = [n for n in Precision(plan).apply(fwd, _ctx()).nodes
             if n.op == "precision.quantize"]
    # x (8×8 bf16): read 3 × 128 B; written 2 × (64 values × 0.5 B + 4 scales × 1 B) = 72 B;
    # FLOPs 3 (scale, round, amax) + 32 (16-point Hadamard) per value. The gelu output
    # (8×32): its amax comes from the activation kernel (TE's fused act-amax), so 2 reads
    # (cast, Hadamard cast) × 512 B = 1024 B; written 2 × (256 × 0.5 + 16 scales) = 288 B
    assert [(c.bytes_read, c.bytes_written, c.flops) for c in casts] == [
        (384, 72, 64 * 35), (1024, 288, 256 * 35)]


def test_a_frozen_weights_casts_write_the_row_wise_copy_alone() -> None:
    # TE's Linear asks for column-wise copies only for the weight gradient (input quantizer
    # columnwise = weight.requires_grad; grad output columnwise dropped without wgrad)
    from zrt_core.transforms.training import rowwise_only

    fwd, _bwd = _graphs()
    nvfp4 = [n for n in Precision(precision_plan("nvfp4", _hw(fp4=400))).apply(
        fwd, _ctx()).nodes if n.op == "precision.quantize"]
    # x (8×8): 384 B read, 72 B written, 64·35 FLOPs (test above); row-wise alone drops the
    # Hadamard cast's read (128 B) and FLOPs (64·32) and one copy: 256 B, 36 B, 64·3
    row = rowwise_only(nvfp4[0])
    assert (row.bytes_read, row.bytes_written, row.flops) == (256, 36, 64 * 3)
    fp8 = [n for n in Precision(precision_plan("fp8", _hw())).apply(fwd, _ctx()).nodes
           if n.op == "precision.quantize"]
    # Hopper fp8: (128, 128) -> the 64 B row-wise copy alone
    assert (rowwise_only(fp8[0]).bytes_read, rowwise_only(fp8[0]).bytes_written) == (128, 64)
    # Blackwell fp8 writes one copy already; a GEMM is not a cast: both returned as they are
    blackwell = Precision(precision_plan("fp8", _hw(fp4=400))).apply(fwd, _ctx())
    one = next(n for n in blackwell.nodes if n.op == "precision.quantize")
    assert rowwise_only(one) is one and rowwise_only(fwd.nodes[0]) is fwd.nodes[0]


def test_layers_kept_in_bf16_get_a_template_of_their_own_and_no_casts() -> None:
    fwd, bwd = _graphs()  # one template standing for layers 0 and 1
    f2, b2 = split_layer_templates(fwd, bwd, {1})
    assert {r: t.indices for r, t in f2.templates.items()} == {0: (0,), 1: (1,)}
    assert {r: t.indices for r, t in b2.templates.items()} == {0: (0,), 1: (1,)}
    # the copy follows the representative: same work, fresh ids, its own weights
    copy = [n for n in f2.nodes if n.layer_index == 1]
    assert [n.op for n in copy] == [n.op for n in fwd.nodes]
    assert sum(n.flops for n in copy) == sum(n.flops for n in fwd.nodes)
    assert {n.id for n in copy}.isdisjoint(n.id for n in fwd.nodes)
    assert copy[0].inputs[1].param == "layers.0.up.weight@1"
    assert copy[0].outputs[0].tensor_id not in {t.tensor_id for n in fwd.nodes
                                                for t in n.outputs}
    # the copy's backward reads the copy's saved activation (the gelu output, tensor 4)
    saved = next(t for n in fwd.nodes for t in n.outputs if t.tensor_id == 4)
    renamed = next(t for n in copy for t in n.outputs if t.shape == saved.shape
                   and n.op == "aten.gelu.default")
    wgrad = [n for n in b2.nodes if n.layer_index == 1][1]
    assert wgrad.inputs[0].tensor_id == renamed.tensor_id
    assert wgrad.attrs["fwd_seq_nr"] == 3 + 10_000_000
    # the whole model's work is unchanged: each layer is still run once
    assert sum(n.flops * f2.multiplicity(n) for n in f2.nodes) == \
        sum(n.flops * fwd.multiplicity(n) for n in fwd.nodes)
    # under nvfp4 with layer 1 kept in bf16, only layer 0 casts and runs fp4 GEMMs
    plan = precision_plan("nvfp4", _hw(fp4=400), high_precision_layers=(1,))
    q = Precision(plan).apply(f2, _ctx())
    assert {n.layer_index for n in q.nodes if n.op == "precision.quantize"} == {0}
    assert {(n.layer_index, n.inputs[0].dtype) for n in q.nodes
            if n.category == Category.MATMUL} == {(0, "nvfp4"), (1, "bfloat16")}
    # nothing to split: every template on one side
    assert split_layer_templates(fwd, bwd, {0, 1}) == (fwd, bwd)


def _with_head(fwd: OpGraph, bwd: OpGraph) -> tuple[OpGraph, OpGraph]:
    """The toy layer plus an LM head after it (forward) and its backward before the layers."""
    F, Bk = Phase.TRAIN_FORWARD, Phase.TRAIN_BACKWARD
    y, w, logits = _t((TOKENS, H), 6), _t((H, 16), 20, "lm_head.weight"), _t((TOKENS, 16), 21)
    head = _node(10, "aten.mm.default", Category.MATMUL, F, (y, w), (logits,), layer=None,
                 flops=2 * TOKENS * H * 16, seq_nr=9)
    dlogits, dy = _t((TOKENS, 16), 22), _t((TOKENS, H), 10)
    head_b = _node(10, "aten.mm.default", Category.MATMUL, Bk, (dlogits, w), (dy,),
                   layer=None, flops=2 * TOKENS * H * 16, fwd_seq_nr=9)
    return (fwd.with_nodes([*fwd.nodes, head], [*fwd.edges, (2, 10)]),
            bwd.with_nodes([head_b, *bwd.nodes], [(10, 0), *bwd.edges]))


def test_mtp_modules_are_copies_of_a_layer_with_their_own_head() -> None:
    fwd, bwd = _with_head(*_graphs())  # layers 0 and 1 of one template, then the head
    f2, b2, new = add_mtp_layers(fwd, bwd, ["dense"], 2, shared_weights=True)
    assert new == (2, 3)
    assert {r: t.indices for r, t in f2.templates.items()} == {0: (0, 1), 2: (2,), 3: (3,)}
    layer_flops = sum(n.flops for n in fwd.nodes if n.layer_index == 0)
    head_flops = 2 * TOKENS * H * 16
    # two more layers and two more heads, forward and backward
    assert sum(n.flops * f2.multiplicity(n) for n in f2.nodes) == \
        4 * layer_flops + 3 * head_flops
    # (the toy backward counts only its head's FLOPs)
    assert sum(n.flops * b2.multiplicity(n) for n in b2.nodes) == 3 * head_flops
    # forward: decoder layers, MTP layers, the main head, the MTP heads
    assert [n.layer_index for n in f2.nodes] == [0, 0, 0, 2, 2, 2, 3, 3, 3, None, None, None]
    # backward: the heads' backward first, then MTP layers (last first), then the decoder's
    assert [n.layer_index for n in b2.nodes][:3] == [None, None, None]
    assert [n.layer_index for n in b2.nodes][3:13] == [3] * 5 + [2] * 5
    # repeated layer: both depths use one block's weights; the LM head is the shared one
    params = {t.param for n in f2.nodes for t in n.inputs if t.param}
    assert params == {"layers.0.up.weight", "layers.0.down.weight", "layers.0.up.weight@mtp",
                      "layers.0.down.weight@mtp", "lm_head.weight"}
    # a copy's backward reads the copy's saved activation, not the decoder layer's
    gelu2 = next(n for n in f2.nodes if n.layer_index == 2 and n.op == "aten.gelu.default")
    wgrad2 = [n for n in b2.nodes if n.layer_index == 2][1]
    assert wgrad2.inputs[0].tensor_id == gelu2.outputs[0].tensor_id != 4
    assert add_mtp_layers(fwd, bwd, ["dense"], 0) == (fwd, bwd, ())
    with pytest.raises(SpecError, match="not among the captured templates"):
        add_mtp_layers(fwd, bwd, ["moe"], 1)


# -- data parallelism and ZeRO ---------------------------------------------------------------


def test_gradient_sync_reduces_each_layer_over_dp_in_fp32() -> None:
    fwd, bwd = _graphs()
    p = Parallel(dp=4)
    inv = param_inventory(fwd, p, _dims())
    assert inv.layers[0].dense == H * FFN + FFN * H == 512
    out = GradientSync(inv, "float32", sharded=False).apply(bwd, _ctx(p))
    colls = [n for n in out.nodes if n.category == Category.COLLECTIVE]
    assert len(colls) == 1
    c = colls[0]
    # 512 gradients × 4 bytes = 2048 bytes, all-reduced over the 4 DP ranks after the layer
    assert (c.op, c.attrs["group"], c.attrs["group_size"], c.attrs["bytes"],
            c.attrs["overlap"]) == ("comm.all_reduce", "dp", 4, 2048.0, "backward")
    assert out.nodes[-1] is c and c.layer_index == 0  # runs once per layer of the template
    sharded = GradientSync(inv, "float32", sharded=True).apply(bwd, _ctx(p))
    assert [n.op for n in sharded.nodes if n.category == Category.COLLECTIVE] == [
        "comm.reduce_scatter"]
    assert GradientSync(inv, "float32", sharded=False).apply(bwd, _ctx()) is bwd  # dp = 1


def test_zero3_gathers_each_layer_before_it_runs_and_prefetches() -> None:
    fwd, _ = _graphs()
    p = Parallel(dp=2)
    inv = param_inventory(fwd, p, _dims())
    out = ParamGather(inv, "bfloat16").apply(fwd, _ctx(p))
    first = out.nodes[0]
    # 512 bf16 weights = 1024 bytes gathered over dp before the layer's first op
    assert (first.op, first.attrs["bytes"], first.attrs["overlap"]) == (
        "comm.all_gather", 1024.0, "prefetch")
    assert {(first.id, n.id) for n in out.nodes if n.category == Category.MATMUL} <= \
        set(out.edges)


def test_rule_based_sharding_when_no_parallel_transform_ran() -> None:
    fwd, _ = _graphs()
    inv = param_inventory(fwd, Parallel(tp=2), _dims())
    # both weights split over tp: (8×32 + 32×8) / 2 = 256
    assert inv.layers[0].dense == 256
    assert is_expert_param("model.layers.3.mlp.experts.gate_up_proj")
    assert not is_expert_param("model.layers.3.mlp.shared_experts.gate_proj")


def test_adam_step_reads_and_writes_thirty_bytes_per_local_element() -> None:
    fwd, _ = _graphs()
    p = Parallel(dp=4)
    inv = param_inventory(fwd, p, _dims())
    plan = precision_plan("bf16", _hw())
    tpl = {0: LayerTemplate("dense", 0, (0, 1))}
    train = TrainSpec(micro_batch=B, global_batch=8, seq_len=S, zero=1)
    g = optimizer_graph(inv, tpl, [0, 1], p, train, first=False, last=False, plan=plan)
    adam = next(n for n in g.nodes if n.op == "optimizer.adam")
    # ZeRO-1: 512 / 4 = 128 elements; read master + m + v (12) + fp32 grad (4) = 16 B,
    # write master + m + v (12) + bf16 weight (2) = 14 B per element
    assert (adam.bytes_read, adam.bytes_written) == (128 * 16, 128 * 14)
    assert g.multiplicity(adam) == 2  # once per layer of the template on this rank
    gather = next(n for n in g.nodes if n.category == Category.COLLECTIVE)
    # the updated bf16 weights (512 × 2 B) all-gathered under the next step's forward
    assert (gather.op, gather.attrs["bytes"], gather.attrs["overlap"]) == (
        "comm.all_gather", 1024.0, "next_step")
    plain = optimizer_graph(inv, tpl, [0, 1], p, evolve_zero(train, 0), first=False,
                            last=False, plan=plan)
    assert next(n for n in plain.nodes if n.op == "optimizer.adam").bytes_read == 512 * 16
    assert not [n for n in plain.nodes if n.category == Category.COLLECTIVE]


def evolve_zero(train: TrainSpec, zero: int) -> TrainSpec:
    from attrs import evolve

    return evolve(train, zero=zero)


def test_frozen_weights_stored_quantized_are_never_cast() -> None:
    # fp8 on the toy Hopper: each step casts the layer's 512 weights (2 × 8×32): 1024 B
    # read, row- and column-wise e4m3 copies 2 × 512 B written. A frozen 16-bit weight is
    # cast too (TE re-quantizes it on each step's first micro-batch); one stored quantized
    # (fp8_model_init, or quantized once before training) leaves nothing to cast, while a
    # trained one is still written by the optimizer in fp8
    from attrs import evolve

    fwd, _ = _graphs()
    p = Parallel()
    inv = param_inventory(fwd, p, _dims())
    frozen = evolve(inv, trainable=param_inventory(fwd.with_nodes((), ()), p, _dims()))
    tpl = {0: LayerTemplate("dense", 0, (0,))}
    kw = dict(first=False, last=False, plan=precision_plan("fp8", _hw()))
    base = TrainSpec(micro_batch=B, global_batch=8, seq_len=S, precision="fp8",
                     freeze_language_model=True)

    def casts(inventory, train):
        g = optimizer_graph(inventory, tpl, [0], p, train, **kw)
        return [(n.bytes_read, n.bytes_written) for n in g.nodes
                if n.op == "precision.weight_cast"]

    assert casts(frozen, base) == [(1024, 1024)]
    assert casts(frozen, evolve(base, quantized_params=True)) == []
    trained = evolve(base, freeze_language_model=False, quantized_params=True)
    assert casts(inv, trained) == [(1024, 1024)]


def test_muon_orthogonalises_two_dimensional_weights_with_newton_schulz() -> None:
    fwd, _ = _graphs()
    p = Parallel()
    inv = param_inventory(fwd, p, _dims())
    train = TrainSpec(micro_batch=B, global_batch=8, seq_len=S, optimizer="muon")
    g = optimizer_graph(inv, {0: LayerTemplate("dense", 0, (0,))}, [0], p, train,
                        first=False, last=False, plan=precision_plan("bf16", _hw()))
    ns = [n for n in g.nodes if n.category == Category.MATMUL]
    # two 8×32 matrices, 5 iterations of 3 GEMMs; per iteration 4m²n + 2m³ with m=8, n=32:
    # 4·64·32 + 2·512 = 9216 FLOPs per matrix
    assert len(ns) == 2 * 5 * 3
    assert sum(n.flops for n in ns) == 2 * 5 * 9216


def test_offloaded_states_move_over_the_host_link() -> None:
    fwd, _ = _graphs()
    p = Parallel()
    inv = param_inventory(fwd, p, _dims())
    train = TrainSpec(micro_batch=B, global_batch=8, seq_len=S, offload_optimizer=True)
    kw = dict(first=False, last=False, plan=precision_plan("bf16", _hw()))
    with pytest.raises(SpecError, match="host link"):
        optimizer_graph(inv, {0: LayerTemplate("dense", 0, (0,))}, [0], p, train, **kw)
    g = optimizer_graph(inv, {0: LayerTemplate("dense", 0, (0,))}, [0], p, train,
                        host_link_gb_per_s=32.0, **kw)
    d2h = next(n for n in g.nodes if n.op == "offload.d2h")
    # 512 fp32 gradients = 2048 bytes at 32 GB/s = 64 ns
    assert d2h.attrs["host_link_s"] == pytest.approx(2048 / 32e9)
