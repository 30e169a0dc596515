"""Model families transformers does not build, served by plugins (``zrt_model_types``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import field, frozen, validators


@frozen
class ModelType:
    """A ``model_type`` a plugin builds: its config class and causal-LM class.

    Both are given as callables so that importing the plugin does not import torch or
    transformers; the capture front-end calls them only for a config of this type, builds
    the config with ``config_class()(**fields)`` and the model with
    ``model_class()._from_config(config)``, as transformers' Auto classes would for a
    built-in type. Nothing is registered with transformers.

    :param name: the config's ``model_type`` (``"grok-1"``).
    :param config_class: ``() -> type[PreTrainedConfig]``.
    :param model_class: ``() -> type[PreTrainedModel]`` (a causal LM with ``.model.layers``).
    :param description: one line for ``zrt plugins``.
    """

    name: str = field(validator=validators.min_len(1))
    config_class: Callable[[], Any]
    model_class: Callable[[], Any]
    description: str = ""
