"""Every requirement of every pyproject (zrt-core, the four plugins, the example external
pack; dependencies, extras and build system) has a lower and an upper bound, so a fresh
install next month gets versions CI has run: the lower bounds in ``nox -s lowest-deps``, the
newest admitted in every other session."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = sorted([ROOT / "pyproject.toml", *ROOT.glob("plugins/*/pyproject.toml"),
                     ROOT / "tests/external_pack/pyproject.toml"])


def _requirements(path: Path) -> list[str]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    project = data["project"]
    return [*project.get("dependencies", ()),
            *(d for deps in project.get("optional-dependencies", {}).values() for d in deps),
            *data.get("build-system", {}).get("requires", ())]


def test_the_pyprojects_are_all_found():
    # zrt-core, the five first-party plugins (nvidia, ascend, deepseek, fusion_rules, xai)
    # and the external pack under tests/
    assert len(PYPROJECTS) == 7


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_requirement_has_a_lower_and_an_upper_bound(path):
    for text in _requirements(path):
        operators = {s.operator for s in Requirement(text).specifier}
        if operators == {"=="}:
            continue  # torch==2.13.0: exactly the CPU build CI runs
        assert ">=" in operators and "<" in operators, f"{path.name}: {text!r}"


def test_the_lowest_deps_session_pins_every_lower_bound_of_zrt_core():
    import importlib.util

    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    if spec is None or spec.loader is None or importlib.util.find_spec("nox") is None:
        pytest.skip("nox is not installed here")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    pins = noxfile.lower_bounds(noxfile.PYPROJECT)
    assert "torch==2.13.0" in pins and "transformers==5.23" in pins
    assert "hatchling==1.27" in pins  # the build backend builds with its oldest too
    assert len(pins) == len(_requirements(ROOT / "pyproject.toml"))


def test_the_lint_tools_are_bounded():
    """The lint session's tools are pinned like dependencies: ruff exactly, import-linter
    between the release CI ran and the next major."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    if spec is None or spec.loader is None or importlib.util.find_spec("nox") is None:
        pytest.skip("nox is not installed here")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    assert {s.operator for s in Requirement(noxfile.RUFF).specifier} == {"=="}
    assert {s.operator for s in Requirement(noxfile.IMPORT_LINTER).specifier} == {">=", "<"}
    lines = [line.split("#")[0].strip()
             for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()]
    assert noxfile.IMPORT_LINTER in lines  # the dev venv gets the same range


def test_no_module_is_over_800_lines():
    # issue 10's house rule: a module one can hold in one's head; split a longer one where
    # its own section comments draw the lines (docs/architecture.md)
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "src").rglob("*.py"))
            + sorted((ROOT / "plugins").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 800}
    assert long == {}
