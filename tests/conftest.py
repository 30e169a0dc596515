"""Shared fixtures: a clean plugin environment, plugins registered for one test, throwaway
installed distributions with real entry points, and a small valid hardware spec."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zrt_core.plugins import (
    ENTRY_POINT_GROUP,
    ENV_DISABLE,
    ENV_DISABLE_AUTOLOAD,
    PluginHost,
    get_plugin_manager,
)

#: A complete, valid hardware spec (see the ``toy_yaml`` fixture).
TOY_SPEC_YAML = """\
id: toy_gpu
name: Toy GPU 16GB
vendor: toy
aliases: [toy, toy-16g]
source: "made up for tests"
compute: {fp32: 10, tf32: 40, bf16: 80, fp16: 80, fp8: 160, int8: 160}
memory:
  capacity_gb: 16
  bandwidth_gb_per_s: 1000
  caches: [{name: l2, capacity_mb: 8, bandwidth_gb_per_s: 4000}]
interconnect:
  - {name: link, bandwidth_gb_per_s: 100, latency_us: 2, devices: 4, efficiency: 0.75}
  - {name: net, bandwidth_gb_per_s: 25, latency_us: 5, devices: null}
power_w: 300
price_per_device_hour_usd: 1.5
efficiency: {matmul: 0.8, memory: 0.9, launch_overhead_us: 3}
"""


#: Set by the nox session that installs every package ("all"): there a test marked
#: ``needs`` whose distribution is missing fails instead of being skipped, so each marked
#: test is run by at least one CI session.
ENV_NEED_ALL = "ZRT_TESTS_NEED_ALL"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.needs("zrt-nvidia")``: the core-alone session (``nox -s tests``) has
    no hardware pack, so tests that price on one are skipped there and run in ``all``."""
    strict = os.environ.get(ENV_NEED_ALL) == "1"
    unmet: list[str] = []
    for item in items:
        marker = item.get_closest_marker("needs")
        missing = [d for d in (marker.args if marker else ()) if not _installed(d)]
        if not missing:
            continue
        if strict:
            unmet.append(f"{item.nodeid} needs {', '.join(missing)}")
        else:
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)} installed"))
    if unmet:
        raise pytest.UsageError(
            f"{ENV_NEED_ALL}=1 but {len(unmet)} tests need a distribution that is not "
            f"installed, e.g. {unmet[0]}; install every plugin (nox -s all)")


@pytest.fixture(autouse=True)
def _clean_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's ZRT_DISABLE_* settings must not change what a test sees."""
    monkeypatch.delenv(ENV_DISABLE_AUTOLOAD, raising=False)
    monkeypatch.delenv(ENV_DISABLE, raising=False)


@pytest.fixture
def toy_yaml() -> str:
    """The text of a complete, valid spec (id ``toy_gpu``); tests change one field at a time.

    Tests take it as a fixture rather than importing it: the combined run imports test
    modules with ``--import-mode=importlib``, where ``conftest`` is not importable by name.
    """
    return TOY_SPEC_YAML


@pytest.fixture
def toy_spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "toy_gpu.yaml"
    path.write_text(TOY_SPEC_YAML)
    return path


@pytest.fixture
def core_host() -> PluginHost:
    """A fresh host with the core's defaults and no entry points."""
    return get_plugin_manager(autoload=False)


@pytest.fixture
def register_plugin(core_host: PluginHost) -> Iterator[Callable[..., PluginHost]]:
    """Register plugin objects on ``core_host`` for this test; they are unregistered after.

    ``register_plugin(obj, "name", distribution="dist")`` returns the host.
    """
    names: list[str] = []

    def register(plugin: object, name: str, distribution: str = "test-dist",
                 version: str = "1.0") -> PluginHost:
        core_host.register(plugin, name, distribution=distribution, version=version)
        names.append(name)
        return core_host

    yield register
    for name in reversed(names):
        if core_host.pm.has_plugin(name):
            core_host.unregister(name)


@pytest.fixture
def install_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Path]]:
    """Install a throwaway distribution for this test: a ``*.dist-info`` with METADATA and
    ``entry_points.txt`` plus its files, in a directory put first on ``sys.path`` (and on
    ``PYTHONPATH`` for subprocesses). Every other ``zrt`` entry point is disabled through
    ``ZRT_DISABLE_PLUGINS`` unless ``isolate=False``, so results do not depend on what
    else is installed. Everything is removed after the test.

    ``install_distribution("zrt-toy-pack", entry_points={"toy": "toy_pack.plugin"},
    files={"toy_pack/__init__.py": "", "toy_pack/plugin.py": "..."})`` returns the site dir.
    """
    import importlib.metadata as md

    added_modules: list[str] = []
    installed: list[str] = []

    def install(dist_name: str, *, entry_points: dict[str, str], files: dict[str, str],
                version: str = "1.0", isolate: bool = True) -> Path:
        site = tmp_path / f"site-{dist_name}"
        for rel, text in files.items():
            path = site / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
            if rel.endswith(".py"):
                added_modules.append(rel[:-3].replace("/", ".").removesuffix(".__init__"))
        info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        info.joinpath("METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
        info.joinpath("entry_points.txt").write_text(
            f"[{ENTRY_POINT_GROUP}]\n"
            + "".join(f"{name} = {value}\n" for name, value in entry_points.items()))
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setenv("PYTHONPATH", str(site) + (
            f":{_env('PYTHONPATH')}" if _env("PYTHONPATH") else ""))
        installed.extend(entry_points)
        if isolate:
            others = sorted({ep.name for ep in md.entry_points(group=ENTRY_POINT_GROUP)}
                            - set(installed))
            monkeypatch.setenv(ENV_DISABLE, ",".join(others))
        return site

    yield install
    for module in added_modules:
        sys.modules.pop(module, None)


def _env(name: str) -> str:
    import os

    return os.environ.get(name, "")


@pytest.fixture
def install_hardware_pack(
    install_distribution: Callable[..., Path],
) -> Callable[..., Path]:
    """Install a minimal hardware pack for this test: ``package/plugin.py`` implementing
    ``zrt_hardware_specs`` over the YAML files given, behind one ``zrt`` entry point.

    ``install_hardware_pack("zrt-toy-pack", {"toy_gpu.yaml": TOY_SPEC_YAML})``
    """

    def install(dist_name: str, specs: dict[str, str], *, entry_point: str = "toy_pack",
                package: str = "toy_pack", version: str = "1.0",
                isolate: bool = True) -> Path:
        files = {
            f"{package}/__init__.py": "",
            f"{package}/plugin.py": """\
                from pathlib import Path

                from zrt_core import hookimpl
                from zrt_core.hardware import load_specs


                @hookimpl
                def zrt_hardware_specs():
                    return load_specs(Path(__file__).parent / "hardware")
                """,
        }
        for file_name, text in specs.items():
            files[f"{package}/hardware/{file_name}"] = text
        return install_distribution(dist_name, entry_points={entry_point: f"{package}.plugin"},
                                    files=files, version=version, isolate=isolate)

    return install
