"""Strict loading of YAML data files into frozen attrs values.

Each loader names the file and the field path in its errors ("h100.yaml: memory.
bandwidth_gb_per_s must be > 0"), so a vendor fixing a pack never has to guess.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from zrt_core.errors import SpecError, ZrtError


def read_json_file(path: str | Path, hint: str, error: type[ZrtError] = SpecError) -> Any:
    """A JSON file's value; a file that cannot be read, is not UTF-8 text or is not JSON is
    one ``error`` line ending in ``hint``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read {path} ({exc.strerror or exc})", hint) from None
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text (byte {exc.start})", hint) from None
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not JSON ({exc.msg}, line {exc.lineno})", hint) from None


class _DuplicateKey(yaml.MarkedYAMLError):
    """A mapping repeats a key (PyYAML would silently keep the last one)."""


#: libyaml's parser where PyYAML was built with it (the wheels are): the same safe
#: constructor, parsing in C — the packs' YAML took a third of a warm ``zrt run``.
_SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SAFE_LOADER):  # type: ignore[misc, valid-type]
    """A safe loader that rejects a key repeated within one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value_node in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            if isinstance(key, str | int | float | bool) and key in seen:
                raise _DuplicateKey(problem=f"key {key!r} appears twice",
                                    problem_mark=key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file strictly: a missing file, a syntax error or a key repeated in one
    mapping is a :class:`SpecError` naming the file (and the line where known)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds no objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}:{where} is not valid YAML ({problem})",
                        "fix the syntax and run again") from None


class Fields:
    """Reads a mapping field by field, rejecting unknown keys and bad values.

    :param data: the mapping to read.
    :param where: ``"file.yaml: section"`` prefix for messages.
    :param allowed: every key the mapping may have.
    """

    def __init__(self, data: Any, where: str, allowed: set[str] | frozenset[str]) -> None:
        self.where = where
        if not isinstance(data, Mapping):
            raise SpecError(f"{self._at()} expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(allowed))
        if unknown:
            raise SpecError(
                f"{self._at()} unknown key {unknown[0]!r}",
                f"allowed keys are {', '.join(sorted(allowed))}",
            )
        self.data = data

    def _at(self) -> str:
        """The message prefix: ``"file.yaml:"`` at top level, ``"file.yaml: memory:"`` below."""
        head = self.where.rstrip()
        return head if head.endswith(":") else f"{head}:"

    def path(self, key: str) -> str:
        """``"file.yaml: key"`` at top level, ``"file.yaml: memory.key"`` below."""
        return f"{self.where}.{key}" if not self.where.endswith(": ") else f"{self.where}{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def str(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.path(key)} is required")
            return default
        if not isinstance(value, str | int | float):
            raise SpecError(f"{self.path(key)} must be a string, got {value!r}")
        return str(value)

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        required: bool = False,
        positive: bool = False,
        non_negative: bool = False,
        at_most: float | None = None,
    ) -> float | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.path(key)} is required")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(f"{self.path(key)} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise SpecError(f"{self.path(key)} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise SpecError(f"{self.path(key)} must be > 0, got {value!r}")
        if non_negative and value < 0:
            raise SpecError(f"{self.path(key)} must be >= 0, got {value!r}")
        if at_most is not None and value > at_most:
            raise SpecError(f"{self.path(key)} must be <= {at_most}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int | None = None, *, required: bool = False,
                positive: bool = False) -> int | None:
        value = self.data.get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.path(key)} is required")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{self.path(key)} must be an integer, got {value!r}")
        if positive and value <= 0:
            raise SpecError(f"{self.path(key)} must be > 0, got {value!r}")
        return value

    def list(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(f"{self.path(key)} must be a list, got {type(value).__name__}")
        return value

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise SpecError(f"{self.path(key)} must be a mapping, got {type(value).__name__}")
        return value
