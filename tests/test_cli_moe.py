"""``zrt run``'s MoE and decoding flags end to end on a tiny DeepSeek-V3 (8 routed experts,
top-2, one shared expert, one MTP layer declared): each moves what it should, bad values are
one line with exit 2. Exact per-rank rows and bytes: tests/transforms/test_moe_load.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.cli.main import main

TINY_DS = dict(model_type="deepseek_v3", hidden_size=128, intermediate_size=256,
               moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
               topk_group=1, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
               q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
               vocab_size=512, num_nextn_predict_layers=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_ds")
    (d / "config.json").write_text(json.dumps(TINY_DS))
    return d


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _train(model_dir: Path, *flags: str) -> list[str]:
    return ["run", str(model_dir), "--hw", "h100", "--train", "--ep", "4", "--dp", "4",
            "--seq-len", "64", "--micro-batch", "2", "--global-batch", "8", *flags, "--json"]


def _infer(model_dir: Path, *flags: str) -> list[str]:
    return ["run", str(model_dir), "--hw", "h100", "--batch", "8", "--input-len", "64",
            "--output-len", "16", *flags, "--json"]


@pytest.mark.needs("zrt-nvidia")
def test_training_flags_move_their_parts(model_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, *_train(model_dir))
    skew = _json(capsys, *_train(model_dir, "--moe-imbalance", "2.75"))
    # the busiest of 4 EP ranks computes 1.75x the balanced expert rows (test_moe_load):
    # more forward and backward, and a larger all-to-all
    assert skew["forward_s"] > base["forward_s"] and skew["backward_s"] > base["backward_s"]
    assert skew["parallel"]["moe_load"] == {"imbalance": 2.75, "distribution": None,
                                            "redundant": 0}
    overlap = _json(capsys, *_train(model_dir, "--moe-shared-expert-overlap"))
    # the shared expert runs under the dispatch/combine: less EP time exposed, same compute
    assert overlap["exposed_comm_s"]["ep"] < base["exposed_comm_s"]["ep"]
    assert overlap["forward_s"] == base["forward_s"]
    mtp = _json(capsys, *_train(model_dir, "--mtp", "1"))
    # one more MoE block with its own head and loss on the (only) stage
    assert mtp["forward_s"] > base["forward_s"]
    assert any("multi-token prediction: 1 module" in n for n in mtp["notes"])


@pytest.mark.needs("zrt-nvidia")
def test_serving_mtp_divides_the_step_by_the_accepted_tokens(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _json(capsys, *_infer(model_dir))
    spec = _json(capsys, *_infer(model_dir, "--mtp", "1", "--mtp-acceptance", "0.5"))
    model = spec["throughput_model"]
    # 1 + 0.5 tokens a step; the step is one draft pass plus one verify over 2 tokens
    assert model["mtp_tokens_per_step"] == 1.5
    assert spec["tpot_ms"] == pytest.approx(model["decode_step_ms"] / 1.5)
    assert model["decode_step_ms"] == pytest.approx(model["mtp_draft_ms"]
                                                    + model["mtp_verify_ms"])
    # the verify pass costs at least the plain decode step (more tokens, same cache)
    assert model["mtp_verify_ms"] >= base["tpot_ms"] * (1 - 1e-9)
    assert spec["ttft_ms"] == base["ttft_ms"]


@pytest.mark.needs("zrt-nvidia")
@pytest.mark.parametrize(("flags", "message"), [
    (("--ep", "4", "--dp", "4", "--eplb", "9"), "more redundant experts than the model's 8"),
    (("--eplb", "4"), "--ep is 1"),
    (("--ep", "4", "--dp", "4", "--eplb", "2"), "do not split over --ep 4"),
    (("--moe-imbalance", "dist:zipf"), "unknown MoE routing distribution"),
    (("--mtp-acceptance", "0.5"), "needs --mtp N"),
])
def test_bad_moe_flags_are_one_line(model_dir: Path, capsys: pytest.CaptureFixture[str],
                                    flags: tuple[str, ...], message: str) -> None:
    assert main(_infer(model_dir, *flags)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("zrt: error:") and "\n" not in err


@pytest.mark.needs("zrt-nvidia")
def test_eplb_is_refused_in_training(model_dir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_train(model_dir, "--eplb", "4")) == 2
    err = capsys.readouterr().err
    assert "does not apply to --train" in err and "--moe-imbalance" in err


@pytest.mark.needs("zrt-nvidia")
def test_serving_shared_expert_overlap_hides_the_dispatch(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ep = ("--ep", "4", "--dp", "4")
    base = _json(capsys, *_infer(model_dir, *ep))
    over = _json(capsys, *_infer(model_dir, *ep, "--moe-shared-expert-overlap"))
    assert over["workload"]["shared_expert_overlap"] is True
    # One MoE layer (first_k_dense_replace = 1 of 2 layers). Its shared expert (gate, up,
    # swiglu, down: ~24.5 us at 8 decode tokens) is issued right after the dispatch
    # all-to-all, which runs on the EP stream under it; the routed GEMMs then find the
    # dispatch done. The combine is still waited for (moe_combine reads it). So each step
    # saves exactly one of the layer's two equal all-to-alls (dispatch = combine bytes).
    for phase, key in (("decode", "tpot_ms"), ("prefill", "ttft_ms")):
        a2a = base[phase]["collectives"]["ep/all_to_all"]
        assert a2a["count"] == 2
        shared_s = base[phase]["by_layer_kind_ms"]  # the phase's serial sum is unchanged
        assert over[phase]["by_layer_kind_ms"] == shared_s
        assert base[key] - over[key] == pytest.approx(a2a["time_s"] / 2 * 1e3, rel=1e-9)
    # without EP there is no all-to-all to hide under: nothing moves
    tp = _json(capsys, *_infer(model_dir))
    tp_over = _json(capsys, *_infer(model_dir, "--moe-shared-expert-overlap"))
    assert (tp_over["tpot_ms"], tp_over["ttft_ms"]) == (tp["tpot_ms"], tp["ttft_ms"])


@pytest.mark.needs("zrt-nvidia")
def test_serving_measured_skew_slows_the_busiest_rank(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ep = ("--ep", "4", "--dp", "4")
    base = _json(capsys, *_infer(model_dir, *ep))
    skew = _json(capsys, *_infer(model_dir, *ep, "--moe-imbalance", "dist:deepseek-sglang"))
    assert skew["parallel"]["moe_load"]["distribution"] == "deepseek-sglang"
    # 8 experts on 4 ranks (2 a rank) drawn from the measured DeepSeek popularities (CV 0.70):
    # the busiest rank expects 1.47x (a large step) to 1.65x (16 rows a step) the balanced
    # rows (ExpertLoad.rank_load), so its grouped GEMMs and all-to-alls grow, the step too
    assert skew["tpot_ms"] > base["tpot_ms"] and skew["ttft_ms"] > base["ttft_ms"]
    assert main(_infer(model_dir, *ep, "--moe-imbalance", "dist:zipf")) == 2
    err = capsys.readouterr().err.strip()
    assert "dist:multinomial or dist:deepseek-sglang" in err and "\n" not in err


@pytest.mark.needs("zrt-nvidia")
def test_serving_ep_inside_the_tp_group_takes_the_engines_expert_tp(
        model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # TensorRT-LLM's Mapping: moe_tp = tp // moe_ep when only the EP size is given, so
    # --tp 4 --ep 4 runs the 8 experts whole, 2 per rank (expert TP 1), and --tp 4 --ep 2
    # splits each of a rank's 4 experts 2 ways (expert TP 4 // 2 = 2). Training keeps
    # Megatron's default (expert TP = TP), where ep × etp = 4 × 4 needs dp 4.
    for ep, etp in (("4", 1), ("2", 2)):
        out = _json(capsys, *_infer(model_dir, "--tp", "4", "--ep", ep))
        assert (out["parallel"]["tp"], out["parallel"]["ep"], out["parallel"]["etp"]) == (
            4, int(ep), etp)
    # without EP the experts span the instance too (vLLM: a DP × TP tensor-parallel group;
    # TensorRT-LLM's MoE under attention DP): --tp 2 --dp 2 splits every expert 4 ways,
    # the layout the serving search prices for the same flags
    out = _json(capsys, *_infer(model_dir, "--tp", "2", "--dp", "2"))
    assert (out["parallel"]["tp"], out["parallel"]["dp"], out["parallel"]["ep"],
            out["parallel"]["etp"]) == (2, 2, 1, 4)
    # a given expert TP is priced as given: 4 × 4 does not fit 4 ranks, one line, exit 2
    assert main(_infer(model_dir, "--tp", "4", "--ep", "4", "--etp", "4")) == 2
    err = capsys.readouterr().err.strip()
    assert "ep × expert tp = 4 × 4 must divide" in err and "\n" not in err
