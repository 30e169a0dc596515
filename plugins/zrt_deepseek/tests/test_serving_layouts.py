"""DeepSeek serving graphs at any batch, context and TP degree from one batch-1 capture (what
``estimate_inference`` prices): V4's attention sharded by heads and output groups as vLLM
runs it, its single K = V head kept whole at any batch, its compressed caches and kernel
positions following a longer context, and every DeepSeek version equal to a direct capture.

Tiny V4 (conftest): hidden 128, 4 heads of 64 sharing one K = V head, q_lora 48, o_lora 32,
window 8, CSA every 4 tokens (top-3 entries, 2 index heads of 32), HCA every 8; layer 0
sliding, 1 CSA, 2 HCA. ``o_groups`` is 4 here (conftest: 2) so that tp = 4 holds whole
groups. The capture is batch 1, 16 tokens; decode attends to 16 cached + 1 new.
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from zrt_core.errors import LayoutError
from zrt_core.estimate.captures import CapturedModel
from zrt_core.estimate.serving import Rescale
from zrt_core.ir.graph import Category, OpGraph, Phase
from zrt_core.strategy import Parallel, check_layout
from zrt_core.transforms.base import TransformContext
from zrt_core.transforms.parallel import ParallelTransform

SPARSE = "deepseek.sparse_attention.default"
INDEXER = "deepseek.lightning_indexer.default"

_CAPTURES: dict[tuple, Any] = {}


@pytest.fixture(scope="module")
def v4(tiny):
    return {**tiny["deepseek_v4"], "o_groups": 4}


@pytest.fixture(scope="module")
def hardware():
    from zrt_core.hardware import HardwareSpec

    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "toy", "vendor": "toy",
        "compute": {"fp32": 10, "bf16": 80, "fp16": 80},
        "memory": {"capacity_gb": 16, "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": None}]})


def _capture(host, config, batch: int = 1, seq: int = 16) -> CapturedModel:
    from zrt_core.capture.api import capture

    key = (repr(sorted(config.items())), batch, seq)
    if key not in _CAPTURES:
        _CAPTURES[key] = CapturedModel.from_capture(
            capture(config, phases=("prefill", "decode"), batch=batch, seq_len=seq,
                    host=host))
    return _CAPTURES[key]


def _step(host, hardware, cap: CapturedModel, phase: str, tp: int, batch: int | None = None,
          cache: int | None = None) -> OpGraph:
    """The graph ``estimate_inference`` prices: rescaled and sharded in one walk."""
    ctx = TransformContext(dims=cap.dims, hardware=hardware,
                           parallel=check_layout(Parallel(tp=tp), cap.dims), host=host)
    rescale = Rescale(batch, cache)
    g = ParallelTransform(cap.tp_plan, extra_seeds=rescale.seeds,
                          extra_attrs=rescale.attrs).apply(cap.graphs[phase], ctx)
    return rescale.updated_meta(cap.graphs[phase], g)


def _node(g: OpGraph, layer: int, op: str, module: str = "") -> Any:
    return next(n for n in g.nodes if n.layer_index == layer and n.op == op
                and n.module_path.endswith(module))


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 4])
def test_v4_decode_per_rank_shapes_and_flops(host, hardware, v4, tp, batch):
    g = _step(host, hardware, _capture(host, v4), Phase.DECODE, tp, batch)
    heads, groups, b = 4 // tp, 4 // tp, batch
    # q_b_proj is column-parallel: 256 = 4 heads · 64 outputs over tp; 2·B·48·256/tp
    q_b = _node(g, 1, "aten.mm.default", "self_attn.q_b_proj")
    assert q_b.inputs[1].shape == (48, 64 * heads) and q_b.flops == 2 * b * 48 * 64 * heads
    # the sparse kernel: the rank's heads against the one K = V head, never the batch on it
    att = _node(g, 1, SPARSE)
    assert [t.shape for t in att.inputs] == [(b, heads, 1, 64), (b, 1, 8 + 4, 64), (heads,),
                                             (b, 1, 3)]
    # 8 window keys + min(top-3, 17 // 4 = 4 entries) = 11 pairs; 2·B·H·11·(64 + 64)
    assert att.flops == 2 * b * heads * 11 * 128
    # o_a_proj: the rank's groups (one head of 64 each) to o_lora 32: 2·G·B·64·32
    o_a = _node(g, 1, "aten.bmm.default", "self_attn.o_a_proj")
    assert [t.shape for t in o_a.inputs] == [(groups, b, 64), (groups, 64, 32)]
    assert o_a.flops == 2 * groups * b * 64 * 32
    # o_b_proj is row-parallel over the groups' 4·32 = 128 outputs: 2·B·(128/tp)·128
    o_b = _node(g, 1, "aten.mm.default", "self_attn.o_b_proj")
    assert [t.shape for t in o_b.inputs] == [(b, 32 * groups), (32 * groups, 128)]
    assert o_b.flops == 2 * b * 32 * groups * 128
    # the compressor and the indexer every rank computes whole (vLLM's ReplicatedLinear):
    # the compressor's kv_proj 128 → 2·64 (CSA's two overlapping series), the indexer's
    # 2 heads over the 4 closed entries: 2·B·2·4·(32 + 1)
    kv = _node(g, 1, "aten.mm.default", "compressor.kv_proj")
    assert kv.inputs[1].shape == (128, 128) and kv.flops == 2 * b * 128 * 128
    assert _node(g, 1, "aten.mm.default", "indexer.q_b_proj").inputs[1].shape == (48, 64)
    index = _node(g, 1, INDEXER)
    assert index.inputs[0].shape == (b, 1, 2, 32) and index.flops == 2 * b * 2 * 4 * 33
    # one all-reduce after the attention (and one after the MoE), B·128 bf16 values
    reduces = [n.attrs["bytes"] for n in g.nodes if n.layer_index == 1
               and n.category == Category.COLLECTIVE]
    assert reduces == ([b * 128 * 2] * 2 if tp > 1 else [])


def test_v4_prefill_keeps_one_kv_head_at_any_batch(host, hardware, v4):
    """rotate_half stacks the halves of ``[B, 1, S, d/2]``: the batch stays on axis 0 (it
    went to the size-1 KV-head axis: ``kv [B, B, S, d]``, a B-fold attention)."""
    g = _step(host, hardware, _capture(host, v4), Phase.PREFILL, 2, 4)
    att = _node(g, 2, SPARSE)
    assert att.inputs[1].shape == (4, 1, 16 + 2, 64)  # 16 source tokens + 2 HCA entries
    # window 8 over 16 queries: 1+…+8 + 8·8 = 100 pairs, + 10 HCA pairs (prefill test of
    # test_v4.py); 2 of 4 heads: 2·B 4·H 2·110·128
    assert att.flops == 2 * 4 * 2 * 110 * 128


def test_v4_layout_needs_whole_output_groups(v4):
    dims = _capture_dims(v4)
    with pytest.raises(LayoutError, match="output-projection groups"):
        check_layout(Parallel(tp=4), type(dims).from_config({**v4, "o_groups": 2}))
    assert check_layout(Parallel(tp=4), dims).tp == 4


def _capture_dims(config):
    from zrt_core.modelinfo import ModelDims

    return ModelDims.from_config(config)


def test_v4_decode_at_a_longer_context(host, hardware, v4):
    """From 16 cached tokens to 40: compressed entries grow to 40 // ratio, kernels' start
    positions move, the window stays 8; equal to a capture at 40 tokens."""
    g = _step(host, hardware, _capture(host, v4), Phase.DECODE, 1, 1, 40)
    direct = _capture(host, v4, 1, 40).graphs[Phase.DECODE]
    unit = 2 * 4 * 128  # 2 · H 4 · (64 + 64) per pair
    window, csa, hca = (_node(g, i, SPARSE) for i in (0, 1, 2))
    assert window.inputs[1].shape == (1, 1, 8, 64) and window.flops == unit * 8
    # CSA: 40 // 4 = 10 entries; 8 window keys + top-3 of them
    assert csa.inputs[1].shape == (1, 1, 8 + 10, 64) and csa.flops == unit * 11
    # HCA: 40 // 8 = 5 entries, all visible to the token at 40 (41 // 8 = 5)
    assert hca.inputs[1].shape == (1, 1, 8 + 5, 64) and hca.flops == unit * 13
    assert {n.attrs["start_pos"] for n in (window, csa, hca)} == {40}
    # the indexer scores the 10 entries: 2·2 heads·10·(32 + 1)
    index = _node(g, 1, INDEXER)
    assert index.inputs[1].shape == (1, 10, 32) and index.flops == 1_320
    for layer, op in ((0, SPARSE), (1, SPARSE), (2, SPARSE), (1, INDEXER)):
        ours, theirs = _node(g, layer, op), _node(direct, layer, op)
        assert ([t.shape for t in ours.inputs], ours.flops, ours.bytes, dict(ours.attrs)) == \
            ([t.shape for t in theirs.inputs], theirs.flops, theirs.bytes, dict(theirs.attrs))


def test_v4_window_grows_until_full(host, hardware, v4):
    """A 4-token capture holds 4 window rows and one CSA entry: at 32 cached tokens the
    window holds its 7 earlier tokens, the CSA cache 8 entries and the indexer picks 3."""
    g = _step(host, hardware, _capture(host, v4, 1, 4), Phase.DECODE, 1, 1, 32)
    window, csa = _node(g, 0, SPARSE), _node(g, 1, SPARSE)
    assert window.attrs["window_keys"] == 8 and window.inputs[1].shape == (1, 1, 8, 64)
    assert [t.shape for t in csa.inputs[1:]] == [(1, 1, 8 + 8, 64), (4,), (1, 1, 3)]
    assert csa.attrs["window_keys"] == 8 and csa.flops == 2 * 4 * 128 * (8 + 3)


# -- every DeepSeek version: the estimator's graphs equal direct captures -----------------

#: A reshape of a transposed tensor is a view at batch 1 and a copy at batch 4 (MLA's
#: absorbed output, V4's grouped projection): ``clone`` + ``_unsafe_view`` for ``view``.
_COPY = (["aten.view.default"], ["aten.clone.default", "aten._unsafe_view.default"])


def _differences(a: OpGraph, b: OpGraph) -> tuple[set[tuple[str, str]], int]:
    def sig(n):
        return (n.op, n.module_path, n.layer_index)

    def facts(n):
        return ([t.shape for t in n.inputs], [t.shape for t in n.outputs], n.flops,
                n.bytes_read, n.bytes_written)

    sm = difflib.SequenceMatcher(a=[sig(n) for n in a.nodes], b=[sig(n) for n in b.nodes],
                                 autojunk=False)
    out, copies = set(), 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out |= {(x.op, x.module_path) for x, y in zip(a.nodes[i1:i2], b.nodes[j1:j2],
                                                          strict=True) if facts(x) != facts(y)}
        elif ([n.op for n in a.nodes[i1:i2]], [n.op for n in b.nodes[j1:j2]]) == _COPY:
            copies += 1
        else:
            out |= {(n.op, n.module_path) for n in (*a.nodes[i1:i2], *b.nodes[j1:j2])}
    return out, copies


#: V3.2's model builds a [B, 1, S, S] mask from arange(batch) (its sparse kernels take
#: top-k indices instead): a batch a batch-1 capture cannot see, 24 bytes.
_MASK = {(op, "model") for op in ("aten.arange.default", "aten.unsqueeze.default",
                                  "aten.expand.default")}


# copies: one per captured layer — the dense layer and one MoE template for V2/V3/V3.2
# (layers 1 and 2 share it), V4's three layer kinds
@pytest.mark.parametrize(("family", "known", "copies"), [
    ("deepseek_v2", set(), 2), ("deepseek_v3", set(), 2), ("deepseek_v32", _MASK, 2),
    ("deepseek_v4", set(), 3)])
def test_rescaled_and_sharded_equals_a_direct_capture(host, hardware, tiny, family, known,
                                                      copies):
    """tp = 2, batch 4, twice the context (decode) against captures at batch 4 (16 and 32
    tokens) sharded by tp = 2: per-rank FLOPs equal, every node equal but the copies one
    per layer that batch 1 has as views (decode only)."""
    small, prefill, decode = (_capture(host, tiny[family], b, s)
                              for b, s in ((1, 16), (4, 16), (4, 32)))
    ctx = TransformContext(dims=small.dims, hardware=hardware,
                           parallel=check_layout(Parallel(tp=2), small.dims), host=host)
    for phase, big, cache in ((Phase.PREFILL, prefill, None), (Phase.DECODE, decode, 32)):
        a = _step(host, hardware, small, phase, 2, 4, cache)
        b = ParallelTransform(big.tp_plan).apply(big.graphs[phase], ctx)
        assert a.totals().flops == b.totals().flops, phase
        diff, n_copies = _differences(a, b)
        assert diff == known, phase
        assert n_copies == (copies if phase == Phase.DECODE else 0), phase
