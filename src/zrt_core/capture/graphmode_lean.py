"""Graph mode's lean tracing: Python that Dynamo need not trace op by op while it compiles a
phase, and Dynamo features a recording backend does not use (docs/graph-mode.md, Speed).

Dynamo symbolically executes every bytecode of the model's Python, its helpers included,
so what costs nothing in eager mode costs milliseconds per call here. Each change below
keeps the traced graph the same (same ops, shapes, module stacks: every recorded node was
compared before and after, docs/graph-mode.md) and is undone when the capture ends:

- **Config attribute reads.** transformers' ``PreTrainedConfig.__getattribute__`` (the
  ``attribute_map`` aliases) and the heterogeneity mixin's override of it are Python
  functions, inlined by Dynamo on every ``config.x`` read (thousands per phase on
  DeepSeek-V3). A homogeneous config's class is swapped for a subclass that reads
  attributes the plain way and resolves each alias through a property: same values. Its
  ``per_layer_config`` (the cache builds one layer per entry) is a tuple of the config
  itself, which is what transformers' view returns for each layer of such a config.
- **``layers[: config.num_hidden_layers]``.** ``ModuleList.__getitem__`` with a slice
  builds a new ``ModuleList`` (``add_module`` per layer, traced). A slice that covers the
  whole list returns the list itself: the same modules in the same order.
- **The MoE routing histogram and its offsets** (:mod:`zrt_core.capture.moe`): pure
  functions of the token count, ``top_k``, the expert count and the imbalance, looping over
  every expert (256 on DeepSeek-V3). Marked ``torch.compiler.assume_constant_result``,
  Dynamo calls them once with those constants instead of tracing the loops; the tuple they
  return is what the traced loop would have produced.
- **Prefill's empty KV cache.** A decoder whose ``forward`` builds its cache as
  ``DynamicCache(config=self.config)`` when handed none makes Dynamo build that object
  (one cache layer per decoder layer, 61 on DeepSeek-V3) bytecode by bytecode and
  reconstruct it after the graph. Graph mode builds the same empty cache before the call
  and hands it in (:func:`prefill_cache`); the model fills it as it would its own. Only
  caches of full-attention layers, whose construction runs no tensor op: a sliding-window
  layer creates tensors when built (recorded in the traced prefill), and other cache
  classes (hybrid, Mamba caches a family builds itself) are left to the model.
- **Dynamo's garbage collection after each compile** (``run_gc_after_compile``): a
  ``gc.collect(1)`` per phase that frees nothing the capture needs freed.
- **Dynamo's guards** (:data:`SKIP_GUARDS`): after tracing a frame, Dynamo turns every
  assumption it made (thousands here: each module attribute, config value, tensor's shape
  and stride) into a guard tree and checking code, so that a later call can reuse the
  compiled code (about a tenth of a warm capture). Here nothing compiled is ever reused:
  each phase is compiled once and runs once, and Dynamo is reset before each phase is
  compiled. So the backend empties the frame's guard set once its graphs are compiled
  (:func:`drop_guards`); the graphs are built before guards and do not depend on them.
- **Side-effect messages** (``side_effect_replay_policy="silent"``): Dynamo records the
  user stack of every mutation it will replay after the graph (the KV cache, the layer
  templates' hook state...) and formats a log message per mutated object, for
  ``TORCH_LOGS=side_effects``. Silent still replays them; it only keeps no stacks.
- **AOTAutograd's custom-op aliasing check** (``check_custom_op_aliasing``): the first run
  of every compiled graph goes through a Python dispatch mode that checks whether custom
  ops alias their inputs (a warning for kernel authors). Each graph here runs once, so
  every run paid it; the check records nothing and changes no output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: build no Dynamo guards (each phase compiled on a freshly reset Dynamo, see above)
SKIP_GUARDS = True
#: Dynamo settings while a phase compiles (``torch._dynamo.config``)
DYNAMO_CONFIG: dict[str, Any] = {"run_gc_after_compile": False,
                                  "side_effect_replay_policy": "silent"}
#: AOTAutograd settings while graphs compile and run (``torch._functorch.config``)
FUNCTORCH_CONFIG: dict[str, Any] = {"check_custom_op_aliasing": False}

_FAST_CLASSES: dict[Any, type] = {}


def _fast_config_class(cls: type, aliases: dict[str, str]) -> type:
    """``cls`` with plain attribute reads; each ``attribute_map`` alias a property."""
    key = (cls, tuple(sorted(aliases.items())))
    cached = _FAST_CLASSES.get(key)
    if cached is not None:
        return cached

    def alias(target: str) -> property:
        return property(lambda self: getattr(self, target))

    namespace: dict[str, Any] = {"__getattribute__": object.__getattribute__,
                                 "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "per_layer_config": property(lambda self: self._zrt_layers)}
    namespace.update({name: alias(target) for name, target in aliases.items()})
    fast = type(cls.__name__, (cls,), namespace)
    _FAST_CLASSES[key] = fast
    return fast


def drop_guards() -> None:
    """Empty the guard set of the frame Dynamo is compiling (called by the backend, after
    AOTAutograd compiled its graphs, before Dynamo builds guards from the set)."""
    import torch

    context = torch._guards.TracingContext.try_get()
    if context is not None:
        context.guards_context.dynamo_guards.clear()


class _LayerConfigs(tuple):  # type: ignore[type-arg]
    """A homogeneous config's ``per_layer_config``: the config itself once per layer, as
    transformers' view returns it for every integer index, as a tuple Dynamo iterates
    natively (the view is a ``Sequence`` iterated through ``__getitem__`` until
    ``IndexError``); a layer-type name is answered by the view itself."""

    def __new__(cls, config: Any) -> _LayerConfigs:
        out = super().__new__(cls, (config,) * int(config.num_hidden_layers))
        out._config = config
        return out

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            from transformers.integrations.heterogeneity.configuration_utils import (
                _PerLayerConfigView,
            )

            return _PerLayerConfigView(self._config)[key]
        return super().__getitem__(key)


def _whole_slice(cls: type) -> type:
    """``cls`` (a ``ModuleList``) whose slice covering every item is the list itself."""
    cached = _FAST_CLASSES.get(cls)
    if cached is not None:
        return cached

    def __getitem__(self: Any, idx: Any) -> Any:
        if isinstance(idx, slice) and idx.step is None and not idx.start \
                and (idx.stop is None or idx.stop >= len(self)):
            return self
        return cls.__getitem__(self, idx)

    fast = type(cls.__name__, (cls,), {"__getitem__": __getitem__,
                                       "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})
    _FAST_CLASSES[cls] = fast
    return fast


#: how a decoder's ``forward`` builds its cache when handed none (transformers 5.x)
_DYNAMIC_CACHE_BUILD = "DynamicCache(config=self.config)"


def prefill_cache(model: Any) -> Any:
    """The empty cache the model's decoder would build for prefill, built outside Dynamo;
    None when its ``forward`` builds anything else (or nothing) that way."""
    import inspect
    import re

    decoder = getattr(model, "base_model", None)
    if decoder is None or decoder is model:
        decoder = getattr(model, "model", None)
    forward = getattr(type(decoder), "forward", None) if decoder is not None else None
    try:
        source = inspect.getsource(forward) if forward is not None else ""
    except (OSError, TypeError):
        return None
    builds = re.findall(r"\b\w*Cache\(", source)
    if _DYNAMIC_CACHE_BUILD not in source or set(builds) != {"DynamicCache("}:
        return None
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=decoder.config)
    # full-attention layers only: a sliding-window layer creates tensors when built, which
    # the traced model records (lift_fresh_copy) and a cache built here would not
    if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", ())):
        return None
    return cache


def _configs(model: Any) -> list[Any]:
    """The distinct transformers configs the model's modules hold."""
    from transformers import PreTrainedConfig

    found: dict[int, Any] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, PreTrainedConfig):
                found.setdefault(id(value), value)
    return list(found.values())


