"""Ascend kernel selection for the DSA path: same FLOPs, the Ascend kernels' bytes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from zrt_deepseek.kernels import PlatformKernels, select_kernels

from zrt_core.ir.graph import Phase


def _ctx(host, platform):
    return SimpleNamespace(platform=platform, host=host)


def test_ascend_renames_the_dsa_kernels(captured, host):
    r = captured("deepseek_v32")
    for phase, g in r.graphs.items():
        npu = PlatformKernels().apply(g, _ctx(host, "ascend"))
        before = {n.id: n for n in g.nodes}
        renamed = [n for n in npu.nodes if n.op != before[n.id].op]
        assert {n.op for n in renamed} == {
            Phase.PREFILL: {"deepseek.npu_lightning_indexer.default",
                            "deepseek.npu_sparse_flash_attention.default"},
            Phase.DECODE: {"deepseek.npu_lightning_indexer.default",
                           "deepseek.npu_sparse_flash_attention.default"},
            Phase.TRAIN_FORWARD: {"deepseek.npu_lightning_indexer.default",
                                  "deepseek.npu_sparse_flash_attention.default"},
            Phase.TRAIN_BACKWARD: {"deepseek.npu_sparse_flash_attention_backward.default"},
        }[phase]
        for n in renamed:
            old = before[n.id]
            assert n.flops == old.flops and n.attrs["platform"] == "ascend"
            assert n.attrs["kernel_of"] == old.op and n.formula == n.op.rsplit(".", 1)[0]
            if "indexer" in n.op:
                # the fused Ascend indexer keeps the [B, S, T] float32 logits on chip
                q = n.inputs[0]
                logits = q.shape[0] * q.shape[1] * n.inputs[1].shape[1] * 4
                assert old.bytes - n.bytes == 2 * logits
            else:
                assert n.bytes == old.bytes
        assert npu.totals().flops == g.totals().flops


def test_other_platforms_and_dense_mla_are_left_alone(captured, host):
    decode = captured("deepseek_v3").graphs[Phase.DECODE]
    assert select_kernels(decode, "ascend", host.formulas) is decode   # dense MLA decode
    sparse = captured("deepseek_v32").graphs[Phase.DECODE]
    for platform in ("cuda", "generic"):
        assert PlatformKernels().apply(sparse, _ctx(host, platform)) is sparse


def test_the_ascend_ops_compute_what_the_cuda_ones_do():
    import torch
    from zrt_deepseek import ops

    ops.ensure_ops()
    torch.manual_seed(0)
    q, k, w = torch.randn(1, 5, 2, 8), torch.randn(1, 9, 8), torch.rand(1, 5, 2)
    args = (q, k, w, 3, 1, 4, 0.5)
    assert torch.equal(torch.ops.deepseek.lightning_indexer(*args),
                       torch.ops.deepseek.npu_lightning_indexer(*args))
    idx = torch.ops.deepseek.lightning_indexer(*args)
    qa, kv = torch.randn(1, 2, 5, 12), torch.randn(1, 1, 9, 12)
    a = torch.ops.deepseek.mla_attention(qa, kv, kv[..., :8], idx, True, 0.3)
    b = torch.ops.deepseek.npu_sparse_flash_attention(qa, kv, kv[..., :8], idx, True, 0.3)
    assert torch.equal(a[0], b[0])


def _toy_hardware(vendor: str) -> Any:
    from zrt_core.hardware import HardwareSpec

    return HardwareSpec.from_mapping({
        "id": f"toy_{vendor}", "name": "Toy", "vendor": vendor,
        "compute": {"fp32": 10, "bf16": 100, "fp16": 100, "fp8": 200},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": 8},
                         {"name": "net", "bandwidth_gb_per_s": 25, "latency_us": 5,
                          "devices": None}],
        "efficiency": {"matmul": 0.8, "memory": 0.8, "launch_overhead_us": 2}})


def test_the_plugin_contributes_the_transform_for_ascend_only(host):
    (spec,) = list(host.graph_transforms)
    assert (spec.name, spec.point, spec.platforms) == (
        "deepseek.platform_kernels", "before_fusion", ("ascend",))
    assert host.graph_transforms.distribution_of(spec.name) == "<local>"


def test_serving_on_ascend_runs_the_npu_kernels(captured, host):
    from zrt_core.estimate import estimate_inference
    from zrt_core.strategy import InferSpec, Parallel

    cap = captured("deepseek_v32", batch=1, phases=("prefill", "decode"))
    infer = InferSpec(batch=2, input_len=16, output_len=4)
    npu, gpu = (estimate_inference(None, _toy_hardware(v), Parallel(), infer, host=host,
                                   captured=cap) for v in ("huawei", "nvidia"))
    assert "deepseek.platform_kernels" in npu.transforms
    assert "deepseek.platform_kernels" not in gpu.transforms
    assert npu.decode.flops == gpu.decode.flops
    # decode at the mean context 16 + 4/2 = 18 cached tokens: the indexer of each of the 3
    # layers scores T = 19 keys for B = 2 one-token queries; the CUDA kernel writes and
    # reads back the [B, 1, T] float32 logits, 2 · 2 · 19 · 4 = 304 bytes; 3 · 304 = 912
    assert gpu.decode.bytes - npu.decode.bytes == 912
