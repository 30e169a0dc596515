"""zrt-fusion-rules: fusion rule packs for zrt, one per platform.

What this distribution is for: the patterns of operators inside one module scope that a
platform's compiler or kernel library runs as one fused kernel (RMSNorm, SwiGLU, rotary
embedding, attention, ...), per platform (``cuda``, ``ascend``, ``generic``), contributed
through ``zrt_fusion_rules`` as :class:`zrt_core.transforms.fusion.FusionRulePack` values.
The package frame is in place; its hooks are added in ``zrt_fusion_rules.plugin``.
"""

__version__ = "0.1.0"
