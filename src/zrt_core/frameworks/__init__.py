"""The training and serving frameworks' own configs: read a layout from them (``zrt run
--from``) and write a chosen layout back (``--emit``). One module per framework, each a
``read`` (text → :class:`Imported`) and a ``write`` (:class:`RunRequest` → text)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zrt_core.errors import SpecError, UnknownNameError
from zrt_core.frameworks import bridge, deepspeed, megatron, torchtitan, trtllm, vllm
from zrt_core.frameworks.base import (
    Header,
    Imported,
    RunRequest,
    request_from_values,
)

#: name → (module, what it reads, its workload, file formats it takes)
FRAMEWORKS: dict[str, tuple[Any, str, str, tuple[str, ...]]] = {
    "megatron": (megatron, "Megatron-LM arguments (a torchrun/pretrain_gpt.py command line "
                 "or a file of them)", "train", ("args",)),
    "bridge": (bridge, "a Megatron-Bridge scripts/performance launch (flags and key=value "
               "overrides)", "train", ("args",)),
    "torchtitan": (torchtitan, "a torchtitan job config .toml", "train", (".toml",)),
    "deepspeed": (deepspeed, "a DeepSpeed ds_config .json", "train", (".json",)),
    "trtllm": (trtllm, "a TensorRT-LLM extra_llm_api_options .yaml", "infer",
               (".yaml", ".yml")),
    "vllm": (vllm, "a vllm serve command line", "infer", ("args",)),
}

__all__ = ["FRAMEWORKS", "Header", "Imported", "RunRequest", "emit", "framework_of", "read",
           "read_text", "request_from_values"]

#: suffixes that are some framework's config file, never a command line
CONFIG_SUFFIXES = (".toml", ".json", ".yaml", ".yml")


def framework_of(name: str) -> Any:
    """The module of a framework, or one line naming the choices."""
    entry = FRAMEWORKS.get(str(name).lower())
    if entry is None:
        raise UnknownNameError(f"unknown framework {name!r}",
                               f"use one of {', '.join(FRAMEWORKS)}")
    return entry[0]


def read(framework: str, source: str, context: Mapping[str, Any] | None = None) -> Imported:
    """Read ``source`` (a file path, or for the command-line frameworks the command line
    itself) as ``framework``'s config.

    :param context: what the reader may need from zrt's other inputs: ``layers`` (the
        model's decoder layers), ``dims`` (its :class:`~zrt_core.modelinfo.ModelDims`, which
        the size arguments are checked against), ``num_gpus``, ``hardware``.
    :raises SpecError: a wrong file format, a value of the wrong type, a contradiction.
    """
    framework_of(framework)
    kinds = FRAMEWORKS[framework.lower()][3]
    path = Path(source)
    try:
        is_file = "\n" not in source and path.is_file()
    except OSError:  # a command line too long to be a file name
        is_file = False
    where = f"--from {framework} {path.name if is_file else '(command line)'}"
    if is_file:
        suffix = path.suffix.lower()
        if kinds == ("args",) and suffix in CONFIG_SUFFIXES:
            raise SpecError(f"{where}: a {suffix} file is not {FRAMEWORKS[framework.lower()][1]}",
                            "give the command line, or a text file of its arguments")
        if kinds != ("args",) and suffix not in kinds:
            raise SpecError(f"{where}: {FRAMEWORKS[framework.lower()][1]} is expected, got a "
                            f"{suffix or 'suffix-less'} file", f"give a {kinds[0]} file")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"{where}: cannot read it ({exc})", "give a text file") from None
    elif kinds != ("args",):
        raise SpecError(f"--from {framework}: no such file {source!r}",
                        f"give the path of {FRAMEWORKS[framework.lower()][1]}")
    else:
        text = source
    return read_text(framework, text, context, where=where)


def read_text(framework: str, text: str, context: Mapping[str, Any] | None = None, *,
              where: str | None = None) -> Imported:
    """Read ``text`` (the file's content, or the command line) as ``framework``'s config;
    ``where`` names it in messages."""
    module = framework_of(framework)
    where = where or f"--from {framework}"
    if FRAMEWORKS[framework.lower()][3] == ("args",) and \
            not any(w.startswith("-") for w in text.split()):
        raise SpecError(f"{where}: no {framework} arguments found",
                        f"give {FRAMEWORKS[framework.lower()][1]}")
    return module.read(text, where, dict(context or {}))


def emit(framework: str, request: RunRequest, header: Header) -> str:
    """``request`` (the layout and workload ``zrt run`` or ``zrt search`` estimated) as
    ``framework``'s arguments or config file, under a header naming zrt's version, the model,
    the hardware and the predicted figures.

    :raises SpecError: the framework has no way to say part of the layout (one line naming
        it).
    """
    return framework_of(framework).write(request, header)
