"""Where a model's ``config.json`` comes from: a path, a bundled name or the local HF cache.

:func:`resolve_model` turns what a user typed into a :class:`ResolvedModel` without any
network access: an existing path (a directory holding ``config.json`` or a ``.json``
file), then a bundled name or alias (``host.models``), then a HuggingFace id whose config
is already in the local HF cache. Anything else is a :class:`ModelError` that says how to
get the config. Remote code is never executed: ``auto_map`` is dropped from the config,
and a ``model_type`` that transformers does not have built in is refused.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import field, frozen

from zrt_core.errors import ModelError

if TYPE_CHECKING:
    from zrt_core.capture.model_types import ModelType
    from zrt_core.modelinfo import ModelDims
    from zrt_core.models import BundledModel
    from zrt_core.plugins import PluginHost

CONFIG_FILE = "config.json"
# Keys that ask transformers to import code shipped with the checkpoint.
_REMOTE_CODE_KEYS = ("auto_map",)


@frozen
class ResolvedModel:
    """A model config found offline, and where it came from.

    :param name: a display name (bundled key, HF id, or the directory / file name).
    :param config: the ``config.json`` mapping, ``auto_map`` removed.
    :param source: where it came from, for people (``"bundled: llama3-8b"``,
        ``"HF cache: /root/.cache/.../config.json"``, ``"file: ./cfg/config.json"``).
    :param path: the config file read, or None for bundled configs and mappings.
    :param bundled: the bundled entry when the name was a bundled key or alias.
    :param notes: things the user should know (``auto_map`` ignored, ...).
    """

    name: str
    config: dict[str, Any]
    source: str
    path: Path | None = None
    bundled: BundledModel | None = None
    notes: tuple[str, ...] = field(default=(), converter=tuple)

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


def resolve_model(
    spec: str | os.PathLike[str] | Mapping[str, Any],
    host: PluginHost | None = None,
    *,
    check_model_type: bool = True,
) -> ResolvedModel:
    """Find a model's config offline.

    Order: an existing path → a bundled name or alias → a HuggingFace id in the local HF
    cache. Never touches the network.

    :param spec: a path, a bundled name, ``org/name``, or a config mapping itself.
    :param host: the plugin host whose ``models`` registry holds bundled names; a new one
        is built when None (only when the spec is not a path).
    :param check_model_type: check that transformers has ``model_type`` built in (imports
        transformers, which imports torch: about two seconds). Without the check an unknown
        type surfaces when the model is built.
    :raises ModelError: nothing found (with how to get it), malformed JSON (file, line,
        column), no ``model_type``, or a type that would need remote code.
    """
    if isinstance(spec, Mapping):
        resolved = _from_mapping(dict(spec), name=str(spec.get("_name_or_path") or "config"),
                                 source="mapping", path=None)
    elif isinstance(spec, os.PathLike):
        resolved = _from_path(Path(os.fspath(spec)).expanduser())
    elif not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"model must be a name, a path or a config mapping, got {spec!r}",
                         "run `zrt models` for the bundled names")
    elif _looks_like_path(spec) or Path(spec).expanduser().exists():
        resolved = _from_path(Path(spec).expanduser())
    else:
        resolved = _from_name(spec.strip(), host)
    if check_model_type:
        check_builtin_model_type(resolved.config, where=_where(resolved), host=host)
    return resolved


# -- paths ------------------------------------------------------------------------------


def _looks_like_path(spec: object) -> bool:
    """A string the user clearly meant as a path (so a missing file is reported as such)."""
    if not isinstance(spec, str):
        return False
    return (spec.endswith(".json") or spec.startswith(("/", "./", "../", "~"))
            or (os.sep == "\\" and "\\" in spec))


def _from_path(path: Path) -> ResolvedModel:
    if path.is_dir():
        file = path / CONFIG_FILE
        if not file.is_file():
            raise ModelError(f"{path}: directory has no {CONFIG_FILE}",
                             "pass the directory that holds the model's config.json, "
                             "or the .json file itself")
    elif path.is_file():
        file = path
    else:
        raise ModelError(f"{path}: no such file or directory",
                         "pass a directory holding config.json, a .json file, a bundled "
                         "name (`zrt models`) or a HuggingFace id in the local cache")
    config = read_config_file(file)
    name = _name_for_file(file)
    return _from_mapping(config, name=name, source=f"file: {file}", path=file)


def _name_for_file(file: Path) -> str:
    """``org/name`` for a file inside an HF cache snapshot; else the directory or file name."""
    parts = file.resolve().parts
    for i, part in enumerate(parts):
        if part.startswith("models--") and i + 1 < len(parts) and parts[i + 1] == "snapshots":
            return part.removeprefix("models--").replace("--", "/")
    if file.name == CONFIG_FILE:
        return file.resolve().parent.name or file.stem
    return file.stem


def read_config_file(file: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a config.json; any problem is a one-line :class:`ModelError` naming the file."""
    file = Path(file)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{file}: not UTF-8 text (byte {exc.start})",
                         "pass the model's config.json") from None
    except OSError as exc:
        raise ModelError(f"{file}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(
            f"{file}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})",
            "fix the file, or download it again",
        ) from None
    except (ValueError, RecursionError) as exc:  # 4,300+ digit integers, nesting past the stack
        raise ModelError(f"{file}: not a config.json ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:100]})",
                         "pass the model's config.json") from None
    if not isinstance(data, dict):
        raise ModelError(f"{file}: expected a JSON object, got {type(data).__name__}",
                         "pass the model's config.json")
    return data


