"""Estimation prices a step at any batch and context from one batch-1 capture, rescaled and
sharded in one walk. For every family: the estimator's graphs at tp = 2, batch 4 and twice
the captured context equal a direct capture at batch 4 (prefill) and at batch 4 with twice
the context (decode), sharded by tp = 2 — node for node, per-rank shapes, FLOPs and bytes.

The only differences allowed are the ones a batch-1 capture cannot show, listed per family
with the reason; anything else is a rescale or shard bug (DeepSeek-V4's batch on its size-1
KV-head axis, Mamba state on every head, routing on two experts of eight, ...).
"""

from __future__ import annotations

import difflib
from typing import Any

import pytest

from zrt_core.estimate.serving import Rescale
from zrt_core.ir.graph import OpGraph, Phase
from zrt_core.strategy import Parallel, check_layout
from zrt_core.transforms.base import TransformContext
from zrt_core.transforms.parallel import ParallelTransform, TPPlan

SEQ, BATCH, TP = 16, 4, 2

#: (phase, op, module path) of nodes whose bytes a batch-1 capture cannot know: tensors the
#: model code sizes with the batch as a Python number, not from a tensor.
KNOWN: dict[str, set[tuple[str, str, str]]] = {
    # the ALiBi bias [B·heads, 1, keys] repeats the slopes `batch` times (never read by the
    # attention kernel, which takes the slopes)
    "bloom": {(ph, op, "transformer") for ph in (Phase.PREFILL, Phase.DECODE)
              for op in ("aten.repeat.default", "aten._to_copy.default")},
    # attention temperature tuning expands a [1, S, 1, 1] scale to the batch before the
    # multiply reads it (the no-RoPE layer 3)
    "llama4": {(ph, op, "model.layers.3.self_attn") for ph in (Phase.PREFILL, Phase.DECODE)
               for op in ("aten.expand.default", "aten.mul.Tensor")},
}
#: A reshape of a transposed tensor is a view at batch 1 and a copy at batch 4 (strides):
#: the capture at batch 4 has ``clone`` + ``_unsafe_view`` where batch 1 has ``view``.
_COPY = (["aten.view.default"], ["aten.clone.default", "aten._unsafe_view.default"])

_CACHE: dict[tuple, Any] = {}


def _capture(host, config, batch: int, seq: int) -> Any:
    from zrt_core.capture.api import capture

    key = (repr(sorted(config.items())), batch, seq)
    if key not in _CACHE:
        _CACHE[key] = capture(config, phases=("prefill", "decode"), batch=batch,
                              seq_len=seq, host=host)
    return _CACHE[key]


def _plan(model_type: str) -> TPPlan:
    from zrt_core.estimate.captures import config_tp_plan

    return config_tp_plan(model_type)  # transformers is imported: the config's own plan


def _sig(n) -> tuple[str, str, Any]:
    return (n.op, n.module_path, n.layer_index)


def _facts(n) -> tuple:
    return ([t.shape for t in n.inputs], [t.shape for t in n.outputs], n.flops,
            n.bytes_read, n.bytes_written)


def differences(a: OpGraph, b: OpGraph) -> tuple[set[tuple[str, str]], int]:
    """``({(op, module)} of nodes that differ, copies batch 1 cannot show)``: nodes are
    aligned by op and module in execution order."""
    sm = difflib.SequenceMatcher(a=[_sig(n) for n in a.nodes], b=[_sig(n) for n in b.nodes],
                                 autojunk=False)
    out: set[tuple[str, str]] = set()
    copies = 0
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for x, y in zip(a.nodes[i1:i2], b.nodes[j1:j2], strict=True):
                if _facts(x) != _facts(y):
                    out.add((x.op, x.module_path))
        elif ([n.op for n in a.nodes[i1:i2]], [n.op for n in b.nodes[j1:j2]]) == _COPY:
            assert b.nodes[j1].flops == 0
            copies += 1
        else:
            out |= {(n.op, n.module_path) for n in (*a.nodes[i1:i2], *b.nodes[j1:j2])}
    return out, copies


@pytest.fixture(scope="module")
def toy_spec():
    from zrt_core.hardware import HardwareSpec

    return HardwareSpec.from_mapping({
        "id": "toy_gpu", "name": "toy", "vendor": "toy",
        "compute": {"fp32": 10, "bf16": 80, "fp16": 80}, "memory": {"capacity_gb": 16,
                                                       "bandwidth_gb_per_s": 1000},
        "interconnect": [{"name": "link", "bandwidth_gb_per_s": 100, "latency_us": 2,
                          "devices": None}]})


def _ctx(host, dims, toy_spec) -> TransformContext:
    return TransformContext(dims=dims, hardware=toy_spec,
                            parallel=check_layout(Parallel(tp=TP), dims), host=host)


def rescale_equivalence(host, toy_spec, config: dict[str, Any]) -> dict[str, tuple]:
    """Per phase: (rescaled, direct) graphs, both sharded by tp = 2."""
    small = _capture(host, config, 1, SEQ)
    plan = _plan(small.model_type)
    ctx = _ctx(host, small.dims, toy_spec)
    out = {}
    for phase, big, cache in ((Phase.PREFILL, _capture(host, config, BATCH, SEQ), None),
                              (Phase.DECODE, _capture(host, config, BATCH, 2 * SEQ), 2 * SEQ)):
        rescale = Rescale(BATCH, cache)
        a = ParallelTransform(plan, extra_seeds=rescale.seeds,
                              extra_attrs=rescale.attrs).apply(small.graphs[phase], ctx)
        b = ParallelTransform(plan).apply(big.graphs[phase], ctx)
        out[phase] = (a, b)
    return out


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "nemotron", "gemma2", "gemma3",
            "gpt2", "opt", "bloom", "mixtral", "qwen3_moe", "llama4", "gpt_oss", "nemotron_h"]


@pytest.mark.parametrize("family", FAMILIES)
def test_rescaled_and_sharded_equals_a_direct_capture(host, tiny, toy_spec, family):
    graphs = rescale_equivalence(host, toy_spec, tiny[family])
    found = set()
    for phase, (a, b) in graphs.items():
        totals_a, totals_b = a.totals(), b.totals()
        assert totals_a.flops == totals_b.flops, phase  # FLOPs per rank, exact
        diff, copies = differences(a, b)
        assert copies == 0, phase  # no family here reshapes a transposed batch
        found |= {(phase, op, module) for op, module in diff}
    assert found == KNOWN.get(family, set())


def test_the_comparison_sees_a_wrong_rescale(host, tiny, toy_spec):
    """The check fails when the rescale is wrong: a decode step rescaled to the context but
    not the batch differs from the batch-4 capture in every layer."""
    small = _capture(host, tiny["llama"], 1, SEQ)
    ctx = _ctx(host, small.dims, toy_spec)
    wrong = Rescale(1, 2 * SEQ)
    a = ParallelTransform(_plan("llama"), extra_seeds=wrong.seeds).apply(
        small.graphs[Phase.DECODE], ctx)
    b = ParallelTransform(_plan("llama")).apply(
        _capture(host, tiny["llama"], BATCH, 2 * SEQ).graphs[Phase.DECODE], ctx)
    diff, _ = differences(a, b)
    assert ("zrt.attention.default", "model.layers.0.self_attn") in diff
    assert a.totals().flops < b.totals().flops
