"""Bad input is one line saying what is wrong (a ModelError), never a traceback."""

from __future__ import annotations

import pytest

from zrt_core.capture.api import capture
from zrt_core.errors import ModelError


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, ModelError)
    return text


@pytest.mark.parametrize("kwargs,needle", [
    ({"batch": 0}, "batch must be a positive integer"),
    ({"batch": True}, "batch must be a positive integer"),
    ({"seq_len": -4}, "seq_len must be a positive integer"),
    ({"phases": ("prefill", "serve")}, "unknown phase 'serve'"),
    ({"phases": ()}, "no phase to capture"),
    ({"dtype": "int8"}, "unsupported dtype 'int8'"),
    ({"moe_imbalance": 0.5}, "moe_imbalance must be a number >= 1.0"),
])
def test_bad_options(host, tiny, kwargs, needle):
    with pytest.raises(ModelError) as exc:
        capture(tiny["llama"], host=host, **kwargs)
    assert needle in _one_line(exc)


def test_unknown_model_name(host, tiny):
    with pytest.raises(ModelError) as exc:
        capture("no-such-model-xyz", host=host)
    assert "not found" in _one_line(exc)


def test_unknown_model_type(host, tiny):
    with pytest.raises(ModelError) as exc:
        capture({**tiny["llama"], "model_type": "llamma"}, host=host)
    assert "unknown model_type 'llamma'" in _one_line(exc)


def test_missing_model_type(host, tiny):
    with pytest.raises(ModelError) as exc:
        capture({"hidden_size": 64}, host=host)
    assert "model_type" in _one_line(exc)


def test_field_of_the_wrong_type(host, tiny):
    # refused from the config numbers (zrt_core.checks), before transformers is asked
    with pytest.raises(ModelError) as exc:
        capture({**tiny["llama"], "hidden_size": "wide"}, host=host)
    assert "hidden_size must be an integer, got 'wide'" in _one_line(exc)


def test_a_field_transformers_rejects(host, tiny):
    with pytest.raises(ModelError) as exc:
        capture({**tiny["llama"], "rope_theta": "fast"}, host=host, phases=("prefill",))
    assert "transformers cannot build 'llama'" in _one_line(exc)


def test_heads_that_do_not_divide_the_hidden_size(host, tiny):
    # 4 heads of a 130-wide hidden state: refused from the numbers, before any build
    with pytest.raises(ModelError) as exc:
        capture({**tiny["llama"], "hidden_size": 130, "num_key_value_heads": 4}, host=host,
                phases=("prefill",))
    assert "4 attention heads do not divide hidden size 130" in _one_line(exc)


def test_malformed_json_file(host, tiny, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64,,}')
    with pytest.raises(ModelError) as exc:
        capture(str(bad), host=host)
    assert "malformed JSON" in _one_line(exc)


def test_encoder_decoder_model_has_no_causal_lm(host, tiny):
    with pytest.raises(ModelError) as exc:
        capture({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4,
                 "d_ff": 128, "d_kv": 16, "vocab_size": 100}, host=host)
    assert "no causal language model" in _one_line(exc)


def test_model_code_failure_is_one_line_and_quiet(host, tiny, capfd):
    # BERT has a causal-LM head; a RoPE scaling it ignores lets 2048 positions past zrt's
    # check (64 × 64 = 4096), but its 64 learned position embeddings cannot be indexed
    with pytest.raises(ModelError) as exc:
        capture({"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
                 "max_position_embeddings": 64, "rope_scaling": {"factor": 64.0}}, host=host,
                phases=("prefill",))
    assert "prefill failed in the model code" in _one_line(exc)
    assert "Traceback" not in capfd.readouterr().err


def test_sequence_longer_than_the_positions_is_refused_up_front(host, tiny):
    # decode needs seq_len + 1 = 17 positions; the config has 16
    with pytest.raises(ModelError) as exc:
        capture({**tiny["gpt2"], "n_positions": 16}, host=host, batch=1, seq_len=16,
                phases=("prefill", "decode"))
    assert "(17 tokens) exceeds config's 16 positions" in _one_line(exc)
