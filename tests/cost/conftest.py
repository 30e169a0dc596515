"""Fixtures of the cost tests; the toy device and node builders live in builders.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from zrt_core.hardware import HardwareSpec
from zrt_core.ir.graph import OpNode

from .builders import make_toy, mm_node, op_node


@pytest.fixture
def toy() -> HardwareSpec:
    return make_toy()


@pytest.fixture
def node() -> Callable[..., OpNode]:
    return op_node


@pytest.fixture
def mm() -> Callable[..., OpNode]:
    return mm_node
