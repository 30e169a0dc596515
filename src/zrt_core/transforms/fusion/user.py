"""User rule packs (``--fusion-rules FILE``): a YAML pack loaded from a path and put into a
plugin host ahead of the installed packs.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from zrt_core.errors import SpecError
from zrt_core.hookspecs import hookimpl
from zrt_core.transforms.fusion.rules import FusionRulePack

if TYPE_CHECKING:
    from zrt_core.plugins import PluginHost

#: The plugin name a user pack is registered under (one per host).
USER_PLUGIN = "user-fusion-rules"


def load_user_pack(path: str | Path) -> FusionRulePack:
    """Read ``path`` as a rule pack marked ``user`` (it runs first).

    :raises SpecError: a missing file, bad YAML, or a bad rule — one line naming the file,
        the rule and the field.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"--fusion-rules {path}: no such file",
                        "give a rule pack YAML (zrt fusion discover MODEL -o FILE drafts one)")
    return FusionRulePack.from_yaml(path, user=True)


def add_user_pack(host: PluginHost, path: str | Path) -> FusionRulePack:
    """Load ``path`` and contribute it to ``host`` (plugin ``user-fusion-rules``), so every
    fusion on that host applies it before the installed packs of its platform.

    The same file twice is loaded once; another file is refused (one user pack per host).

    :raises SpecError: as :func:`load_user_pack`, or the pack's name is an installed pack's.
    """
    if host.pm.has_plugin(USER_PLUGIN):
        loaded = host.pm.get_plugin(USER_PLUGIN).pack
        if loaded.source == str(path):
            return loaded
        raise SpecError(f"--fusion-rules {path}: {loaded.source} is loaded already",
                        "give one user rule pack")
    pack = load_user_pack(path)
    if pack.name in host.fusion_rules:
        raise SpecError(f"{path}: name {pack.name!r} is already an installed fusion rule pack "
                        f"({host.fusion_rules.distribution_of(pack.name)})",
                        "give the user pack a name of its own")

    @hookimpl
    def zrt_fusion_rules() -> list[FusionRulePack]:
        return [pack]

    host.register(SimpleNamespace(zrt_fusion_rules=zrt_fusion_rules, pack=pack), USER_PLUGIN,
                  distribution=f"--fusion-rules {path}")
    return pack
