"""Nemotron-H's Mamba-2 mixers under tensor parallelism, as Megatron's MambaMixer and vLLM's
MambaMixer2 split them: by heads. ``in_proj`` is column-parallel over every part it packs
(z, x, B, C, dt), the depthwise conv over its channels, A/D/dt_bias and the gated norm by
heads, ``out_proj`` row-parallel; the SSM and convolution states a decode step carries hold
the rank's heads only.

Tiny mixer: hidden 128, 8 heads of 16, 4 groups, state 16, conv 4, chunk 8; layers "M*M-"
(two mixers, one attention layer of 4 heads / 2 KV heads of 32, one MLP of 256).
d_inner = 8·16 = 128, conv channels = 128 + 2·4·16 = 256, in_proj = 128 + 256 + 8 = 392
outputs. Captured at batch 1 × 16 tokens, rescaled to batch 2 (what estimation does).
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.errors import LayoutError
from zrt_core.estimate.captures import CapturedModel
from zrt_core.estimate.memory import cache_states, kv_cache_size
from zrt_core.estimate.serving import Rescale
from zrt_core.ir.graph import Category, OpGraph, Phase
from zrt_core.modelinfo import ModelDims
from zrt_core.plugins import get_plugin_manager
from zrt_core.strategy import Parallel, TrainSpec, check_layout
from zrt_core.transforms.base import TransformContext
from zrt_core.transforms.parallel import ParallelTransform, TPPlan, apply_phases

MAMBA = dict(model_type="nemotron_h", hidden_size=128, intermediate_size=256,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             hybrid_override_pattern="M*M-", mamba_num_heads=8, mamba_head_dim=16,
             ssm_state_size=16, n_groups=4, conv_kernel=4, chunk_size=8, vocab_size=512)
B = 2  # sequences per step after the rescale

_CAPTURES: dict[tuple, Any] = {}


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager(autoload=False)


@pytest.fixture(scope="module")
def hardware():
    from zrt_core.hardware import HardwareSpec

    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "toy", "vendor": "toy",
        "compute": {"fp32": 10, "bf16": 80, "fp16": 80},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": None}]})


def _capture(host, phases: tuple[str, ...], batch: int) -> Any:
    from zrt_core.capture.api import capture

    key = (phases, batch)
    if key not in _CAPTURES:
        _CAPTURES[key] = capture(MAMBA, phases=phases, batch=batch, seq_len=16, host=host)
    return _CAPTURES[key]


def _serving(host, hardware, phase: str, tp: int) -> OpGraph:
    r = _capture(host, ("prefill", "decode"), 1)
    cap = CapturedModel.from_capture(r)
    ctx = TransformContext(dims=cap.dims, hardware=hardware,
                           parallel=check_layout(Parallel(tp=tp), cap.dims), host=host)
    rescale = Rescale(B, None)
    g = ParallelTransform(cap.tp_plan, extra_seeds=rescale.seeds,
                          extra_attrs=rescale.attrs).apply(cap.graphs[phase], ctx)
    return rescale.updated_meta(cap.graphs[phase], g)


def _mixer(g: OpGraph, op: str, module: str = "model.layers.0.mixer") -> Any:
    return next(n for n in g.nodes if n.layer_index == 0 and n.op == op
                and n.module_path == module)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_decode_splits_the_mixer_and_its_states_by_heads(host, hardware, tp):
    g = _serving(host, hardware, Phase.DECODE, tp)
    h, groups, conv = 8 // tp, 4 // tp, 256 // tp
    step = _mixer(g, "zrt.ssm_state_update.default")
    state, x = step.inputs[0], step.inputs[1]
    assert state.shape == (B, h, 16, 16) and state.dtype == "float32"
    assert x.shape == (B, h, 16) and step.inputs[4].shape == (B, groups, 16)  # B of the step
    # 5 per state element + 2 per x element: 5·2·h·256 + 2·2·h·16
    assert step.flops == 5 * B * h * 256 + 2 * B * h * 16
    # writes y (bf16) and the whole state (fp32) in place: 2·h·16·2 + 2·h·256·4
    assert step.bytes_written == B * h * 16 * 2 + B * h * 256 * 4
    # in_proj column-parallel over all it packs: 392/tp outputs; 2·B·128·392/tp FLOPs
    in_proj = _mixer(g, "aten.mm.default", "model.layers.0.mixer.in_proj")
    assert in_proj.inputs[1].shape == (128, 392 // tp)
    assert in_proj.flops == 2 * B * 128 * 392 // tp
    # the convolution state: the rank's 256/tp channels by 4 taps, extended by one token
    cat = _mixer(g, "aten.cat.default")
    assert [t.shape for t in cat.inputs] == [(B, conv, 4), (B, conv, 1)]
    conv_node = _mixer(g, "aten.convolution.default")
    assert conv_node.inputs[1].shape == (conv, 1, 4) and conv_node.attrs["groups"] == conv
    # out_proj row-parallel: d_inner 128/tp in, then one all-reduce of B·128 bf16
    out = _mixer(g, "aten.mm.default", "model.layers.0.mixer.out_proj")
    assert out.inputs[1].shape == (128 // tp, 128)
    reduces = [n.attrs["bytes"] for n in g.nodes if n.layer_index == 0
               and n.category == Category.COLLECTIVE]
    assert reduces == ([B * 128 * 2] if tp > 1 else [])


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_state_bytes_per_rank(host, hardware, tp):
    """What a sequence holds per rank: per mixer the SSM state (h·16·16 fp32) and the conv
    state (256/tp channels · 4 taps bf16); the attention layer's K/V grows one row per
    token (2 KV heads of 32 over tp, one whole head per rank at tp 4)."""
    r = _capture(host, ("prefill", "decode"), 1)
    states = cache_states(r.graphs[Phase.DECODE], r.graphs[Phase.PREFILL])
    kv = kv_cache_size(_serving(host, hardware, Phase.DECODE, tp), caches=states)
    per_mixer = (8 // tp) * 16 * 16 * 4 + (256 // tp) * 4 * 2  # 10,240 bytes at tp 1
    assert kv.recurrent_fixed == kv.per_sequence_fixed == 2 * per_mixer
    assert kv.per_token == 2 * max(2 // tp, 1) * 32 * 2  # K and V


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_prefill_scan_per_rank(host, hardware, tp):
    g = _serving(host, hardware, Phase.PREFILL, tp)
    scan = _mixer(g, "zrt.ssd_chunk_scan.default")
    h, groups = 8 // tp, 4 // tp
    assert [t.shape for t in scan.inputs[:5]] == [(B, 16, h, 16), (B, 16, h), (h,),
                                                  (B, 16, groups, 16), (B, 16, groups, 16)]
    assert [t.shape for t in scan.outputs] == [(B, 16, h, 16), (B, h, 16, 16)]
    # per token: h·(4·16·16 + 9·16 + 3·16) + groups·9·16 (chunk 8: q + 1 = 9)
    assert scan.flops == B * 16 * (h * 1216 + groups * 144)
    # the convolution state the prefill leaves: zeros of the rank's channels, then filled
    zeros = _mixer(g, "aten.zeros.default")
    assert zeros.outputs[0].shape == (B, 256 // tp, 4)


def test_training_splits_the_scan_and_its_backward(host, hardware):
    r = _capture(host, ("train_forward", "train_backward"), 2)
    train = TrainSpec(micro_batch=2, global_batch=2, seq_len=16)
    ctx = TransformContext(dims=r.dims, hardware=hardware,
                           parallel=check_layout(Parallel(tp=2), r.dims, train=train),
                           host=host, train=train)
    out = apply_phases(r.graphs, ctx, TPPlan())
    fwd = _mixer(out[Phase.TRAIN_FORWARD], "zrt.ssd_chunk_scan.default")
    bwd = _mixer(out[Phase.TRAIN_BACKWARD], "zrt.ssd_chunk_scan_backward.default")
    assert fwd.flops == 2 * 16 * (4 * 1216 + 2 * 144)  # 4 heads, 2 groups per rank
    assert bwd.flops == 2 * fwd.flops
    # grad_y, the zero gradient of the final states, x: the rank's 4 heads
    assert [t.shape for t in bwd.inputs[:3]] == [(2, 16, 4, 16), (2, 4, 16, 16),
                                                 (2, 16, 4, 16)]
    assert [t.shape for t in bwd.outputs[:5]] == [(2, 16, 4, 16), (2, 16, 4), (4,),
                                                  (2, 16, 2, 16), (2, 16, 2, 16)]
    conv = _mixer(out[Phase.TRAIN_BACKWARD], "aten.convolution_backward.default")
    assert [t.shape for t in conv.outputs] == [(2, 128, 16), (128, 1, 4), (128,)]
    in_proj = [n for n in out[Phase.TRAIN_BACKWARD].nodes if n.layer_index == 0
               and n.module_path.endswith("mixer.in_proj") and n.category == Category.MATMUL]
    # dW [392/2, 128] and dX [32, 128] from the rank's 196 outputs: 2·32·196·128 each
    assert sorted(n.flops for n in in_proj) == [2 * 32 * 196 * 128] * 2


def test_layout_needs_whole_groups():
    dims = ModelDims.from_config(MAMBA)
    assert (dims.mamba_heads, dims.mamba_groups) == (8, 4)
    with pytest.raises(LayoutError, match="Mamba groups"):
        check_layout(Parallel(tp=4), ModelDims.from_config({**MAMBA, "n_groups": 2}))