# -- names ------------------------------------------------------------------------------


def _from_name(name: str, host: PluginHost | None) -> ResolvedModel:
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    if name in host.models:
        bundled = host.models.get(name)
        return _from_mapping(bundled.config_dict(), name=bundled.key,
                             source=f"bundled: {bundled.key} "
                                    f"({host.models.distribution_of(bundled.key)})",
                             path=None, bundled=bundled)
    cached = find_in_hf_cache(name)
    if cached is not None:
        config = read_config_file(cached)
        return _from_mapping(config, name=name, source=f"HF cache: {cached}", path=cached)
    raise ModelError(f"model {name!r} not found: not a path, not a bundled name, and not in "
                     f"the local HuggingFace cache ({hf_cache_dir()})", _not_found_hint(name, host))


def _not_found_hint(name: str, host: PluginHost) -> str:
    names: list[str] = []
    for m in host.models:
        names.extend((m.key, *m.aliases))
    close = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.5)
    hint = ("zrt never downloads at run time: fetch the config with "
            f"`huggingface-cli download {name if '/' in name else 'ORG/NAME'} config.json`, "
            "or pass a path to a directory or config.json")
    if close:
        hint += f"; closest bundled names: {', '.join(close)}"
    else:
        hint += "; `zrt models` lists the bundled names"
    return hint


def hf_cache_dir() -> Path:
    """The HuggingFace hub cache, by the same environment variables huggingface_hub reads."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def find_in_hf_cache(repo_id: str, cache_dir: str | os.PathLike[str] | None = None
                     ) -> Path | None:
    """The cached ``config.json`` of ``repo_id``, or None; reads the cache layout only.

    Layout: ``<cache>/models--ORG--NAME/snapshots/<commit>/config.json`` with
    ``refs/main`` holding the commit last downloaded. That snapshot wins; otherwise the
    most recently modified snapshot that has a config.
    """
    if not repo_id or repo_id.startswith("/") or ".." in repo_id.split("/"):
        return None
    root = Path(cache_dir) if cache_dir is not None else hf_cache_dir()
    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        candidate = snapshots / commit / CONFIG_FILE
        if commit and candidate.is_file():
            return candidate
    found = [p / CONFIG_FILE for p in snapshots.iterdir() if (p / CONFIG_FILE).is_file()]
    if not found:
        return None
    return max(found, key=lambda p: p.stat().st_mtime)


# -- validation -------------------------------------------------------------------------


def _from_mapping(config: dict[str, Any], *, name: str, source: str, path: Path | None,
                  bundled: BundledModel | None = None) -> ResolvedModel:
    where = str(path) if path is not None else name
    model_type = config.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise ModelError(
            f"{where}: config has no model_type" if not model_type
            else f"{where}: model_type must be a string, got {model_type!r}",
            'add "model_type" (the architecture family, e.g. "llama") to the config',
        )
    notes = []
    for key in _REMOTE_CODE_KEYS:
        if key in config:
            config = {k: v for k, v in config.items() if k != key}
            notes.append(f"{key} ignored: zrt never runs code shipped with a checkpoint and "
                         f"uses transformers' built-in {model_type!r}")
    return ResolvedModel(name=name, config=config, source=source, path=path, bundled=bundled,
                         notes=notes)


def _where(resolved: ResolvedModel) -> str:
    return str(resolved.path) if resolved.path is not None else resolved.name


def builtin_model_types() -> frozenset[str]:
    """Every ``model_type`` the installed transformers builds without remote code."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return frozenset(CONFIG_MAPPING_NAMES)


