"""Test, lint and packaging checks for zrt-core and its first-party plugins.

``nox`` runs every default session (what CI runs); ``nox -l`` lists them; ``nox -s tests``
runs one. Each session builds and installs the packages (not editable: the tests run
against what a user would install) into a fresh virtual environment, pinned torch first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - nox runs on 3.11 here; tomli is nox's own dependency on 3.10
    import tomli as tomllib

ROOT = Path(__file__).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: The exact torch pin from zrt-core's dependencies. It is installed first in every session:
#: a looser requirement, or torch pulled in as a dependency, may fetch a multi-GB CUDA build.
TORCH = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch=="))
#: First-party plugin distributions, by folder under plugins/.
PLUGINS = ("zrt_nvidia", "zrt_ascend", "zrt_deepseek", "zrt_fusion_rules", "zrt_xai")
#: The third-party pack that proves entry-point discovery of an installed wheel.
EXTERNAL_PACK = "tests/external_pack"
#: The tests that build real transformers models from configs: every family's capture and
#: every model patch (DeepSeek MLA, V3.2, V4 live in zrt_deepseek), every plugin model type
#: (Grok-1 in zrt_xai).
CAPTURE_TESTS = ("tests/capture", "plugins/zrt_deepseek/tests", "plugins/zrt_xai/tests")
#: What ``lowest-deps`` runs on the lowest versions: the CLI end to end, a capture, and the
#: exports (openpyxl's workbook, onnx's view), and the service's schema fuzz (fastapi, uvicorn,
#: pydantic, httpx and schemathesis at once) — every dependency's code path, in a minute.
LOWEST_TESTS = ("tests/test_cli_run.py", "tests/test_export.py",
                "tests/serve/test_schema_fuzz.py")
#: Linter version, pinned so a new ruff release cannot fail CI on unchanged code.
RUFF = "ruff==0.17.6"
#: The import-contract checker (pyproject.toml's [tool.importlinter]); 2.16 is the first CI ran,
#: a new major may change the contract format.
IMPORT_LINTER = "import-linter>=2.16,<3"
#: Arguments every pytest run gets; importlib mode lets test files share a basename across
#: the core's and the plugins' test folders in one run.
PYTEST_ARGS = ("-ra", "--import-mode=importlib", "-p", "no:cacheprovider")
#: The interpreter: the one nox runs on (CI makes one fresh venv and runs nox from it).
PYTHON = None
#: Runs every benchmarks/bench_*.py in its own process and summarises PASS/MISS per target.
BENCHMARK_RUNNER = "benchmarks/run_all.py"

nox.options.error_on_missing_interpreters = True
nox.options.default_venv_backend = "virtualenv"


def _install(session: nox.Session, *packages: str, extras: str = "test") -> None:
    """Pinned torch first, then zrt-core with ``extras``, then ``packages`` (paths)."""
    session.install(TORCH)
    session.install(f".[{extras}]")
    for package in packages:
        session.install(package)


def lower_bounds(pyproject: dict) -> list[str]:
    """``name==lowest`` for every requirement of a pyproject (dependencies, extras, build
    system): the version each range's lower bound names. A requirement without one is an
    error: its oldest admitted release would be one CI never ran."""
    from packaging.requirements import Requirement

    project = pyproject["project"]
    texts = [*project.get("dependencies", ()),
             *(d for deps in project.get("optional-dependencies", {}).values() for d in deps),
             *pyproject.get("build-system", {}).get("requires", ())]
    pins = []
    for text in texts:
        req = Requirement(text)
        lowest = [s.version for s in req.specifier if s.operator in (">=", "==")]
        if not lowest:
            raise ValueError(f"{text!r} has no lower bound")
        pins.append(f"{req.name}=={lowest[0]}")
    return pins


def _pytest(session: nox.Session, *paths: str) -> None:
    session.run("pytest", *PYTEST_ARGS, *session.posargs, *paths)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Lint the core, the plugins, the tests and this file with ruff; check the import
    contracts (layers, no cycle, plugins through zrt_core.plugin) with import-linter, which
    reads the sources from the paths below (nothing to install)."""
    session.install(RUFF, IMPORT_LINTER)
    session.run("ruff", "check", "src", "tests", "plugins", "noxfile.py", "benchmarks")
    sources = [str(ROOT / "src"), *(str(ROOT / "plugins" / p / "src") for p in PLUGINS)]
    session.run("lint-imports", env={"PYTHONPATH": ":".join(sources)})


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Core tests with only zrt-core installed (no plugin may be needed)."""
    _install(session)
    _pytest(session, "tests")


@nox.session(python=PYTHON)
def plugins(session: nox.Session) -> None:
    """Each first-party plugin's tests with only zrt-core and that plugin installed: one
    environment (torch and the core installed once), each plugin installed, tested and
    uninstalled in turn, so no plugin's tests can lean on another's."""
    _install(session)
    for plugin in PLUGINS:
        session.install(f"plugins/{plugin}")
        _pytest(session, f"plugins/{plugin}/tests")
        session.run("python", "-m", "pip", "uninstall", "-y", "-q",
                    plugin.replace("_", "-"))


@nox.session(python=PYTHON)
def external_pack(session: nox.Session) -> None:
    """Install the example third-party pack as a wheel; zrt must list it and its distribution."""
    _install(session, EXTERNAL_PACK)
    session.run("python", f"{EXTERNAL_PACK}/check_installed.py")


@nox.session(name="all", python=PYTHON)
def all_packages(session: nox.Session) -> None:
    """Every package installed together, the server's and Ray's extras too (tests/serve and
    the search on a local Ray instance run here; the core-alone ``tests`` session skips
    them); the core's and every plugin's tests in one run."""
    # ray: one 79 MB wheel (its other dependencies are mostly here already), ~15 s of CPU to
    # install; cheaper than a session of its own, which would install torch again
    _install(session, *(f"plugins/{p}" for p in PLUGINS),
             extras="test,onnx,serve,serve-test,ray")
    # tests marked ``needs`` (they price on zrt-nvidia's packs) are skipped in the core-alone
    # session; here a missing distribution is an error, so every one of them runs somewhere
    session.env["ZRT_TESTS_NEED_ALL"] = "1"
    _pytest(session, "tests", *(f"plugins/{p}/tests" for p in PLUGINS))


@nox.session(name="lowest-deps", python=PYTHON)
def lowest_deps(session: nox.Session) -> None:
    """The CLI, export, every family's capture and every model patch (zrt_deepseek's MLA, V3.2
    and V4 included) with every dependency at its lowest admitted version (transformers 5.23:
    the patches must work on both keywords the tested range passes the KV cache by)."""
    constraints = Path(session.create_tmp()) / "lowest.txt"
    constraints.write_text("\n".join(lower_bounds(PYPROJECT)) + "\n")
    session.install(TORCH)
    # the oldest build backend builds the wheels too (no isolated build environment)
    session.install("-c", str(constraints), "hatchling")
    session.install("--no-build-isolation", "-c", str(constraints), ".[test,onnx,serve,serve-test]",
                    "plugins/zrt_nvidia", "plugins/zrt_deepseek", "plugins/zrt_xai",
                    "plugins/zrt_fusion_rules")
    session.run("python", "-m", "pip", "freeze")
    # these tests need zrt-nvidia, zrt-deepseek, zrt-xai and zrt-fusion-rules (capture --out)
    session.env["ZRT_TESTS_NEED_ALL"] = "1"
    _pytest(session, *LOWEST_TESTS, *CAPTURE_TESTS)


@nox.session(python=PYTHON, default=False)
def compat(session: nox.Session) -> None:
    """Early warning: the capture and patch tests on the newest transformers release, outside
    the tested range. Not in the default run; a failure here is the next break to fix before
    the range in pyproject.toml moves."""
    _install(session, "plugins/zrt_deepseek")
    session.install("--upgrade", "transformers")
    session.run("python", "-c", "import transformers; print('transformers', "
                "transformers.__version__)")
    _pytest(session, *CAPTURE_TESTS)


@nox.session(python=PYTHON, default=False)
def benchmarks(session: nox.Session) -> None:
    """Every benchmark against the installed packages: targets met or missed, and a summary."""
    _install(session, *(f"plugins/{p}" for p in PLUGINS))
    # run_all gives each script a temporary capture cache and working directory, finds the
    # validation file in ../shared (--shared DIR to point elsewhere) and writes nothing here
    session.run("python", BENCHMARK_RUNNER, *session.posargs)
