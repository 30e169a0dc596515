"""zrt-deepseek: DeepSeek's production attention for zrt's capture front-end.

Scoped model patches (``zrt_model_patches``) rewrite transformers' reference attention of
DeepSeek-V2/V3/V3.2/V4 and Kimi K2 into the kernels engines run — absorbed MLA decode over
the latent cache, DSA's lightning indexer and top-k attention, V4's sparse attention over
window and compressed entries — as ``deepseek::`` custom ops whose FLOP/byte formulas are
registered through ``zrt_op_formulas``. :mod:`zrt_deepseek.kernels` selects the Ascend
kernels for the DSA path; :mod:`zrt_deepseek.analytic` counts V4's FLOPs from the config.
"""

__version__ = "0.1.0"
