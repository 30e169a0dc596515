"""The plugin host: discovery through entry points, validation, registries, environment."""

from __future__ import annotations

import types

import attrs
import pytest
import yaml

import zrt_core.defaults
from zrt_core.errors import PluginError, UnknownNameError, ZrtError
from zrt_core.hardware import HardwareSpec
from zrt_core.plugins import (
    CORE_DISTRIBUTION,
    CORE_PLUGIN_NAME,
    ENV_DISABLE,
    ENV_DISABLE_AUTOLOAD,
    Registry,
    get_plugin_manager,
    hookimpl,
)


@pytest.fixture
def make_spec(toy_yaml):
    """``make_spec("a_gpu", aliases=("a",))``: the toy spec under another id and aliases."""

    def make(hw_id: str = "toy_gpu", aliases: tuple[str, ...] = ()) -> HardwareSpec:
        text = toy_yaml.replace("id: toy_gpu", f"id: {hw_id}").replace(
            "aliases: [toy, toy-16g]", f"aliases: [{', '.join(aliases)}]")
        return HardwareSpec.from_mapping(yaml.safe_load(text), source_file=f"{hw_id}.yaml")

    return make


def _hardware_plugin(*specs: HardwareSpec) -> types.SimpleNamespace:
    @hookimpl
    def zrt_hardware_specs():
        return list(specs)

    return types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs)


# -- the host ---------------------------------------------------------------------------


def test_each_call_builds_a_new_host_with_the_core_registered_through_the_hooks():
    a = get_plugin_manager(autoload=False)
    b = get_plugin_manager(autoload=False)
    assert a is not b and a.pm is not b.pm
    assert a.pm.get_plugin(CORE_PLUGIN_NAME) is zrt_core.defaults
    assert a.distribution(CORE_PLUGIN_NAME) == CORE_DISTRIBUTION
    core = {i.name: i for i in a.plugin_infos()}[CORE_PLUGIN_NAME]
    assert "zrt_model_configs" in core.hooks


def test_a_plugin_registered_for_one_test_contributes_then_is_gone(core_host, register_plugin,
                                                                   make_spec):
    register_plugin(_hardware_plugin(make_spec(aliases=("toy", "toy-16g"))), "toy",
                    distribution="zrt-toy")
    assert core_host.hardware.resolve("toy-16g") == "toy_gpu"
    assert core_host.hardware.distribution_of("TOY") == "zrt-toy"
    core_host.unregister("toy")
    assert "toy_gpu" not in core_host.hardware


def test_the_core_comes_first_then_plugins_in_registration_order(core_host, register_plugin,
                                                                 make_spec):
    register_plugin(_hardware_plugin(make_spec("a_gpu")), "first")
    register_plugin(_hardware_plugin(make_spec("b_gpu")), "second")
    assert [p for p, _v in core_host.contributions("zrt_hardware_specs")] == ["first", "second"]
    assert core_host.contributions("zrt_model_configs")[0][0] == CORE_PLUGIN_NAME


def test_each_hook_is_called_once_per_host(core_host, register_plugin, make_spec):
    calls = []

    @hookimpl
    def zrt_hardware_specs():
        calls.append(1)
        return [make_spec()]

    register_plugin(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "counted")
    assert len(core_host.hardware) == 1
    assert len(core_host.hardware) == 1
    core_host.plugin_infos()
    assert calls == [1]


def test_plugin_infos_name_distribution_version_hooks_and_contributions(
        core_host, register_plugin, make_spec):
    register_plugin(_hardware_plugin(make_spec("a_gpu"), make_spec("b_gpu")), "pack",
                    distribution="zrt-pack", version="2.5")
    info = {i.name: i for i in core_host.plugin_infos()}["pack"]
    assert info.to_json() == {
        "name": "pack", "distribution": "zrt-pack", "version": "2.5",
        "hooks": ["zrt_hardware_specs"],
        "contributions": {"zrt_hardware_specs": ["a_gpu", "b_gpu"]},
    }


# -- duplicates ---------------------------------------------------------------------------


def test_a_duplicate_id_names_both_distributions(core_host, register_plugin, make_spec):
    register_plugin(_hardware_plugin(make_spec()), "one", distribution="zrt-one")
    register_plugin(_hardware_plugin(make_spec()), "two", distribution="zrt-two")
    with pytest.raises(PluginError) as err:
        core_host.hardware  # noqa: B018 - collecting the registry is the action
    assert err.value.message == (
        "hardware id 'toy_gpu' is contributed twice: by 'zrt-one' and by 'zrt-two'")
    assert ENV_DISABLE in err.value.hint


