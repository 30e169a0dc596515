"""Fusion-rule discovery and user rule packs, with the core alone (no installed pack: a model
zrt has no rules for): the two-stage grouping of a tiny Llama, the drafted pack fusing it,
``zrt fusion discover`` then ``--fusion-rules`` on ``zrt capture`` and ``zrt run``, and a
bad rule file as one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from zrt_core.capture.api import capture
from zrt_core.cli.main import main
from zrt_core.errors import SpecError
from zrt_core.hookspecs import hookimpl
from zrt_core.ir.graph import OpGraph
from zrt_core.plugins import ENV_DISABLE_AUTOLOAD, get_plugin_manager
from zrt_core.transforms.fusion import FusionRulePack, fuse, packs_for_platform
from zrt_core.transforms.fusion.discover import discover, group_ops, op_token, snake
from zrt_core.transforms.fusion.user import add_user_pack, load_user_pack

LLAMA = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


@pytest.fixture(autouse=True)
def _core_only(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
               ) -> None:
    """No installed plugin (so no installed rule pack), captures in a temporary cache."""
    monkeypatch.setenv(ENV_DISABLE_AUTOLOAD, "1")
    monkeypatch.setenv("ZRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "zrt-cache"))


@pytest.fixture(scope="module")
def graphs() -> dict[str, OpGraph]:
    host = get_plugin_manager(autoload=False)
    return dict(capture(LLAMA, host=host, batch=1, seq_len=16).graphs)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


def test_names_and_tokens():
    assert op_token("aten.mul.Tensor") == "aten.mul"
    assert op_token("zrt.attention.default") == "zrt.attention"
    assert op_token("fused.rms_norm") == "fused.rms_norm"
    assert [snake(c) for c in ("LlamaRMSNorm", "GPT2MLP", "Qwen3MoeSparseMoeBlock")] == [
        "llama_rms_norm", "gpt2_mlp", "qwen3_moe_sparse_moe_block"]


def test_two_stage_grouping_of_a_llama_prefill(graphs):
    groups = group_ops(graphs["prefill"])
    merged = [(g.module_path, g.module_class, len(g.node_ids)) for g in groups
              if g.descendants]
    # stage two: the attention (3 projections, 2 × RoPE of 5 ops, 2 cache cats, the
    # attention, o_proj = 3 + 10 + 2 + 1 + 1 = 17 ops) and the MLP (3 GEMMs, silu, mul = 5)
    # hold at most 30 ops and take their sub-modules; the decoder layer holds 41 (norm 8 +
    # attention 17 + add + norm 8 + MLP 5 + add) and does not
    assert merged == [("model.layers.0.self_attn", "LlamaAttention", 17),
                      ("model.layers.0.mlp", "LlamaMLP", 5)]
    outer = [g for g in groups if not g.inside]
    top = [(g.module_class, len(g.node_ids)) for g in outer if not g.descendants]
    # stage one elsewhere: the two residual adds are two groups of the decoder layer (other
    # modules' ops run between them); the norm's 8 ops, the rotary cos/sin's 9
    assert top == [("Embedding", 1), ("LlamaModel", 2), ("LlamaRotaryEmbedding", 9),
                   ("LlamaRMSNorm", 8), ("LlamaDecoderLayer", 1), ("LlamaRMSNorm", 8),
                   ("LlamaDecoderLayer", 1), ("LlamaRMSNorm", 8), ("Linear", 1)]
    # every non-view op is in exactly one stage-two group: 61 of the graph's 103 nodes
    ops = [n.id for n in graphs["prefill"].nodes if not n.zero_cost]
    assert len(ops) == 61 and sorted(i for g in outer for i in g.node_ids) == sorted(ops)
    # and inside the merged ones, their stage-one groups: the q, k, v projections, the
    # attention's own 13 (RoPE, cache, attention), o_proj; the MLP's GEMMs, silu, mul
    inner = [(g.inside.rsplit(".", 1)[1], g.module_class, len(g.node_ids)) for g in groups
             if g.inside]
    assert inner == [("self_attn", "Linear", 1)] * 3 + [
        ("self_attn", "LlamaAttention", 13), ("self_attn", "Linear", 1)] + [
        ("mlp", "Linear", 1), ("mlp", "SiLUActivation", 1), ("mlp", "Linear", 1),
        ("mlp", "LlamaMLP", 1), ("mlp", "Linear", 1)]


def test_a_drafted_pack_fuses_a_model_without_installed_rules(graphs, tmp_path):
    found = discover(graphs, (), "generic", model="tiny-llama")
    assert {c.status for c in found.candidates} <= {"new", "single", "inert"}
    status = {c.name: c.status for c in found.candidates}
    assert status["llama_rms_norm"] == status["llama_attention"] == "new"
    # the attention's own ops are fused by the merged rule first, so its stage-one rule
    # fuses nothing here and is left out
    assert status["llama_attention_2"] == "inert"
    path = tmp_path / "rules.yaml"
    path.write_text(found.to_yaml())
    pack = load_user_pack(path)
    assert pack.user and pack.name == "discovered-tiny-llama" and pack.platform == "generic"
    assert [r.name for r in pack.rules] == [c.name for c in found.rules()]
    prefill = graphs["prefill"]
    out = fuse(prefill, [pack])
    assert dict(out.meta["fusion"]["fused"]) == {
        "discovered-tiny-llama/llama_model": 1, "discovered-tiny-llama/llama_rotary_embedding": 1,
        "discovered-tiny-llama/llama_rms_norm": 3, "discovered-tiny-llama/llama_attention": 1,
        "discovered-tiny-llama/llama_mlp": 1}
    # 103 nodes → 40: position ids 2 → 1 (−1); rotary cos/sin 9 ops + 1 view → 1 (−9);
    # three RMSNorms 8 → 1 (−21); the attention's 13 non-GEMM ops + 17 views and cache
    # tensors → 1 anchored on zrt.attention (−29); the MLP's silu, mul + 2 views → 1 (−3):
    # 103 − 1 − 9 − 21 − 29 − 3 = 40
    assert (len(prefill.nodes), len(out.nodes)) == (103, 40)
    attention = next(n for n in out.nodes if n.attrs.get("fusion_rule", "").endswith(
        "/llama_attention"))
    assert attention.op == "zrt.attention.default" and attention.category == "attention"
    assert out.totals().flops == prefill.totals().flops
    assert out.totals().bytes < prefill.totals().bytes


def test_a_user_pack_runs_ahead_of_the_installed_ones():
    def pack(name: str, platform: str, user: bool = False, priority: int = 0):
        return FusionRulePack(name=name, platform=platform, user=user, priority=priority)

    packs = [pack("cuda", "cuda", priority=5), pack("generic", "generic"),
             pack("mine", "generic", user=True), pack("npu", "ascend", user=True)]
    assert [p.name for p in packs_for_platform("cuda", packs)] == ["mine", "cuda", "generic"]
    assert [p.name for p in packs_for_platform("ascend", packs)] == ["npu", "mine", "generic"]
    assert [p.name for p in packs_for_platform("generic", packs)] == ["mine", "generic"]


def test_discover_then_capture_and_run_with_the_pack(model_dir, tmp_path, capsys, toy_yaml):
    rules = tmp_path / "rules.yaml"
    assert main(["fusion", "discover", str(model_dir), "--platform", "generic",
                 "-o", str(rules)]) == 0
    text = capsys.readouterr().out
    assert f"wrote {rules}: 10 rules" in text and "llama_attention" in text
    assert main(["capture", str(model_dir), "--phases", "prefill", "--seq-len", "16",
                 "--fusion-rules", str(rules), "--json"]) == 0
    fusion = json.loads(capsys.readouterr().out)["fusion"]
    # the same 103 → 40 as the library test: the pack is read as zrt reads any user pack
    assert fusion["pack"] == f"discovered-{model_dir.name}"  # the model's name
    assert fusion["packs"] == [fusion["pack"]]  # no installed pack
    assert fusion["phases"]["prefill"]["nodes_before"] == 103
    assert fusion["phases"]["prefill"]["nodes_after"] == 40

    hw = tmp_path / "toy.yaml"
    hw.write_text(toy_yaml)  # vendor toy: platform generic, where the pack applies
    runs = {}
    for mode in ("--infer", "--train"):
        for extra in ([], ["--fusion-rules", str(rules)]):
            argv = ["run", str(model_dir), "--hw", str(hw), mode, "--json", *extra]
            argv += (["--seq-len", "16"] if mode == "--train" else
                     ["--input-len", "16", "--output-len", "4", "--batch", "1"])
            assert main(argv) == 0
            runs[mode, bool(extra)] = json.loads(capsys.readouterr().out)
    plain, fused = runs["--infer", False], runs["--infer", True]
    # fewer kernels, the same FLOPs, less traffic: TTFT falls
    assert fused["prefill"]["flops"] == plain["prefill"]["flops"]
    assert fused["prefill"]["bytes"] < plain["prefill"]["bytes"]
    assert fused["ttft_ms"] < plain["ttft_ms"]
    assert runs["--train", True]["step_time_s"] < runs["--train", False]["step_time_s"]
    assert runs["--train", True]["model_flops"] == runs["--train", False]["model_flops"]


RULE = {"name": "norm", "scope": {"module_class": "*Norm"}, "match": "connected",
        "ops": ["aten.mul", "aten.add"], "op": "fused.norm", "category": "norm",
        "kernel": "k"}


@pytest.mark.parametrize("change, message", [
    ({"ops": ["mul"]}, "rules[0].ops[0]: 'mul' in 'mul' is not an op name (rule 'norm')"),
    ({"match": "sequence", "ops": ["aten.mul{2}"]},
     "rules[0].ops[0]: 'aten.mul{2}' in 'aten.mul{2}' is not an op name (rule 'norm')"),
    ({"ops": ["aten.mul+"]},
     "rules[0].ops[0]: 'aten.mul+' has a quantifier '+' (rule 'norm')"),
    ({"kernel": None}, "rules[0].kernel is required (rule 'norm')"),
    ({"name": None}, "rules[0].name is required"),
])
def test_a_malformed_rule_file_is_one_line_naming_file_rule_and_field(
        model_dir, tmp_path, capsys, change, message):
    rule = {k: v for k, v in {**RULE, **change}.items() if v is not None}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"name": "mine", "platform": "cuda", "rules": [rule]}))
    for argv in (["capture", str(model_dir)], ["run", str(model_dir), "--hw", "x"],
                 ["run", str(model_dir), "--hw", "x", "--train"]):
        assert main([*argv, "--fusion-rules", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zrt: error: {path}: {message}"), err
        assert err.count("\n") == 1


@pytest.mark.parametrize("text, message", [
    ("name: [mine\n", "line 2 is not valid YAML"),
    ("- just\n- a list\n", "expected a mapping, got list"),
    (None, "no such file"),
])
def test_a_rule_file_that_is_not_a_pack(model_dir, tmp_path, capsys, text, message):
    path = tmp_path / "rules.yaml"
    if text is not None:
        path.write_text(text)
    assert main(["capture", str(model_dir), "--fusion-rules", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zrt: error: ") and str(path) in err and message in err, err
    assert err.count("\n") == 1


def test_a_user_pack_may_not_take_an_installed_name(tmp_path):
    @hookimpl
    def zrt_fusion_rules() -> list[FusionRulePack]:
        return [FusionRulePack(name="cuda", platform="cuda")]

    host = get_plugin_manager(autoload=False)
    host.register(SimpleNamespace(zrt_fusion_rules=zrt_fusion_rules), "shipped")
    path = tmp_path / "rules.yaml"
    path.write_text("name: cuda\nplatform: cuda\nrules: []\n")
    with pytest.raises(SpecError, match="name 'cuda' is already an installed fusion rule"):
        add_user_pack(host, path)
    path.write_text("name: mine\nplatform: cuda\nrules: []\n")
    pack = add_user_pack(host, path)
    assert [p.name for p in packs_for_platform("cuda", host.fusion_rules)] == ["mine", "cuda"]
    assert add_user_pack(host, path) is pack  # the same file again: loaded once
    other = tmp_path / "other.yaml"
    other.write_text("name: other\nplatform: cuda\nrules: []\n")
    with pytest.raises(SpecError, match="is loaded already"):
        add_user_pack(host, other)



def test_an_estimate_spec_names_a_user_pack(model_dir, tmp_path, capsys, toy_yaml):
    from zrt_core.analytic.spec import EstimateSpec

    rules = tmp_path / "packs" / "rules.yaml"
    rules.parent.mkdir()
    norm = {**RULE, "scope": {"module_class": "*RMSNorm"}, "requires": ["aten.rsqrt"],
            "ops": ["aten._to_copy", "aten.pow", "aten.mean", "aten.add", "aten.rsqrt",
                    "aten.mul"]}
    rules.write_text(yaml.safe_dump({"name": "mine", "platform": "generic", "rules": [norm]}))
    (tmp_path / "toy.yaml").write_text(toy_yaml)
    spec = {"model": str(model_dir), "hardware": str(tmp_path / "toy.yaml"),
            "infer": {"input_len": 16, "output_len": 4, "batch": 1}}
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(spec))
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({**spec, "fusion_rules": "packs/rules.yaml"}))
    assert EstimateSpec.from_yaml(mine).fusion_rules == str(rules)  # from the spec's folder
    reports = []
    for path in (plain, mine):
        assert main(["estimate", "--config", str(path), "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    # the pack fuses each RMSNorm's eight ops into one: same FLOPs, less traffic
    assert reports[1]["prefill"]["flops"] == reports[0]["prefill"]["flops"]
    assert reports[1]["prefill"]["bytes"] < reports[0]["prefill"]["bytes"]
    with pytest.raises(SpecError, match="fusion_rules names a file"):
        EstimateSpec.from_mapping({**spec, "fusion_rules": "rules.yaml"}, where="request")