@contextlib.contextmanager
def lean_tracing(model: Any) -> Iterator[None]:
    """Swap the classes above in for the duration of a graph-mode capture."""
    import torch
    import torch._functorch.config
    import torch.nn as nn

    from zrt_core.capture import moe

    for fn in (moe.routing_histogram, moe.cumulative_rows):
        torch.compiler.assume_constant_result(fn)  # marks the function (an attribute)
    swapped: list[tuple[Any, type]] = []
    try:
        for config in _configs(model):
            if "_heterogeneity_spec" in vars(config):  # per-layer reads must stay checked
                continue
            if not isinstance(getattr(config, "num_hidden_layers", None), int):
                continue  # no layer count to build per_layer_config from: left as it is
            cls = type(config)
            aliases = dict(object.__getattribute__(config, "attribute_map") or {})
            vars(config)["_zrt_layers"] = _LayerConfigs(config)  # built here, not traced
            config.__class__ = _fast_config_class(cls, aliases)
            swapped.append((config, cls))
        for module in model.modules():
            if type(module) is nn.ModuleList:
                module.__class__ = _whole_slice(nn.ModuleList)
                swapped.append((module, nn.ModuleList))
        with torch._functorch.config.patch(**FUNCTORCH_CONFIG):
            yield
    finally:
        for obj, cls in reversed(swapped):
            obj.__class__ = cls
            vars(obj).pop("_zrt_layers", None)
