"""The published runs shipped inside zrt-core (``zrt validate --suite public``) are the
shared validation file, byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zrt_core.validate import suite_path

#: The shared folder beside the repository (CI checks it out at ``../shared``);
#: ``ZRT_SHARED`` overrides it, as for the benchmarks.
ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ZRT_SHARED") or ROOT.parent / "shared")


def test_shipped_public_suite_equals_the_shared_file() -> None:
    shared = SHARED / "validation" / "public.yaml"
    if not shared.is_file():
        pytest.skip(f"{shared} is absent (the shared folder is checked out beside the "
                    "repository in CI); nothing to compare the shipped copy with")
    shipped = suite_path("public")
    assert shipped.read_bytes() == shared.read_bytes(), (
        f"{shipped} differs from {shared}: copy the shared file into the package "
        f"(cp {shared} {shipped})")
