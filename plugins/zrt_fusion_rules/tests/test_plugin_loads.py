"""The zrt-fusion-rules distribution is installed and its plugin loads through the entry point."""

from __future__ import annotations

import importlib
import importlib.metadata as md

from zrt_core.plugins import ENTRY_POINT_GROUP, get_plugin_manager


def test_entry_point_is_declared_by_the_distribution():
    eps = [ep for ep in md.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "zrt_fusion_rules"]
    assert len(eps) == 1
    assert eps[0].value == "zrt_fusion_rules.plugin"
    assert eps[0].dist is not None and eps[0].dist.name == "zrt-fusion-rules"


def test_plugin_is_registered_with_its_distribution_and_version(monkeypatch):
    monkeypatch.delenv("ZRT_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("ZRT_DISABLE_PLUGINS", raising=False)
    host = get_plugin_manager()
    info = {i.name: i for i in host.plugin_infos()}["zrt_fusion_rules"]
    assert info.distribution == "zrt-fusion-rules"
    assert info.version == md.version("zrt-fusion-rules")


def test_the_registered_plugin_is_the_entry_point_module():
    host = get_plugin_manager(autoload=True)
    module = importlib.import_module("zrt_fusion_rules.plugin")
    assert host.pm.get_plugin("zrt_fusion_rules") is module
