"""The `zrt` command line: --version, hw list/show, plugins, models, and the one-line errors.

Each test that needs hardware installs a throwaway pack (a real entry point) and disables
every other installed plugin, so the output does not depend on what else is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zrt_core
from zrt_core.cli.main import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def toy_pack(install_hardware_pack, toy_yaml):
    return install_hardware_pack("zrt-toy-pack", {"toy_gpu.yaml": toy_yaml}, version="0.3")


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"zrt {zrt_core.__version__}\n"


def test_no_command_prints_help_and_exits_2(capsys):
    code, out, _err = _run(capsys)
    assert code == 2
    assert out.startswith("usage: zrt")


def test_a_usage_error_is_one_line_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["hw", "sell"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zrt: error: argument SUBCOMMAND")
    assert err.endswith("— see 'zrt hw --help'\n")


def test_an_unknown_flag_names_the_subcommand_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "llama3-8b", "--hw", "h100", "--bogus"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "zrt: error: unrecognized arguments: --bogus — see 'zrt run --help'\n")


def test_hw_list_json(capsys, toy_pack):
    code, out, err = _run(capsys, "hw", "list", "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {"hardware": [{
        "id": "toy_gpu", "name": "Toy GPU 16GB", "vendor": "toy",
        "bf16_tflops": 80.0, "fp8_tflops": 160.0, "fp4_tflops": None,
        "hbm_gb": 16.0, "hbm_gb_per_s": 1000.0,
        "scale_up": "link", "scale_up_devices": 4, "scale_up_gb_per_s": 100.0,
        "scale_out_gb_per_s": 25.0, "power_w": 300.0, "price_per_device_hour_usd": 1.5,
        "aliases": ["toy", "toy-16g"], "distribution": "zrt-toy-pack",
    }]}


def test_hw_list_table(capsys, toy_pack, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _err = _run(capsys, "hw", "list")
    assert code == 0
    row = next(line for line in out.splitlines() if "toy_gpu" in line)
    assert "Toy GPU 16GB" in row and "link ×4" in row and "toy, toy-16g" in row


def test_hw_show_by_alias_json(capsys, toy_pack):
    code, out, _err = _run(capsys, "hw", "show", "TOY-16G", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["id"], data["distribution"]) == ("toy_gpu", "zrt-toy-pack")
    assert data["compute"]["bf16_tflops"] == 80.0
    assert data["compute"]["power_limited_clock"] == 1.0   # the toy pack leaves the default
    assert data["interconnect"][0]["bandwidth_gb_per_s"] == 100.0


def test_hw_show_table_is_readable(capsys, toy_pack, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _err = _run(capsys, "hw", "show", "toy")
    assert code == 0
    for expected in ("bf16 dense", "80 TFLOP/s", "16 GB at 1000 GB/s", "cache l2",
                     "100 GB/s per device per direction, 2 µs, 4 devices, efficiency 0.75",
                     "$1.5 per device-hour", "zrt-toy-pack"):
        assert expected in out, expected
    assert "training clock" not in out   # only a pack whose clock is not 1 names it


def test_an_unknown_id_gives_one_line_with_close_matches_and_exit_2(capsys, toy_pack):
    code, out, err = _run(capsys, "hw", "show", "toy_gpx")
    assert (code, out) == (2, "")
    assert err == ("zrt: error: unknown hardware id 'toy_gpx' — closest: toy_gpu, toy, toy-16g; "
                   "`zrt hw list` lists all\n")


def test_plugins_json_names_distribution_version_hooks_and_contributions(capsys, toy_pack):
    code, out, _err = _run(capsys, "plugins", "--json")
    assert code == 0
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert set(plugins) == {"zrt_core", "toy_pack"}
    assert plugins["toy_pack"] == {
        "name": "toy_pack", "distribution": "zrt-toy-pack", "version": "0.3",
        "hooks": ["zrt_hardware_specs"], "contributions": {"zrt_hardware_specs": ["toy_gpu"]},
    }
    assert plugins["zrt_core"]["distribution"] == "zrt-core"


def test_plugins_table(capsys, toy_pack, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _err = _run(capsys, "plugins")
    assert code == 0
    row = next(line for line in out.splitlines() if "toy_pack" in line)
    assert "zrt-toy-pack" in row and "0.3" in row and "hardware_specs: 1 (toy_gpu)" in row


def test_models_json_lists_bundled_configs_with_their_distribution(capsys):
    code, out, _err = _run(capsys, "models", "--json")
    assert code == 0
    models = {m["key"]: m for m in json.loads(out)["models"]}
    assert models["llama3-8b"]["distribution"] == "zrt-core"
    assert models["llama3-8b"]["model_type"] == "llama"


def test_a_broken_spec_gives_one_line_naming_file_and_field(capsys, install_hardware_pack,
                                                            toy_yaml):
    site = install_hardware_pack(
        "zrt-toy-pack", {"toy_gpu.yaml": toy_yaml.replace("devices: 4,", "devices: 0,")})
    code, out, err = _run(capsys, "hw", "list")
    assert (code, out) == (2, "")
    path = site / "toy_pack" / "hardware" / "toy_gpu.yaml"
    assert err == ("zrt: error: plugin 'toy_pack' (zrt-toy-pack) failed in zrt_hardware_specs: "
                   f"{path}: interconnect[0].devices must be > 0, got 0 — fix the plugin, or "
                   "disable it with ZRT_DISABLE_PLUGINS=toy_pack\n")


def test_a_plugin_raising_on_import_gives_one_line_and_exit_2(capsys, install_distribution):
    install_distribution("zrt-broken-pack", entry_points={"broken": "broken_pack.plugin"},
                         files={"broken_pack/__init__.py": "",
                                "broken_pack/plugin.py": "raise RuntimeError('no\\nluck')\n"})
    code, out, err = _run(capsys, "plugins")
    assert (code, out) == (2, "")
    assert err == ("zrt: error: plugin entry point 'broken' = 'broken_pack.plugin' from "
                   "distribution 'zrt-broken-pack' failed to import: RuntimeError: no luck — "
                   "reinstall or fix it, or skip it with ZRT_DISABLE_PLUGINS=broken\n")


def test_the_real_process_exits_2_without_a_traceback(install_distribution):
    install_distribution("zrt-broken-pack", entry_points={"broken": "broken_pack.plugin"},
                         files={"broken_pack/__init__.py": "",
                                "broken_pack/plugin.py": "1 / 0\n"})
    proc = subprocess.run([sys.executable, "-m", "zrt_core.cli.main", "hw", "list"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("zrt: error: plugin entry point 'broken'")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_hw_list_with_no_pack_says_how_to_get_one(capsys, monkeypatch):
    monkeypatch.setenv("ZRT_DISABLE_PLUGIN_AUTOLOAD", "1")
    code, out, _err = _run(capsys, "hw", "list")
    assert code == 0
    assert out == ("no hardware installed: install a hardware pack, e.g. "
                   "`pip install -e plugins/zrt_nvidia` (see README.md)\n")
    code, out, _err = _run(capsys, "hw", "list", "--json")
    assert json.loads(out) == {"hardware": []}


def test_a_table_written_to_a_pipe_keeps_its_own_width(capsys, monkeypatch):
    # capsys is not a terminal: rich alone would wrap every table at 80 columns
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _err = _run(capsys, "models")
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) > 80
    row = next(line for line in lines if "deepseek-v3.2 " in line)
    assert "DeepSeek-V3.2 671B (37B active, sparse attention)" in row  # one line, not wrapped


def test_width_sets_the_table_width(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _err = _run(capsys, "models", "--width", "60")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 60


def test_text_with_brackets_prints_literally(capsys):
    from zrt_core.cli._output import console, styled, table

    con = console()
    con.print("pip install 'zrt-core[onnx]'")
    con.print(styled("note: ONNX view skipped (pip install 'zrt-core[onnx]')", "dim"))
    con.print(table("t", ("a",), [("[bold]x[/]",)]))
    out = capsys.readouterr().out
    assert "pip install 'zrt-core[onnx]'\n" in out
    assert "(pip install 'zrt-core[onnx]')" in out
    assert "[bold]x[/]" in out
