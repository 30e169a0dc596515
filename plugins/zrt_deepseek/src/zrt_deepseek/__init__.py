"""zrt-deepseek: DeepSeek model support for zrt.

What this distribution is for: scoped model patches (``zrt_model_patches``) that let the
capture front-end build DeepSeek-V2/V3-family models from their ``config.json`` without
weights or remote code, and the fused kernels DeepSeek runs (MLA attention, DeepEP-style
MoE dispatch/combine, FP8 GEMMs) as formulas and fusion rules. The package frame is in
place; its hooks are added in ``zrt_deepseek.plugin`` as they are built.
"""

__version__ = "0.1.0"
