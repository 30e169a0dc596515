"""The capture cache's key: a change to an installed plugin's code (an editable install
keeps its version) gives a new key, so a patch edited since cannot be served stale."""

from __future__ import annotations

import os

from zrt_core.estimate.captures import cache_key

CONFIG = {"model_type": "llama", "hidden_size": 64}


def test_editing_a_plugins_code_changes_the_key(install_distribution):
    site = install_distribution("zrt-toy-patches", entry_points={"toy": "toy_patches.plugin"},
                                files={"toy_patches/__init__.py": "",
                                       "toy_patches/plugin.py": "X = 1\n"})
    first = cache_key(CONFIG, 16, "bfloat16", None)
    assert cache_key(CONFIG, 16, "bfloat16", None) == first
    plugin = site / "toy_patches" / "plugin.py"
    plugin.write_text("X = 22\n")  # another size
    assert cache_key(CONFIG, 16, "bfloat16", None) != first
    stat = plugin.stat()
    second = cache_key(CONFIG, 16, "bfloat16", None)
    os.utime(plugin, (stat.st_atime, stat.st_mtime + 10))  # same size, edited later
    assert cache_key(CONFIG, 16, "bfloat16", None) != second
