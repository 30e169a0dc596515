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
    assert names[-2:] == ["deepseek.mla", "deepseek.v4_attention"]
    for op in ("deepseek.mla_attention", "deepseek.mla_attention_backward",
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
    assert applies(cfg.pop("model_type"), **cfg) == {"deepseek.v4_attention"}
    assert applies("llama", hidden_size=64, num_attention_heads=4) == set()
