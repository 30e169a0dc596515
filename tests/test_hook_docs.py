"""Every hookspec has a section in docs/plugins.md and a test that implements it (as
datasette requires of its hooks), and the facade knows every hook's kind."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from zrt_core import hookspecs
from zrt_core.plugins import CONTRIBUTION_TYPES, QUERY_TYPES

ROOT = Path(__file__).resolve().parents[1]
HOOKS = sorted(name for name, value in vars(hookspecs).items()
               if name.startswith("zrt_") and inspect.isfunction(value))


def _test_files() -> list[Path]:
    files = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("plugins/*/tests/**/*.py")]
    return [f for f in files if f.name != Path(__file__).name]


def test_there_are_hooks_to_check() -> None:
    assert "zrt_hardware_specs" in HOOKS and "zrt_reference_flops" in HOOKS


@pytest.mark.parametrize("hook", HOOKS)
def test_each_hook_has_a_docs_section(hook: str) -> None:
    text = (ROOT / "docs" / "plugins.md").read_text()
    assert re.search(rf"^## `{hook}`$", text, re.M), f"docs/plugins.md has no '## `{hook}`'"


@pytest.mark.parametrize("hook", HOOKS)
def test_each_hook_has_a_test_that_implements_it(hook: str) -> None:
    pattern = re.compile(rf"@hookimpl[^\n]*\n\s*def {hook}\(")
    assert any(pattern.search(f.read_text()) for f in _test_files()), \
        f"no test defines a @hookimpl {hook}"


@pytest.mark.parametrize("hook", HOOKS)
def test_each_hook_is_a_contribution_or_a_query_hook(hook: str) -> None:
    spec = getattr(hookspecs, hook)
    query = hook in QUERY_TYPES
    assert query != (hook in CONTRIBUTION_TYPES)
    params = list(inspect.signature(spec).parameters)
    assert bool(params) == query  # contribution hooks take no arguments
    firstresult = getattr(spec, f"{hookspecs.PROJECT}_spec")["firstresult"]
    assert firstresult == query
    doc = inspect.getdoc(spec) or ""
    assert ":return:" in doc
    assert all(f":param {p}:" in doc for p in params)
    if query:
        assert "Stops at first non-None result." in doc
