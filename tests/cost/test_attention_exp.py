"""Softmax's exponentials as attention's third roofline (``compute.exp_tera_per_s``).

Toy device of conftest.py: bf16 1e15 FLOP/s, attention 0.5 / 0.25 backward, HBM 1e12 B/s
achievable, launch 2 us, 4 units, 128-query tiles, KV-loop overhead 128 keys.
"""

from __future__ import annotations

import pytest
from attrs import evolve

from zrt_core.cost.roofline import RooflineBackend
from zrt_core.errors import SpecError
from zrt_core.hardware import HardwareSpec

from .builders import make_toy, tensor

FWD = "aten._scaled_dot_product_flash_attention.default"
BWD = "aten._scaled_dot_product_flash_attention_backward.default"


def _backend(exp_tera_per_s: float | None) -> RooflineBackend:
    toy = make_toy()
    return RooflineBackend(evolve(toy, compute=evolve(toy.compute,
                                                      exp_tera_per_s=exp_tera_per_s)))


def _forward(node, d: int):
    q = tensor(2, 8, 1024, d)
    return node(FWD, "attention", [q, q, q], [q], flops=4 * 2 * 8 * 1024 * 1024 * d)


def test_exponentials_bound_the_forward_when_the_units_are_slow(node):
    cost = _backend(0.5).price(_forward(node, 128))
    # exps = b*h*pairs = 2*8*1024^2 = 16777216 over 0.5e12/s = 3.3554432e-5 s; the tensor
    # part 8589934592 / (1e15 * 0.5 * kv_loop 8/9) = 1.9327352832e-5 s is shorter
    assert cost.detail["exps"] == 16777216
    assert cost.detail["tensor_s"] == pytest.approx(1.9327352832e-5, rel=1e-12)
    assert cost.detail["exp_s"] == pytest.approx(3.3554432e-5, rel=1e-12)
    assert cost.detail["exp_bound"] is True
    assert cost.compute_s == pytest.approx(3.3554432e-5, rel=1e-12)
    assert cost.time_s == pytest.approx(3.3554432e-5 + 2e-6, rel=1e-12)
    assert cost.bound == "compute"


def test_the_tensor_part_stands_when_the_exponentials_are_faster(node):
    cost = _backend(1.0).price(_forward(node, 128))
    # 16777216 / 1e12 = 1.6777216e-5 s < tensor 1.9327352832e-5 s: unchanged
    assert cost.detail["exp_bound"] is False
    assert cost.compute_s == pytest.approx(1.9327352832e-5, rel=1e-12)


def test_a_smaller_head_dim_makes_the_same_unit_the_bound(node):
    # FLOPs per exponential are 4d: at d 64 the tensor part halves to
    # 4294967296 / (0.5e15 * 8/9) = 9.663676416e-6 s, under the same 1.6777216e-5 s of exps
    cost = _backend(1.0).price(_forward(node, 64))
    assert cost.detail["tensor_s"] == pytest.approx(9.663676416e-6, rel=1e-12)
    assert cost.detail["exp_bound"] is True
    assert cost.compute_s == pytest.approx(1.6777216e-5, rel=1e-12)


def test_the_backward_recomputes_one_exponential_per_pair(node):
    q = tensor(2, 8, 1024, 128)
    cost = _backend(0.1).price(node(BWD, "attention", [q, q, q, q, q], [q, q, q],
                                    flops=int(2.5 * 8589934592), phase="train_backward"))
    # P = exp(S - LSE) again: 16777216 exps / 0.1e12 = 1.6777216e-4 s over the tensor part
    # 21474836480 / (1e15 * 0.25 * 8/9) = 9.663676416e-5 s
    assert cost.rule == "flash_attention_bwd"
    assert cost.detail["tensor_s"] == pytest.approx(9.663676416e-5, rel=1e-12)
    assert cost.compute_s == pytest.approx(1.6777216e-4, rel=1e-12)


def test_causal_masks_halve_the_exponentials(node):
    q = tensor(2, 8, 1024, 64)
    flops = 4 * 2 * 8 * (1024 * 1025 // 2) * 64
    cost = _backend(1.0).price(node(FWD, "attention", [q, q, q], [q], flops=flops,
                                    is_causal=True))
    # the kept triangle: 2*8*524800 = 8396800 exps over 1e12/s
    assert cost.detail["exps"] == 8396800
    assert cost.detail["exp_s"] == pytest.approx(8.3968e-6, rel=1e-12)


def test_a_device_without_the_figure_has_no_exp_term(node):
    cost = _backend(None).price(_forward(node, 64))
    assert "exp_s" not in cost.detail
    assert cost.compute_s == pytest.approx(9.663676416e-6, rel=1e-12)


def test_the_spec_reads_the_rate_and_rejects_a_bad_one(tmp_path, toy_yaml):
    path = tmp_path / "toy_gpu.yaml"
    path.write_text(toy_yaml.replace("int8: 160}", "int8: 160, exp_tera_per_s: 2.5}", 1))
    assert HardwareSpec.from_yaml(path).compute.exp_tera_per_s == 2.5
    path.write_text(toy_yaml.replace("int8: 160}", "int8: 160, exp_tera_per_s: 0}", 1))
    with pytest.raises(SpecError, match=r"compute\.exp_tera_per_s must be > 0, got 0"):
        HardwareSpec.from_yaml(path)
    path.write_text(toy_yaml)
    assert HardwareSpec.from_yaml(path).compute.exp_tera_per_s is None
