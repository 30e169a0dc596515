"""zrt-fusion-rules: fusion rule packs for zrt, one per platform.

The patterns of operators inside one module scope that a platform's kernel libraries run
as one fused kernel (RMSNorm, SwiGLU, rotary embedding, attention, MoE routing, the loss),
for ``cuda``, ``ascend`` and ``generic``, as YAML files in ``rules/``. ``plugin.py``
contributes them through ``zrt_fusion_rules`` as
:class:`zrt_core.transforms.fusion.FusionRulePack` values; docs/fusion.md has the format.
"""

__version__ = "0.1.0"