def plugin_model_type(config: Mapping[str, Any], host: PluginHost | None = None
                      ) -> ModelType | None:
    """The plugin :class:`ModelType` that builds ``config``'s ``model_type``, or None when
    transformers has it built in (built-in types win) or no installed plugin provides it."""
    model_type = str(config.get("model_type"))
    if model_type in builtin_model_types():
        return None
    if host is None:
        from zrt_core.plugins import get_plugin_manager

        host = get_plugin_manager()
    return host.model_types.get(model_type) if model_type in host.model_types else None


def check_builtin_model_type(config: Mapping[str, Any], *, where: str = "config",
                             host: PluginHost | None = None) -> None:
    """Refuse a ``model_type`` that neither transformers nor an installed plugin builds.

    :raises ModelError: naming the type, the closest known types, that a zrt plugin can
        supply it (``zrt_model_types``), and, when the config carried ``auto_map``, that zrt
        does not execute remote code.
    """
    import transformers

    model_type = str(config.get("model_type"))
    known = builtin_model_types()
    if model_type in known or plugin_model_type(config, host) is not None:
        return
    close = difflib.get_close_matches(model_type, sorted(known), n=3, cutoff=0.6)
    similar = f"similar built-in types: {', '.join(close)}; " if close else ""
    raise ModelError(
        f"{where}: unknown model_type {model_type!r} (transformers "
        f"{transformers.__version__} has no built-in implementation, no installed zrt plugin "
        "provides it, and zrt never executes remote code from a checkpoint's auto_map)",
        f"install a zrt plugin that supplies {model_type!r} (hook zrt_model_types; `zrt "
        f"plugins` lists what is installed), {similar}or use a config whose model_type "
        "transformers knows",
    )


def transformers_config(config: Mapping[str, Any], *, where: str = "config",
                        host: PluginHost | None = None) -> Any:
    """Build the transformers ``PretrainedConfig`` for a config mapping, without remote code
    (a plugin's config class for a type it supplies, :func:`plugin_model_type`).

    :raises ModelError: unknown ``model_type`` or a field transformers rejects, one line.
    """
    from huggingface_hub import errors as hub_errors
    from transformers import AutoConfig

    check_builtin_model_type(config, where=where, host=host)
    plugin_type = plugin_model_type(config, host)
    fields = {k: v for k, v in config.items()
              if k not in ("model_type", *_REMOTE_CODE_KEYS)}
    # transformers 5 validates fields through huggingface_hub's strict dataclasses.
    strict_error = getattr(hub_errors, "StrictDataclassError", ValueError)
    try:
        if plugin_type is not None:
            return plugin_type.config_class()(**fields)
        return AutoConfig.for_model(str(config["model_type"]), **fields)
    except (ValueError, TypeError, KeyError, AttributeError, strict_error) as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:2]) if first else type(exc).__name__
        raise ModelError(f"{where}: transformers rejects the config ({detail})",
                         "fix the field in config.json") from None


def raw_config(model: Any, host: Any, *, captured: Any = None
               ) -> tuple[Mapping[str, Any], str]:
    """The config mapping of what a user passed as a model (bundled name, path, mapping,
    HF-cache id or ``PretrainedConfig``) and where it came from, without importing torch;
    a capture's own config when ``captured`` is given."""
    if captured is not None:
        return captured.config, str(getattr(captured, "model", None) or captured.name)

    if hasattr(model, "to_dict") and hasattr(model, "model_type"):
        return dict(model.to_dict()), str(getattr(model, "name_or_path", "") or "config")
    resolved = resolve_model(model, host, check_model_type=False)
    where = str(resolved.path) if resolved.path is not None else resolved.name
    return dict(resolved.config), where


def check_capture_request(model: Any, phases: Any, seq_len: int, host: Any) -> ModelDims:
    """A capture's config numbers and its sequence against the config's positions, before
    transformers is imported or a model is built (``zrt capture`` and :func:`zrt_core.
    capture` call it; decode needs one position more than the cache)."""
    from zrt_core.checks import check_config, check_tokens

    config, where = raw_config(model, host)
    dims = check_config(config, where=where)
    decode = "decode" in phases
    check_tokens(config, seq_len + (1 if decode else 0),
                 f"a sequence of {seq_len}{' + 1 decoded' if decode else ''}", where=where)
    return dims
