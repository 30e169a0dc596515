"""Scoped model patches: applied inside a context around build and capture, never globally."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from attrs import frozen


@frozen
class ModelPatch:
    """A patch a plugin contributes through ``zrt_model_patches``.

    :param applies_to: ``config -> bool``; the harness enters only patches that apply.
    :param context: ``(config, options) -> context manager`` entered before the model is
        built and exited after capture.
    """

    name: str
    applies_to: Callable[[Any], bool]
    context: Callable[[Any, Any], AbstractContextManager[Any]]
    description: str = ""
