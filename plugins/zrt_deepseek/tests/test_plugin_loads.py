"""The zrt-deepseek distribution is installed and its plugin loads through the entry point."""

from __future__ import annotations

import importlib
import importlib.metadata as md

from zrt_core.plugins import ENTRY_POINT_GROUP, get_plugin_manager


def test_entry_point_is_declared_by_the_distribution():
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "zrt_deepseek"]
    assert len(eps) == 1
    assert eps[0].value == "zrt_deepseek.plugin"
    assert eps[0].dist is not None and eps[0].dist.name == "zrt-deepseek"


def test_plugin_is_registered_with_its_distribution_and_version(monkeypatch):
    monkeypatch.delenv("ZRT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("ZRT_DISABLE_PLUGINS", raising=False)
    host = get_plugin_manager()
    info = {i.name: i for i in host.plugin_infos()}["zrt_deepseek"]
    assert info.distribution == "zrt-deepseek"
    assert info.version == md.version("zrt-deepseek")


def test_the_registered_plugin_is_the_entry_point_module():
    host = get_plugin_manager(autoload=True)
    module = importlib.import_module("zrt_deepseek.plugin")
    assert host.pm.get_plugin("zrt_deepseek") is module


def test_contributions(host):
    names = [p.name for p in host.model_patches]
    assert names[-3:] == ["deepseek.mla", "deepseek.v4_attention",
                          "deepseek.v4_hyper_connections"]
    for op in ("deepseek.mla_attention", "deepseek.mla_attention_backward",
               "deepseek.hc_split_sinkhorn", "deepseek.hc_split_sinkhorn_backward",
               "deepseek.lightning_indexer", "deepseek.sparse_attention",
               "deepseek.sparse_attention_backward", "deepseek.npu_sparse_flash_attention",
               "deepseek.npu_sparse_flash_attention_backward", "deepseek.npu_lightning_indexer"):
        assert host.formulas.lookup(f"{op}.default").op == op


def test_patches_apply_to_deepseek_families_only(host, tiny):
    from transformers import AutoConfig

    def applies(model_type, **fields):
        config = AutoConfig.for_model(model_type, **fields)
        return {p.name for p in host.model_patches
                if p.name.startswith("deepseek.") and p.applies_to(config)}

    for family in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
        cfg = dict(tiny[family])
        assert applies(cfg.pop("model_type"), **cfg) == {"deepseek.mla"}
    cfg = dict(tiny["deepseek_v4"])
    assert applies(cfg.pop("model_type"), **cfg) == {"deepseek.v4_attention",
                                                  "deepseek.v4_hyper_connections"}
    assert applies("llama", hidden_size=64, num_attention_heads=4) == set()


def test_zrt_capture_uses_the_plugin_through_its_entry_point(tmp_path, capsys):
    """The installed plugin rewrites MLA decode in a plain ``zrt capture``: the decode gap
    against the analytic (absorbed) count, which transformers' graph has, is gone."""
    import json

    from zrt_core.cli.main import main

    config = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 64,
              "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
              "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
              "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
              "qk_rope_head_dim": 8, "v_head_dim": 8, "vocab_size": 128,
              "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["capture", str(tmp_path), "--seq-len", "64", "--phases", "decode",
                 "--json"]) == 0
    decode = json.loads(capsys.readouterr().out)["phases"]["decode"]
    assert decode["gap_over_threshold"] is False and abs(decode["gap"]) < 0.05
