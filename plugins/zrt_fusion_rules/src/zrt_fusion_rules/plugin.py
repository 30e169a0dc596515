"""The ``zrt_fusion_rules`` plugin module, loaded through the ``zrt`` entry point.

It contributes one :class:`zrt_core.transforms.fusion.FusionRulePack` per YAML file in
``rules/`` (``cuda``, ``ascend``, ``generic``); the fusion transform applies the packs of
the hardware's platform, then the generic one.
"""

from __future__ import annotations

from pathlib import Path

from zrt_core.plugin import FusionRulePack, SpecError, hookimpl

RULES_DIR = Path(__file__).parent / "rules"


def load_packs(directory: Path = RULES_DIR) -> list[FusionRulePack]:
    """Every ``*.yaml`` pack in ``directory``, sorted by file name; an empty directory is
    an error (rule files missing from the wheel)."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise SpecError(f"{directory}: no fusion rule packs (*.yaml)",
                        "reinstall zrt-fusion-rules; its rule files are missing")
    return [FusionRulePack.from_yaml(f) for f in files]


@hookimpl
def zrt_fusion_rules() -> list[FusionRulePack]:
    return load_packs()
