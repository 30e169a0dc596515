"""A plugin extends capture through the same hooks as the core: a scoped model patch that
routes a module to its own custom op, and the op's formula."""

from __future__ import annotations

import contextlib

import pytest

from zrt_core import hookimpl
from zrt_core.capture.api import capture
from zrt_core.capture.patches import ModelPatch
from zrt_core.formulas.registry import OpFormula
from zrt_core.ir.graph import Category, Phase

torch = pytest.importorskip("torch")


def _define_fused_mlp():
    """A fused gate-up-down MLP kernel, as a vendor pack would ship it."""
    if hasattr(torch.ops, "zrt_test") and hasattr(torch.ops.zrt_test, "fused_mlp"):
        return

    @torch.library.custom_op("zrt_test::fused_mlp", mutates_args=(),
                             schema="(Tensor x, Tensor gate, Tensor up, Tensor down) -> Tensor")
    def fused_mlp(x, gate, up, down):
        h = torch.nn.functional.silu(x @ gate.t()) * (x @ up.t())
        return h @ down.t()

    @fused_mlp.register_fake
    def _(x, gate, up, down):
        return x.new_empty((*x.shape[:-1], down.shape[0]))


def _fused_mlp_flops(call):
    x, gate, _up, _down = call.inputs
    tokens = x.numel // x.shape[-1]
    # three matmuls: 2 · T · h · ffn each
    return 3 * 2 * tokens * gate.shape[0] * gate.shape[1]


class FusedMlpPlugin:
    @hookimpl
    def zrt_model_patches(self):
        return [ModelPatch(name="test.fused_mlp",
                           applies_to=lambda c: c.model_type == "llama",
                           context=self.context)]

    @hookimpl
    def zrt_op_formulas(self):
        return [OpFormula("zrt_test.fused_mlp", _fused_mlp_flops, category=Category.MATMUL)]

    @staticmethod
    @contextlib.contextmanager
    def context(_config, _options):
        from transformers.models.llama import modeling_llama

        _define_fused_mlp()
        original = modeling_llama.LlamaMLP.forward

        def forward(self, x):
            return torch.ops.zrt_test.fused_mlp(x, self.gate_proj.weight,
                                                self.up_proj.weight, self.down_proj.weight)

        modeling_llama.LlamaMLP.forward = forward
        try:
            yield
        finally:
            modeling_llama.LlamaMLP.forward = original


@pytest.fixture
def plugin_host():
    from zrt_core.plugins import get_plugin_manager

    host = get_plugin_manager(autoload=False)
    host.register(FusedMlpPlugin(), name="fused-mlp-test")
    return host


def test_a_plugin_patch_and_formula_shape_the_graph(plugin_host, host, tiny):
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaMLP.forward
    r = capture(tiny["llama"], phases=(Phase.PREFILL,), batch=2, seq_len=16,
                host=plugin_host)
    g = r.graphs[Phase.PREFILL]
    (fused,) = [n for n in g.nodes if n.op == "zrt_test.fused_mlp.default"]
    assert fused.category == Category.MATMUL
    assert fused.module_path == "model.layers.0.mlp" and fused.layer_kind == "dense"
    assert fused.flops == 3 * 2 * 32 * 256 * 128     # 3 matmuls · 2 · T · ffn · h
    assert fused.formula == "zrt_test.fused_mlp"
    assert not [n for n in g.nodes if n.module_path.startswith("model.layers.0.mlp.")]
    # the patch was scoped: the class is back as it was, and a host without the plugin
    # captures HF's MLP again
    assert modeling_llama.LlamaMLP.forward is original
    plain = capture(tiny["llama"], phases=(Phase.PREFILL,), batch=2, seq_len=16, host=host)
    assert not [n for n in plain.graphs[Phase.PREFILL].nodes if n.op.startswith("zrt_test")]
    # same matmul work either way
    assert g.totals().flops < plain.graphs[Phase.PREFILL].totals().flops


def test_an_op_without_formula_is_listed_not_guessed(host, tiny):
    from zrt_core.plugins import get_plugin_manager

    class PatchOnly(FusedMlpPlugin):
        zrt_op_formulas = None

    bare = get_plugin_manager(autoload=False)
    bare.register(PatchOnly(), name="patch-only-test")
    r = capture(tiny["llama"], phases=(Phase.PREFILL,), batch=2, seq_len=16, host=bare)
    g = r.graphs[Phase.PREFILL]
    assert g.missing_formulas == ("zrt_test.fused_mlp.default",)
    (fused,) = [n for n in g.nodes if n.op == "zrt_test.fused_mlp.default"]
    assert fused.flops == 0 and fused.formula is None and fused.bytes > 0
    assert any("no formula for zrt_test.fused_mlp.default" in w for w in r.warnings)
