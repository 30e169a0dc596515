"""``zrt_reference_flops``: plugins count the families the core's analytic reference does not
describe; the core's count comes first for the ones it does; a bad answer names the plugin.

The toy plugin answers with a fixed ``PhaseFlops`` (matmul 1000, attention 20, lm_head 5:
total 1025) for any config whose model_type is ``toy_family``.
"""

from __future__ import annotations

from typing import Any

import pytest

from zrt_core import hookimpl
from zrt_core.analytic.flops import PhaseFlops, phase_flops, reference_flops
from zrt_core.errors import ModelError, PluginError
from zrt_core.plugins import PluginHost

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
TOY = {"model_type": "toy_family"}
V4 = {**LLAMA, "model_type": "deepseek_v4"}  # a family the core has no analytic model of


def _answer(phase: str, batch: int, seq_len: int) -> PhaseFlops:
    return PhaseFlops(phase=phase, batch=batch, seq_len=seq_len, tokens=batch * seq_len,
                      matmul=1000, attention=20, ssm=0, lm_head=5)


class Counts:
    """Answers for every model: the toy count, to show the core's families are not asked."""

    @hookimpl
    def zrt_reference_flops(self, config, phase, batch, seq_len):
        return _answer(phase, batch, seq_len)


class Declines:
    @hookimpl
    def zrt_reference_flops(self, config, phase, batch, seq_len):
        return None


def _plugin(answer: Any) -> object:
    class Plugin:
        @hookimpl
        def zrt_reference_flops(self, config, phase, batch, seq_len):
            return answer(phase, batch, seq_len) if callable(answer) else answer

    return Plugin()


def test_the_core_counts_its_families_first(register_plugin) -> None:
    host = register_plugin(Counts(), "counts")
    flops, source = reference_flops(LLAMA, "prefill", 2, 16, host=host)
    assert (flops, source) == (phase_flops(LLAMA, "prefill", 2, 16), "zrt-core")


def test_a_plugin_counts_a_family_the_core_does_not(register_plugin) -> None:
    host = register_plugin(Counts(), "counts", distribution="zrt-toy")
    flops, source = reference_flops(V4, "decode", 3, 40, host=host)
    assert flops.total == 1025 and (flops.phase, flops.batch, flops.seq_len) == ("decode", 3, 40)
    assert source == "zrt-toy"


def test_without_an_answer_the_cores_message_stays_with_a_hint(core_host: PluginHost,
                                                               register_plugin) -> None:
    register_plugin(Declines(), "declines")
    with pytest.raises(ModelError, match="no analytic model for model_type 'deepseek_v4'") as e:
        reference_flops(V4, "prefill", 1, 8, host=core_host)
    assert "zrt_reference_flops" in e.value.hint
    with pytest.raises(ModelError, match="unknown phase 'optimizer'"):
        reference_flops(V4, "optimizer", 1, 8, host=core_host)


def test_the_first_answer_wins_last_registered_first(register_plugin) -> None:
    register_plugin(_plugin(lambda p, b, s: _answer(p, b, s)), "first", distribution="a")
    host = register_plugin(Declines(), "second", distribution="b")
    # "second" is asked first (pluggy's order) and declines; "first" answers
    assert host.reference_flops(TOY, "prefill", 1, 8)[1] == "a"
    register_plugin(Counts(), "third", distribution="c")
    assert host.reference_flops(TOY, "prefill", 1, 8)[1] == "c"


@pytest.mark.parametrize(("answer", "message"), [
    (42, r"plugin 'bad' \(zrt-bad\): zrt_reference_flops returned a int, expected "
         "PhaseFlops or None"),
    (lambda p, b, s: _answer("decode", b, s),
     "answered for decode/batch 1/seq_len 8, asked for prefill/batch 1/seq_len 8"),
    (lambda p, b, s: 1 / 0, r"'bad' \(zrt-bad\) failed in zrt_reference_flops: "
                            "ZeroDivisionError"),
])
def test_a_bad_answer_names_the_plugin(register_plugin, answer, message) -> None:
    host = register_plugin(_plugin(answer), "bad", distribution="zrt-bad")
    with pytest.raises(PluginError, match=message) as err:
        reference_flops(TOY, "prefill", 1, 8, host=host)
    assert "\n" not in str(err.value)


def test_a_wrapper_on_the_query_hook_is_refused(core_host: PluginHost) -> None:
    class Wraps:
        @hookimpl(wrapper=True)
        def zrt_reference_flops(self, config, phase, batch, seq_len):
            return (yield)

    with pytest.raises(PluginError, match="wraps the query hook 'zrt_reference_flops'"):
        core_host.register(Wraps(), "wraps")
    assert not core_host.pm.has_plugin("wraps")


def test_the_capture_check_names_the_plugin_that_counted(register_plugin) -> None:
    from zrt_core.capture.api import capture

    v4 = dict(model_type="deepseek_v4", hidden_size=64, moe_intermediate_size=32,
              num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              q_lora_rank=32, o_groups=1, o_lora_rank=16, n_routed_experts=4,
              n_shared_experts=1, num_experts_per_tok=2, sliding_window=8, hc_mult=2,
              vocab_size=128, layer_types=["sliding_attention"], mlp_layer_types=["moe"])
    host = register_plugin(Counts(), "counts", distribution="zrt-toy")
    result = capture(v4, phases=("prefill",), batch=1, seq_len=8, host=host)
    check = result.flops_checks["prefill"]
    assert (check.analytic, check.reference) == (1025, "zrt-toy")
    assert check.to_json()["reference"] == "zrt-toy"
