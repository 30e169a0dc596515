"""Ground truth from a real device: calibrate a hardware pack, measure a model's steps,
diff them against zrt's prediction, and micro-benchmark kernels into measured tables.

Everything here runs real PyTorch on the device named (``cpu`` or ``cuda``); nothing is
imported from :mod:`zrt_core.cli`. docs/profile.md describes the commands and the figures.
"""
