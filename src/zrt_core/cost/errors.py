"""The cost model's user-facing error."""

from __future__ import annotations

from zrt_core.errors import ZrtError


class CostError(ZrtError):
    """A node, collective or measured table that the cost model cannot price as given."""