def test_an_alias_clashing_with_another_id_is_a_duplicate(core_host, register_plugin,
                                                          make_spec):
    register_plugin(_hardware_plugin(make_spec("big_gpu")), "one", distribution="zrt-one")
    # Built in code (YAML would refuse an upper-case alias): names still clash ignoring case.
    shouting = attrs.evolve(make_spec("small_gpu"), aliases=("BIG_GPU",))
    register_plugin(_hardware_plugin(shouting), "two", distribution="zrt-two")
    with pytest.raises(PluginError, match="'big_gpu' is contributed twice: by 'zrt-one' "
                                          "and by 'zrt-two'"):
        core_host.hardware  # noqa: B018


def test_registry_lookup_is_case_insensitive_and_suggests_close_names(make_spec):
    reg: Registry[HardwareSpec] = Registry("hardware id", lambda s: s.id, lambda s: s.aliases,
                                           listing="zrt hw list")
    reg.add(make_spec("nvidia_h100_sxm", aliases=("h100",)), "zrt-nvidia")
    reg.add(make_spec("nvidia_h200", aliases=("h200",)), "zrt-nvidia")
    assert reg.resolve("H100") == "nvidia_h100_sxm"
    assert "h200" in reg and "H200" in reg and "h300" not in reg
    with pytest.raises(UnknownNameError) as err:
        reg.get("h10")
    assert err.value.message == "unknown hardware id 'h10'"
    assert err.value.hint == "closest: h100, h200; `zrt hw list` lists all"


def test_a_duplicate_within_one_registry_leaves_it_unchanged(make_spec):
    reg: Registry[HardwareSpec] = Registry("hardware id", lambda s: s.id, lambda s: s.aliases)
    reg.add(make_spec("a_gpu", aliases=("a",)), "zrt-one")
    with pytest.raises(PluginError):
        reg.add(make_spec("b_gpu", aliases=("a",)), "zrt-two")
    assert reg.keys() == ["a_gpu"] and "b_gpu" not in reg


# -- bad plugins ----------------------------------------------------------------------------


def test_a_hook_that_raises_names_the_plugin_and_distribution(core_host, register_plugin):
    @hookimpl
    def zrt_hardware_specs():
        raise RuntimeError("boom\nsecond line")

    register_plugin(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "bad",
                    distribution="zrt-bad")
    with pytest.raises(PluginError) as err:
        core_host.hardware  # noqa: B018
    assert err.value.message == (
        "plugin 'bad' (zrt-bad) failed in zrt_hardware_specs: RuntimeError: boom second line")
    assert err.value.hint == f"fix the plugin, or disable it with {ENV_DISABLE}=bad"


def test_a_hook_returning_the_wrong_type_names_the_plugin(core_host, register_plugin):
    @hookimpl
    def zrt_hardware_specs():
        return [{"id": "toy_gpu"}]

    register_plugin(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "dicts",
                    distribution="zrt-dicts")
    with pytest.raises(PluginError, match=r"^plugin 'dicts' \(zrt-dicts\): zrt_hardware_specs "
                                          r"returned a dict, expected HardwareSpec — "):
        core_host.hardware  # noqa: B018


def test_a_hook_returning_a_string_is_not_iterated(core_host, register_plugin):
    @hookimpl
    def zrt_hardware_specs():
        return "h100"

    register_plugin(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "str")
    with pytest.raises(PluginError, match="returned a str, not a list or tuple"):
        core_host.hardware  # noqa: B018


def test_a_zrt_function_without_hookimpl_is_refused(core_host):
    def zrt_hardware_specs():
        return []

    with pytest.raises(PluginError, match=r"defines zrt_hardware_specs\(\) without @hookimpl"):
        core_host.register(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "bare")
    assert not core_host.pm.has_plugin("bare")


def test_a_misspelt_hook_is_refused_and_left_unregistered(core_host):
    @hookimpl
    def zrt_hardware_spec():
        return []

    with pytest.raises(PluginError, match="implements 'zrt_hardware_spec', which is not a zrt"):
        core_host.register(types.SimpleNamespace(zrt_hardware_spec=zrt_hardware_spec), "typo")
    assert not core_host.pm.has_plugin("typo")


def test_a_wrapper_on_a_contribution_hook_is_refused(core_host):
    @hookimpl(wrapper=True)
    def zrt_hardware_specs():
        return (yield)

    with pytest.raises(PluginError, match="wraps the contribution hook 'zrt_hardware_specs'"):
        core_host.register(types.SimpleNamespace(zrt_hardware_specs=zrt_hardware_specs), "wrap")


def test_registering_a_taken_name_is_an_error(core_host, register_plugin):
    register_plugin(_hardware_plugin(), "same")
    with pytest.raises(PluginError, match="plugin 'same' is already registered"):
        core_host.register(_hardware_plugin(), "same")


# -- entry points -----------------------------------------------------------------------------


