"""Plugin-contributed graph transforms (``zrt_graph_transforms``): the spec's validation, which
transforms a context gets and in what order, and both estimators running them.

A throwaway plugin registers a transform that tags every node it sees with
``attrs["seen_by"]``, so a test can tell which graphs it ran over and where in the pipeline.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from attrs import evolve

from zrt_core import hookimpl
from zrt_core.errors import PluginError, SpecError
from zrt_core.estimate import estimate_inference
from zrt_core.estimate.training import capture_for_training, estimate_training
from zrt_core.hardware import HardwareSpec
from zrt_core.ir.graph import OpGraph, Phase
from zrt_core.strategy import InferSpec, Parallel, TrainSpec
from zrt_core.transforms.base import TransformSpec, around_fusion, plugin_transforms

GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 256,
        "vocab_size": 128, "n_positions": 128}
LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


class Tag:
    """Marks every node with ``seen_by`` and logs ``(name, phase, the tag the graph's nodes
    carried before)``: which graphs it ran over, and after which other transform."""

    def __init__(self, name: str, log: list[tuple[str, str, str]]) -> None:
        self.name = name
        self.log = log

    def apply(self, graph: OpGraph, ctx: Any) -> OpGraph:
        before = {str(n.attrs.get("seen_by", "")) for n in graph.nodes}
        self.log.append((self.name, graph.phase, ",".join(sorted(before))))
        return graph.with_nodes([evolve(n, attrs={**n.attrs, "seen_by": self.name})
                                 for n in graph.nodes])


def _plugin(*specs: TransformSpec) -> object:
    class Plugin:
        @hookimpl
        def zrt_graph_transforms(self):
            return list(specs)

    return Plugin()


def _ctx(host, platform: str = "cuda") -> Any:
    return SimpleNamespace(host=host, platform=platform)


@pytest.mark.parametrize(("fields", "message"), [
    ({"point": "after_pricing"}, "unknown point 'after_pricing'"),
    ({"platforms": ("rocm",)}, "unknown platform 'rocm'"),
    ({"phases": ("optimizer",)}, "unknown phase 'optimizer'"),
    ({"name": ""}, "graph transform without a name"),
])
def test_a_bad_spec_is_a_one_line_spec_error(fields, message) -> None:
    with pytest.raises(SpecError, match=message) as err:
        TransformSpec(**{"name": "t", "factory": lambda ctx: None, **fields})
    assert "\n" not in str(err.value) and err.value.hint


def test_a_context_gets_its_platforms_transforms_in_order(register_plugin) -> None:
    log: list[tuple[str, str, str]] = []
    host = register_plugin(_plugin(
        TransformSpec("b.late", lambda ctx: Tag("b.late", log), order=5),
        TransformSpec("a.early", lambda ctx: Tag("a.early", log), order=-1),
        TransformSpec("c.same", lambda ctx: Tag("c.same", log), order=5),
        TransformSpec("npu.only", lambda ctx: Tag("npu.only", log), platforms=("ascend",)),
        TransformSpec("before", lambda ctx: Tag("before", log), point="before_fusion"),
        TransformSpec("nothing.to.do", lambda ctx: None),
    ), "toy_transforms")
    names = [t.name for t in plugin_transforms(_ctx(host), "after_fusion")]
    # ascending order, then by name; the Ascend-only one and the None factory left out
    assert names == ["a.early", "b.late", "c.same"]
    assert [t.name for t in plugin_transforms(_ctx(host, "ascend"), "after_fusion")] == [
        "a.early", "npu.only", "b.late", "c.same"]
    fusion = SimpleNamespace(name="fusion")
    assert [t.name for t in around_fusion(_ctx(host), fusion)] == [
        "before", "fusion", "a.early", "b.late", "c.same"]
    with pytest.raises(SpecError, match="unknown transform point"):
        plugin_transforms(_ctx(host), "middle")


def test_phases_scope_a_transform_to_their_graphs(register_plugin, core_host) -> None:
    log: list[tuple[str, str, str]] = []
    host = register_plugin(_plugin(TransformSpec(
        "decode.only", lambda ctx: Tag("decode.only", log), phases=(Phase.DECODE,))),
        "toy_transforms")
    (scoped,) = plugin_transforms(_ctx(host), "after_fusion")
    assert scoped.name == "decode.only"
    prefill = OpGraph(phase=Phase.PREFILL, nodes=[])
    decode = OpGraph(phase=Phase.DECODE, nodes=[])
    assert scoped.apply(prefill, None) is prefill
    scoped.apply(decode, None)
    assert log == [("decode.only", Phase.DECODE, "")]


def test_a_factory_that_fails_or_returns_no_transform_names_the_plugin(register_plugin
                                                                       ) -> None:
    def broken(ctx):
        raise RuntimeError("boom")

    host = register_plugin(_plugin(TransformSpec("broken", broken)), "toy_transforms",
                           distribution="zrt-toy")
    with pytest.raises(PluginError, match=r"'broken' \(zrt-toy\) failed to build: "
                                          r"RuntimeError: boom"):
        plugin_transforms(_ctx(host), "after_fusion")
    host.unregister("toy_transforms")
    register_plugin(_plugin(TransformSpec("wrong", lambda ctx: 42)), "toy2")
    with pytest.raises(PluginError, match="returned a int, not a transform"):
        plugin_transforms(_ctx(host), "after_fusion")


def test_two_plugins_claiming_one_transform_name_are_named(register_plugin) -> None:
    spec = TransformSpec("same.name", lambda ctx: None)
    register_plugin(_plugin(spec), "one", distribution="zrt-one")
    host = register_plugin(_plugin(spec), "two", distribution="zrt-two")
    with pytest.raises(PluginError, match="'zrt-one' and by 'zrt-two'"):
        plugin_transforms(_ctx(host), "after_fusion")


def test_serving_runs_them_on_every_priced_graph_around_fusion(register_plugin,
                                                              toy_spec_file) -> None:
    from zrt_core.capture.api import capture

    log: list[tuple[str, str, str]] = []
    host = register_plugin(_plugin(
        TransformSpec("toy.before", lambda ctx: Tag("toy.before", log), point="before_fusion"),
        TransformSpec("toy.after", lambda ctx: Tag("toy.after", log),
                      phases=(Phase.DECODE,))), "toy_transforms")
    captured = capture(LLAMA, phases=("prefill", "decode"), batch=1, seq_len=16, host=host)
    report = estimate_inference(LLAMA, HardwareSpec.from_yaml(toy_spec_file), Parallel(),
                                InferSpec(batch=2, input_len=16, output_len=4), host=host,
                                captured=captured)
    # before fusion on both phases, after it on decode only, on what "before" left
    assert set(log) == {("toy.before", Phase.PREFILL, ""), ("toy.before", Phase.DECODE, ""),
                        ("toy.after", Phase.DECODE, "toy.before")}
    assert report.transforms.index("toy.before") < report.transforms.index("fusion") \
        < report.transforms.index("toy.after") < report.transforms.index("paged_kv_cache")


def test_training_runs_them_on_forward_and_backward(register_plugin, toy_spec_file) -> None:
    log: list[tuple[str, str, str]] = []
    host = register_plugin(_plugin(
        TransformSpec("toy.after", lambda ctx: Tag("toy.after", log))), "toy_transforms")
    captured = capture_for_training(GPT2, 1, 32, host=host, use_cache=False)
    train = TrainSpec(micro_batch=1, global_batch=4, seq_len=32)
    report = estimate_training(GPT2, HardwareSpec.from_yaml(toy_spec_file), Parallel(dp=2, tp=2),
                               train,
                               host=host, captured=captured)
    assert set(log) == {("toy.after", Phase.TRAIN_FORWARD, ""),
                        ("toy.after", Phase.TRAIN_BACKWARD, "")}
    assert any("graph transforms: parallel, fusion, toy.after" in n for n in report.notes)
