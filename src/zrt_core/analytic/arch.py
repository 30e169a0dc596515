"""Moved to :mod:`zrt_core.modelmath.arch` (below the capture, which uses it); this name stays
importable."""

from zrt_core.modelmath.arch import *  # noqa: F403
from zrt_core.modelmath.arch import _attention_types  # noqa: F401
