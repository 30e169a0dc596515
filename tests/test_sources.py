"""resolve_model: paths, bundled names, the local HF cache, and every way input goes wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zrt_core.capture.sources import (
    find_in_hf_cache,
    hf_cache_dir,
    read_config_file,
    resolve_model,
    transformers_config,
)
from zrt_core.errors import ModelError, ZrtError
from zrt_core.plugins import get_plugin_manager

TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
}


@pytest.fixture(scope="module")
def host():
    return get_plugin_manager(autoload=False)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty HF hub cache that resolve_model must use instead of the real one."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _cache_repo(cache: Path, repo_id: str, commits: dict[str, dict], main: str | None) -> None:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    for commit, cfg in commits.items():
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text(json.dumps(cfg))
    if main is not None:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(main)


def test_directory_with_config(tmp_path, host):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    m = resolve_model(d, host)
    assert m.name == "tiny-llama"
    assert m.config == TINY
    assert m.path == d / "config.json"
    assert m.source == f"file: {d / 'config.json'}"
    assert m.bundled is None and m.model_type == "llama"


def test_json_file_as_string(tmp_path, host):
    f = tmp_path / "my.json"
    f.write_text(json.dumps(TINY))
    m = resolve_model(str(f), host)
    assert m.name == "my"
    assert m.path == f


def test_mapping(host):
    m = resolve_model(dict(TINY), host)
    assert m.source == "mapping" and m.path is None and m.config == TINY


def test_bundled_key_and_alias(host):
    m = resolve_model("llama3-8b", host)
    assert m.bundled is not None and m.bundled.key == "llama3-8b"
    assert m.config["hidden_size"] == 4096
    assert m.source.startswith("bundled: llama3-8b")
    assert m.path is None


def test_bundled_name_case_insensitive(host):
    assert resolve_model("LLAMA3-8B", host).name == "llama3-8b"


def test_hf_cache_follows_refs_main(hf_cache, host):
    old = dict(TINY, hidden_size=32)
    new = dict(TINY, hidden_size=96)
    _cache_repo(hf_cache, "acme/tiny", {"aaa": old, "bbb": new}, main="bbb")
    m = resolve_model("acme/tiny", host)
    assert m.name == "acme/tiny"
    assert m.config["hidden_size"] == 96
    assert m.path == hf_cache / "models--acme--tiny" / "snapshots" / "bbb" / "config.json"
    assert m.source.startswith("HF cache: ")


def test_hf_cache_without_refs_takes_a_snapshot(hf_cache, host):
    _cache_repo(hf_cache, "acme/tiny", {"ccc": TINY}, main=None)
    assert resolve_model("acme/tiny", host).config == TINY


def test_hf_snapshot_directory_gets_repo_name(hf_cache, host):
    _cache_repo(hf_cache, "acme/tiny", {"ccc": TINY}, main="ccc")
    snap = hf_cache / "models--acme--tiny" / "snapshots" / "ccc"
    assert resolve_model(snap, host).name == "acme/tiny"


def test_hf_cache_dir_env_order(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert hf_cache_dir() == tmp_path / "direct"


def test_find_in_hf_cache_rejects_traversal(hf_cache):
    assert find_in_hf_cache("../etc") is None
    assert find_in_hf_cache("acme/missing") is None


def test_not_found_says_how_to_get_it(hf_cache, host):
    with pytest.raises(ModelError) as e:
        resolve_model("acme/nothing", host)
    text = str(e.value)
    assert "not found" in text
    assert "huggingface-cli download acme/nothing config.json" in text
    assert "\n" not in text


def test_not_found_suggests_closest_bundled(hf_cache, host):
    with pytest.raises(ModelError, match="closest bundled names: llama3-8b"):
        resolve_model("llama3-8", host)


def test_missing_path(tmp_path, host):
    with pytest.raises(ModelError, match="no such file or directory"):
        resolve_model(str(tmp_path / "nope.json"), host)


def test_directory_without_config(tmp_path, host):
    with pytest.raises(ModelError, match=r"directory has no config\.json"):
        resolve_model(tmp_path, host)


def test_malformed_json_names_file_and_position(tmp_path, host):
    f = tmp_path / "config.json"
    f.write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}')
    with pytest.raises(ModelError) as e:
        resolve_model(f, host)
    # Line 3 is `  "hidden_size": 64,,`: 2 spaces + 13 for the quoted key + ": 64," = 20
    # characters, so the second comma is column 21.
    assert str(e.value).startswith(f"{f}: malformed JSON at line 3 column 21")


def test_json_must_be_an_object(tmp_path):
    f = tmp_path / "config.json"
    f.write_text("[1, 2]")
    with pytest.raises(ModelError, match="expected a JSON object, got list"):
        read_config_file(f)


def test_missing_model_type(tmp_path, host):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({k: v for k, v in TINY.items() if k != "model_type"}))
    with pytest.raises(ModelError, match="config has no model_type"):
        resolve_model(f, host)


def test_unknown_model_type(host):
    with pytest.raises(ModelError) as e:
        resolve_model(dict(TINY, model_type="lamma"), host)
    assert "unknown model_type 'lamma'" in str(e.value)
    assert "similar built-in types: llama" in str(e.value)


def test_auto_map_is_dropped_for_a_builtin_type(host):
    cfg = dict(TINY, auto_map={"AutoConfig": "configuration_x.XConfig"})
    m = resolve_model(cfg, host)
    assert "auto_map" not in m.config
    assert m.notes and "auto_map ignored" in m.notes[0]


def test_remote_code_only_type_is_refused(host):
    cfg = dict(TINY, model_type="kimi_k2", auto_map={"AutoConfig": "configuration_kimi.X"})
    with pytest.raises(ModelError, match="never executes remote code"):
        resolve_model(cfg, host)


def test_unchecked_type_skips_transformers(host):
    m = resolve_model(dict(TINY, model_type="kimi_k2"), host, check_model_type=False)
    assert m.model_type == "kimi_k2"


def test_transformers_config_builds_and_rejects(host):
    cfg = transformers_config(TINY)
    assert cfg.hidden_size == 64 and cfg.num_key_value_heads == 2
    with pytest.raises(ZrtError, match="transformers rejects the config"):
        transformers_config(dict(TINY, hidden_size="wide"))


def test_bad_spec_type(host):
    with pytest.raises(ModelError, match="must be a name, a path or a config mapping"):
        resolve_model(42, host)  # type: ignore[arg-type]
