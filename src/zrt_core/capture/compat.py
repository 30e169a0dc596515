"""How the installed transformers hands a KV cache around, whichever version it is.

transformers 5.24 renamed the cache everywhere: a model's ``forward`` takes ``cache=`` (with
``past_key_values=`` deprecated until 5.40), decoder layers pass ``cache=`` to their attention
module, and outputs carry ``.cache`` (``.past_key_values`` is a warning alias). 5.23 and
earlier used ``past_key_values`` throughout, and BLOOM/Falcon attention took ``layer_past``.
A patched attention ``forward`` that reads only one of those names sees no cache on the other
versions and decodes without one, silently. These helpers read and pass the cache by every name
a supported version uses; every patch that touches attention keyword arguments goes through
them.
"""

from __future__ import annotations

import inspect
from collections.abc import MutableMapping
from typing import Any

#: Keyword names under which transformers versions pass a KV cache to attention modules,
#: newest first: 5.24+ ``cache``; 5.0-5.23 ``past_key_values``; BLOOM/Falcon ``layer_past``.
CACHE_KWARGS = ("cache", "past_key_values", "layer_past")


def take_cache(kwargs: MutableMapping[str, Any], *given: Any) -> Any:
    """The KV cache a patched ``forward`` was handed, removed from ``kwargs``.

    ``given`` are caches the patch's signature already bound by name (``past_key_values=``,
    ``layer_past=``); the first that is not None wins, then the names in :data:`CACHE_KWARGS`.
    Every such name is popped, so ``kwargs`` can be passed on to an attention function that
    does not take them. Two different caches is a programming error in the caller.
    """
    found = [c for c in given if c is not None]
    for name in CACHE_KWARGS:
        value = kwargs.pop(name, None)
        if value is not None:
            found.append(value)
    distinct = {id(c): c for c in found}
    if len(distinct) > 1:
        raise TypeError(f"two different KV caches passed ({', '.join(CACHE_KWARGS)}); "
                        "a model or patch passes the cache under two names")
    return found[0] if found else None


def output_cache(output: Any) -> Any:
    """The cache a model's output carries: ``.cache`` (5.24+) or ``.past_key_values``."""
    if hasattr(output, "keys"):  # a ModelOutput: an ordered mapping of its non-None fields
        fields = output.keys()
        for name in ("cache", "past_key_values"):
            if name in fields:
                return output[name]
        return None
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model.forward`` takes a cache on the installed version."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"
