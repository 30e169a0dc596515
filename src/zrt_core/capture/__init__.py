"""Capture: a model config in, one operator graph per phase out (see :mod:`.api`).

``zrt_core.capture`` is both this package and the public function: once the package is
imported Python binds the name to the package, so the package itself is callable and
forwards to :func:`zrt_core.capture.api.capture`.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from zrt_core.capture.api import capture

        return capture(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