def test_an_installed_pack_is_discovered_through_its_entry_point(install_hardware_pack,
                                                                 toy_yaml):
    install_hardware_pack("zrt-toy-pack", {"toy_gpu.yaml": toy_yaml}, version="0.3")
    host = get_plugin_manager()
    assert host.hardware.distribution_of("toy") == "zrt-toy-pack"
    info = {i.name: i for i in host.plugin_infos()}["toy_pack"]
    assert (info.distribution, info.version) == ("zrt-toy-pack", "0.3")


def test_a_plugin_that_fails_to_import_names_entry_point_and_distribution(install_distribution):
    install_distribution("zrt-broken-pack", entry_points={"broken": "broken_pack.plugin"},
                         files={"broken_pack/__init__.py": "",
                                "broken_pack/plugin.py": "import zrt_no_such_module\n"})
    with pytest.raises(PluginError) as err:
        get_plugin_manager()
    assert err.value.message == (
        "plugin entry point 'broken' = 'broken_pack.plugin' from distribution "
        "'zrt-broken-pack' failed to import: ModuleNotFoundError: No module named "
        "'zrt_no_such_module'")
    assert err.value.hint == f"reinstall or fix it, or skip it with {ENV_DISABLE}=broken"


def test_a_missing_entry_point_module_is_an_import_failure(install_distribution):
    install_distribution("zrt-empty-pack", entry_points={"empty": "empty_pack.plugin"},
                         files={"empty_pack/__init__.py": ""})
    with pytest.raises(PluginError, match=r"'empty' = 'empty_pack\.plugin' from distribution "
                                          r"'zrt-empty-pack' failed to import"):
        get_plugin_manager()


@pytest.mark.parametrize("disable", ["broken", "zrt-broken-pack", " other , broken "])
def test_a_plugin_can_be_disabled_by_entry_point_or_distribution(install_distribution,
                                                                 monkeypatch, disable):
    install_distribution("zrt-broken-pack", entry_points={"broken": "broken_pack.plugin"},
                         files={"broken_pack/__init__.py": "",
                                "broken_pack/plugin.py": "raise ImportError('nope')\n"},
                         isolate=False)
    monkeypatch.setenv(ENV_DISABLE, disable)
    monkeypatch.setenv(ENV_DISABLE_AUTOLOAD, "1")  # keep other installed packs out ...
    assert not get_plugin_manager().pm.has_plugin("broken")
    monkeypatch.delenv(ENV_DISABLE_AUTOLOAD)        # ... and check the disable list alone
    import importlib.metadata as md

    others = {ep.name for ep in md.entry_points(group="zrt")} - {"broken"}
    monkeypatch.setenv(ENV_DISABLE, ",".join([disable, *others]))
    host = get_plugin_manager()
    assert not host.pm.has_plugin("broken")
    assert host.pm.has_plugin(CORE_PLUGIN_NAME)


@pytest.mark.parametrize(("value", "loads"), [("1", False), ("yes", False), ("true", False),
                                              ("0", True), ("false", True), ("", True)])
def test_autoload_can_be_switched_off(install_hardware_pack, monkeypatch, toy_yaml, value,
                                      loads):
    install_hardware_pack("zrt-toy-pack", {"toy_gpu.yaml": toy_yaml})
    monkeypatch.setenv(ENV_DISABLE_AUTOLOAD, value)
    host = get_plugin_manager()
    assert host.pm.has_plugin("toy_pack") is loads
    assert host.pm.has_plugin(CORE_PLUGIN_NAME)
    assert get_plugin_manager(autoload=True).pm.has_plugin("toy_pack")


def test_two_distributions_claiming_one_entry_point_name_are_named(install_hardware_pack,
                                                                   toy_yaml):
    install_hardware_pack("zrt-pack-a", {"a_gpu.yaml": toy_yaml.replace("toy", "a")},
                          entry_point="shared", package="pack_a")
    install_hardware_pack("zrt-pack-b", {"b_gpu.yaml": toy_yaml.replace("toy", "b")},
                          entry_point="shared", package="pack_b")
    with pytest.raises(PluginError, match="plugin name 'shared' is used by ") as err:
        get_plugin_manager()
    assert {"'zrt-pack-a'", "'zrt-pack-b'"} <= set(err.value.message.split())


def test_a_broken_spec_in_an_installed_pack_names_the_file_and_field(install_hardware_pack,
                                                                     toy_yaml):
    bad = toy_yaml.replace("bandwidth_gb_per_s: 1000", "bandwidth_gb_per_s: -1")
    install_hardware_pack("zrt-toy-pack", {"toy_gpu.yaml": bad})
    with pytest.raises(PluginError) as err:
        get_plugin_manager().hardware  # noqa: B018
    message = err.value.message
    assert message.startswith("plugin 'toy_pack' (zrt-toy-pack) failed in zrt_hardware_specs: ")
    assert message.endswith("toy_gpu.yaml: memory.bandwidth_gb_per_s must be > 0, got -1")
    assert isinstance(err.value, ZrtError)
