"""The harness's ``zrt::`` operators compute what they claim (real tensors, tiny shapes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from zrt_core.capture.ops import attention_mask, ensure_ops  # noqa: E402

ensure_ops()


def _sdpa_reference(q, k, v, mask, scale):
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                                           scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("window,chunk", [(0, 0), (3, 0), (0, 4)])
def test_attention_matches_sdpa_with_the_same_mask(window, chunk):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, requires_grad=True)
    v = torch.randn(2, 2, 9, 8, requires_grad=True)
    out, _lse = torch.ops.zrt.attention(q, k, v, None, None, True, window, chunk, 0.3, 0.0)
    mask = attention_mask(5, 9, is_causal=True, window=window, chunk=chunk)
    ref = _sdpa_reference(q, k, v, mask, 0.3)
    assert out.shape == (2, 5, 4, 8)
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    theirs = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_attention_gradients_with_sinks_softcap_and_sparse_indices():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 5, 4, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[[0, 2, 3]] * 3], dtype=torch.int32)

    def f(q, k, v, sinks):
        return torch.ops.zrt.attention(q, k, v, sinks, indices, True, 3, 0, 0.4, 3.0)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, sinks))


def test_moe_dispatch_and_combine_compute_the_weighted_expert_sum():
    torch.manual_seed(0)
    hidden = torch.randn(6, 4, requires_grad=True)
    index = torch.tensor([[0, 2], [1, 0], [2, 1], [0, 1], [2, 0], [1, 2]])
    weights = torch.rand(6, 2, requires_grad=True)
    routed, row_token, row_expert = torch.ops.zrt.moe_dispatch(hidden, index, 3)
    assert routed.shape == (12, 4)
    assert row_expert.tolist() == sorted(row_expert.tolist())  # grouped by expert
    scale = torch.tensor([1.0, 2.0, 3.0])  # expert e multiplies by e + 1
    out = torch.ops.zrt.moe_combine(routed * scale[row_expert].unsqueeze(1), row_token,
                                    weights)
    ref = (hidden.unsqueeze(1) * scale[index].unsqueeze(-1) * weights.unsqueeze(-1)).sum(1)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    ours = torch.autograd.grad(out, (hidden, weights), g)
    theirs = torch.autograd.grad(ref, (hidden, weights), g)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
