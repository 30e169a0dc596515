"""Moved to :mod:`zrt_core.modelmath.flops` (below the capture, which checks its FLOPs against
them); this name stays importable."""

from zrt_core.modelmath.flops import *  # noqa: F403
