"""Quantisation on a tiny captured llama (hidden 128, FFN 256, 4 heads of 32, 2 KV heads,
vocab 512; batch 2 × 16 tokens prefill, one token against 16 cached in decode): dtypes,
bytes and what stays unquantised. bf16 = 2 bytes, fp8 and int8 = 1, int4 and nvfp4 = 0.5.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core.errors import SpecError
from zrt_core.ir.graph import OpGraph, OpNode
from zrt_core.plugins import get_plugin_manager
from zrt_core.transforms.quant import Quantize, kv_dtype_name, scale_bytes

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
_CAPTURE: dict[str, Any] = {}


class _Ctx:
    def __init__(self, host: Any) -> None:
        self.host = host


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager(autoload=False)


@pytest.fixture(scope="module")
def graphs(host):
    if "r" not in _CAPTURE:
        from zrt_core.capture.api import capture

        _CAPTURE["r"] = capture(LLAMA, phases=("prefill", "decode"), batch=2, seq_len=16,
                                host=host)
    return _CAPTURE["r"].graphs


def _node(g: OpGraph, module: str, op: str = "aten.mm.default") -> OpNode:
    return next(n for n in g.nodes if n.layer_index == 0 and n.module_path.endswith(module)
                and n.op == op)


def test_fp8_w8a8_narrows_weights_and_gemm_inputs(host, graphs):
    g = Quantize("fp8").apply(graphs["decode"], _Ctx(host))
    q = _node(g, "q_proj")
    assert [t.dtype for t in q.inputs] == ["float8_e4m3fn", "float8_e4m3fn"]
    assert q.outputs[0].dtype == "bfloat16" and q.attrs["quant"] == "fp8"
    # 2 tokens x 128 fp8 + 128 x 128 fp8 weight + 2 x 128 bf16 out = 256 + 16384 + 512
    assert q.bytes == 17_152
    # the norm writes the GEMMs' fp8 input itself (quantisation fused into the producer)
    norm_out = next(n for n in g.nodes if n.layer_index == 0 and
                    n.module_path.endswith("input_layernorm") and n.op == "aten.mul.Tensor"
                    and n.outputs[0].dtype == "float8_e4m3fn")
    assert norm_out.outputs[0].shape == (2, 1, 128)
    assert not any(n.op == "zrt.quantize" for n in g.nodes)
    # the LM head stays bf16 (ModelOpt excludes it)
    head = next(n for n in g.nodes if n.module_path == "lm_head" and n.op == "aten.mm.default")
    assert {t.dtype for t in head.inputs} == {"bfloat16"} and "quant" not in head.attrs


def test_weight_only_int4_keeps_bf16_activations_and_reads_group_scales(host, graphs):
    g = Quantize("int4").apply(graphs["decode"], _Ctx(host))
    q0 = _node(graphs["decode"], "q_proj")
    q = _node(g, "q_proj")
    assert [t.dtype for t in q.inputs] == ["bfloat16", "int4"]
    # weight 128 x 128: bf16 32768 -> int4 8192 bytes, plus one fp16 scale per 128
    # weights: 16384 / 128 x 2 = 256
    assert q0.bytes_read - q.bytes_read == 32_768 - 8192 - 256
    assert q.flops == q0.flops


def test_fp4_blocks_carry_scales(host, graphs):
    g = Quantize("fp4").apply(graphs["prefill"], _Ctx(host))
    down = _node(g, "down_proj")
    assert [t.dtype for t in down.inputs] == ["nvfp4", "nvfp4"]
    # reads 32 x 256 activations and 256 x 128 weights at 0.5 byte plus one scale byte
    # per 16: (8192 + 32768) x (0.5 + 1/16) = 23040
    assert down.bytes_read == 23_040
    assert scale_bytes("nvfp4", 16) == 1 and scale_bytes("float8_e4m3fn", 16) == 0


def test_fp8_kv_cache_halves_attention_reads(host, graphs):
    g0 = graphs["decode"]
    g = Quantize("none", kv_dtype="fp8").apply(g0, _Ctx(host))
    a0 = _node(g0, "self_attn", "zrt.attention.default")
    a = _node(g, "self_attn", "zrt.attention.default")
    assert [t.dtype for t in a.inputs] == ["bfloat16", "float8_e4m3fn", "float8_e4m3fn"]
    # K and V: 2 x (2 x 2 x 17 x 32) elements, 2 -> 1 byte each: 4352 bytes fewer
    assert a0.bytes_read - a.bytes_read == 2 * 2 * 2 * 17 * 32
    cat = next(n for n in g.nodes if n.layer_index == 0 and n.op == "aten.cat.default"
               and n.outputs[0].shape == (2, 2, 17, 32))
    assert cat.inputs[0].dtype == "float8_e4m3fn"  # the cache carried from prefill
    assert cat.inputs[1].dtype == "bfloat16"  # the new token, quantised as it is written


def test_bad_names_are_spec_errors():
    with pytest.raises(SpecError, match="unknown quantisation"):
        Quantize("int3")
    with pytest.raises(SpecError, match="unknown KV-cache dtype"):
        kv_dtype_name("fp5")
    assert kv_dtype_name("fp8") == "float8_e4m3fn"
