"""The ``zrt_fusion_rules`` plugin module, loaded through the ``zrt`` entry point.

It implements no hook yet: ``zrt plugins`` lists it with nothing contributed. Rule packs go
here as a ``@zrt_core.hookimpl`` function ``zrt_fusion_rules()`` returning a list of
:class:`zrt_core.transforms.fusion.FusionRulePack`.
"""

from __future__ import annotations
