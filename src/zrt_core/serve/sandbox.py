"""What a request may name: bundled models, inline configs, and configs inside the
operator's ``--model-dir`` — nothing else is read, nothing downloaded, no remote code.

:func:`model_reference` turns the ``model`` of a request into a config mapping (or a bundled
name) before a job is queued, so the worker never resolves a path or looks in the
HuggingFace cache. A path that leaves the model directory (``..``, an absolute path, a
symlink pointing out), a config with ``auto_map`` (code shipped with a checkpoint) and a
non-finite number are refused as :class:`RequestRefused` (HTTP 4xx).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zrt_core.errors import InternalError, ZrtError

#: The largest config.json read from the model directory (real ones are a few KiB).
MAX_CONFIG_BYTES = 1 << 20


class RequestRefused(ZrtError):
    """A request names something the server will not read or run (HTTP 403)."""


def check_finite(value: Any, where: str = "request") -> None:
    """NaN and ±Infinity are not JSON numbers: a body holding one is refused
    (:class:`ZrtError`), a result holding one is an :class:`InternalError` naming it."""
    stack = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            if where == "result":
                raise InternalError(f"{at} is {item}: not a number zrt can stand behind")
            raise ZrtError(f"{at}: {item} is not a finite number", "send finite numbers")
        if isinstance(item, Mapping):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))


def check_no_remote_code(config: Any, where: str) -> None:
    """A config that asks for code shipped with the checkpoint is refused outright (the CLI
    drops ``auto_map``; a server refuses it, so nobody believes it ran)."""
    if isinstance(config, Mapping) and "auto_map" in config:
        raise RequestRefused(f"{where}: the config has auto_map (code shipped with the "
                             "checkpoint); this server never runs remote code",
                             "remove auto_map, or use a model_type transformers or a zrt "
                             "plugin provides")


def model_reference(model: Any, host: Any, model_dir: Path | None, *,
                    where: str = "model") -> Any:
    """A request's model as the worker gets it: a bundled name, or a config mapping (a file's
    config carries the name it was asked by as ``_name_or_path``).

    :param model: a bundled name or alias, a path relative to ``model_dir`` (a directory
        holding config.json, or a .json file), or a config mapping.
    :raises RequestRefused: a path outside ``model_dir`` (or any path when there is none),
        a symlink out of it, or a config with ``auto_map``.
    :raises ZrtError: nothing of that name, or an unreadable config (the CLI's message).
    """
    if isinstance(model, Mapping):
        check_no_remote_code(model, where)
        return dict(model)
    if not isinstance(model, str) or not model.strip():
        raise ZrtError(f"{where}: must be a bundled name, a path under the model directory "
                       "or a config mapping", "GET /v1/models lists the bundled names")
    name = model.strip()
    if name in host.models:
        return name
    return {**_read_in_dir(name, model_dir, where), "_name_or_path": name}


def _read_in_dir(name: str, model_dir: Path | None, where: str) -> dict[str, Any]:
    from zrt_core.capture.sources import CONFIG_FILE, read_config_file

    if model_dir is None:
        raise RequestRefused(f"{where}: {name!r} is not a bundled model, and this server reads "
                             "no model files", "send the config itself as a mapping, use a "
                             "bundled name (GET /v1/models), or start the server with "
                             "--model-dir DIR")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith(("/", "~")) or ".." in parts or "\x00" in name:
        raise RequestRefused(f"{where}: {name!r} is not a relative path inside the model "
                             "directory", "name a directory or .json file under --model-dir")
    root = model_dir.resolve()
    target = (root / name).resolve()
    if target.is_dir():
        target = (target / CONFIG_FILE).resolve()
    if not target.is_relative_to(root):
        raise RequestRefused(f"{where}: {name!r} leads outside the model directory (a "
                             "symlink out of it)", "put the config itself under --model-dir")
    if not target.is_file():
        raise ZrtError(f"{where}: {name!r} is not a bundled model and not a config under the "
                       "model directory", "GET /v1/models lists the bundled names")
    if target.stat().st_size > MAX_CONFIG_BYTES:
        raise ZrtError(f"{where}: {name!r} is over {MAX_CONFIG_BYTES >> 10} KiB: not a "
                       "config.json", "name the model's config.json")
    config = read_config_file(target)
    check_no_remote_code(config, where)
    return config
